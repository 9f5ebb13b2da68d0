"""Rollout engines, whatever the engine: the driver protocol, which replica a worker drives,
bringing an engine's traces home, and :class:`RolloutProfiler` for one rollout worker.

An engine plugs in with an :class:`EngineDriver` (start and stop its profiler) whose ``traces``
is the engine's :class:`~instrument.ranks.TraceNames` (how it names its trace files: the
manifest's tool, how to tell a frontend trace, how to read the rank); the rest of what differs
between engines is its :class:`~instrument.rollout.EngineProfile`. Nothing here names an engine,
reads the run or writes a manifest of its own: each relocated file goes to the ``publish``
function the caller gives. Imports neither an engine nor torch.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from instrument import naming, ranks
from instrument._files import move_into, wait_until_stable
from instrument.config import ProfilerConfig
from instrument.manifest import Manifest, TraceRecord
from instrument.recorders import Publish, Report

__all__ = [
    "EngineDriver",
    "EngineProfilerError",
    "EngineStillFlushingError",
    "LaunchArgs",
    "NotProfilingError",
    "RelocationResult",
    "RolloutProfiler",
    "engine_ranks_to_keep",
    "engine_to_drive",
    "relocate_engine_traces",
    "replica_profiler_dir",
    "verl_declines",
]

logger = logging.getLogger(__name__)


class EngineProfilerError(RuntimeError):
    """An engine profiler call failed; the message says what to do about it."""


class EngineStillFlushingError(EngineProfilerError, TimeoutError):
    """A stop ran past its deadline while the server still answers: it is still writing its traces."""


class NotProfilingError(EngineProfilerError):
    """The engine refused a stop because it was not profiling: nothing was flushed (not a failure)."""


@dataclass(frozen=True)
class LaunchArgs:
    """What to add to an engine's launch: command-line arguments and environment variables.

    The environment is returned, never written into ``os.environ``.
    """

    args: tuple[str, ...]
    env: Mapping[str, str]
    dropped: tuple[str, ...] = ()

    @property
    def profiler_config(self) -> dict[str, Any] | None:
        """The ``--profiler-config`` JSON as a dict, if the arguments carry one."""
        if "--profiler-config" not in self.args:
            return None
        return json.loads(self.args[self.args.index("--profiler-config") + 1])  # type: ignore[no-any-return]


@runtime_checkable
class EngineDriver(Protocol):
    """Starts and stops one engine's profiler; :class:`RolloutProfiler` drives any such driver.

    ``start`` and ``stop`` raise on failure (the profiler counts it); ``stop`` returns once the
    engine has flushed its traces, with the seconds it took.
    """

    @property
    def traces(self) -> ranks.TraceNames:
        """How this engine names its trace files."""
        ...

    def start(self, prefix: str | None = None) -> None:
        """Start profiling; ``prefix`` (``step{S}``) goes into the file names where the engine takes one."""
        ...

    def stop(self) -> float:
        """Stop profiling once the traces are flushed; the seconds it took."""
        ...


# --------------------------------------------------------------------------- which replica


def replica_profiler_dir(base: str | os.PathLike[str], replica: int) -> str:
    """Each replica's own profiler directory: data-parallel engines sharing one directory collide."""
    if isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
        raise ValueError(f"'replica' must be an int >= 0: {replica!r}")
    return os.path.join(os.path.abspath(base), f"replica{replica}")


def verl_declines(config: ProfilerConfig) -> str | None:
    """Why verl 0.9.1's rollout server would not drive its engine under ``config``, or ``None``.

    Only in verl's dialect (``config.dialect``): verl profiles an engine with the torch tool alone and
    only in discrete mode (``_should_profile``); instrument's own keys drive it in either mode, any tool.
    """
    if config.dialect != "verl":
        return None
    if "torch" not in config.tool.split("+"):
        return f"verl profiles rollout engines with the torch tool only, not {config.tool!r}"
    if not config.discrete:
        return "verl drives rollout engines in discrete mode only (discrete is false)"
    return None


def engine_to_drive(global_rank: int, *, gpus_per_replica: int, world_size: int, config: ProfilerConfig) -> int | None:
    """The replica this rank drives, or ``None``: only a replica's local rank 0 drives it, only
    replicas holding a profiled rank are driven, and in verl's dialect only as verl does
    (:func:`verl_declines`)."""
    if not config.active or verl_declines(config) is not None:
        return None
    replica = ranks.replica_of(global_rank, gpus_per_replica)
    if ranks.local_rank_of(global_rank, gpus_per_replica) != 0:
        return None
    driven = ranks.replicas_to_drive(config.ranks, config.all_ranks, world_size, gpus_per_replica)
    return replica if replica in driven else None


def engine_ranks_to_keep(
    config: ProfilerConfig, replica: int, *, world_size: int, gpus_per_replica: int
) -> frozenset[int]:
    """The global ranks of ``replica`` whose engine traces relocation keeps (all with ``keep_engine_peers``)."""
    return ranks.ranks_to_keep(
        replica, config.ranks, config.all_ranks, world_size, gpus_per_replica, peers=config.keep_engine_peers
    )


# --------------------------------------------------------------------------- relocation


@dataclass
class RelocationResult:
    """What :func:`relocate_engine_traces` did with each file of the profiler directory."""

    moved: list[TraceRecord] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # TP peers, left where they were
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # another step's or an earlier session's, left in place
    settled: bool = True  # False: the files were still changing at the deadline (moved anyway)


def _warn(what: str, exc: BaseException) -> None:
    logger.warning("instrument: %s: %s", what, exc)


MTIME_SLACK_NS = 2_000_000_000
"""File times come from a coarse clock (a kernel tick) or another machine's (NFS): a file written just
after ``since_ns`` may carry a time a little before it. Earlier sessions' files are older than this."""


def _candidates(
    source: Path, step: int, since_ns: int | None, traces: ranks.TraceNames, result: RelocationResult
) -> list[Path]:
    """The regular files of ``source`` (never a link, never hidden) written for ``step``.

    A name prefixed ``step{N}`` (joined as the engine joins it) with another N belongs to that step,
    and a file last modified before ``since_ns`` to an earlier session: both stay where they are
    (``result.skipped``).
    """
    found = []
    for path in source.iterdir():
        try:
            st = path.lstat()
        except OSError:
            continue  # vanished since the listing
        if not stat.S_ISREG(st.st_mode) or path.name.startswith("."):
            continue
        labelled = traces.step(path.name)
        stale = since_ns is not None and st.st_mtime_ns < since_ns - MTIME_SLACK_NS
        if (labelled is not None and labelled != step) or stale:
            result.skipped.append(str(path))
            continue
        found.append(path)
    result.skipped.sort()
    return sorted(found)


def relocate_engine_traces(
    source_dir: str | os.PathLike[str],
    *,
    save_path: str | os.PathLike[str],
    step: int,
    replica: int,
    gpus_per_replica: int,
    world_size: int,
    keep_ranks: Collection[int],
    traces: ranks.TraceNames,
    role: str = "rollout",
    ranks_per_dp_rank: int | None = None,
    manifest: Manifest | None = None,
    since_ns: int | None = None,
    quiet_s: float = 0.5,
    timeout_s: float = 120.0,
    publish: Publish | None = None,
    report: Report | None = None,
) -> RelocationResult:
    """Move the traces of ``replica`` from ``source_dir`` into ``save_path``, keeping only ``keep_ranks``.

    ``traces`` says how the engine names its files (``driver.traces``, ``EngineProfile.traces``).
    Waits until the files stop changing; a file whose rank cannot be read is kept (labelled
    ``rank-unknown``); frontend traces are labelled ``frontend``; TP peers are left in place. Moves
    never overwrite (cross-filesystem: temp copy, fsync, rename). Only this step's files move: a
    name prefixed ``step{N}`` for another step is never relabelled, and ``since_ns`` (the start of this
    profiling session, ``time.time_ns()``) skips files last modified before it (less
    :data:`MTIME_SLACK_NS`: file clocks are coarse); both are left in
    place (``result.skipped``). Links and other non-regular files are never touched.

    Each moved file's record goes to ``publish`` (``manifest`` is short for ``publish=manifest.append``;
    neither: no manifest line).
    Problems (files still changing, a failed move, a failed ``publish``) go to ``report(what, exc)``
    (default: a warning) and relocation goes on. Raises ``OSError`` only when ``source_dir``
    cannot be listed.
    """
    tell = report or _warn
    if publish is None and manifest is not None:
        publish = manifest.append
    source = Path(source_dir)
    result = RelocationResult()
    if not isinstance(traces, ranks.TraceNames):
        raise TypeError(f"'traces' must be a TraceNames: {type(traces).__name__}")
    candidates = _candidates(source, step, since_ns, traces, result)
    # A file that vanishes while we wait is a change like any other: the rest are still waited for.
    if not wait_until_stable(candidates, quiet_s=quiet_s, timeout_s=timeout_s, missing_ok=True):
        result.settled = False
        tell("engine traces still changing; moved anyway", TimeoutError(f"{source} after {timeout_s:g} s"))
    keep = frozenset(keep_ranks)
    Path(save_path).mkdir(parents=True, exist_ok=True)
    for path in candidates:
        if not ranks.keep_engine_trace(
            path.name, replica, gpus_per_replica, keep, ranks_per_dp_rank=ranks_per_dp_rank, parse=traces.local_rank
        ):
            result.dropped.append(str(path))
            continue
        rank = ranks.engine_trace_rank(
            path.name, replica, gpus_per_replica, ranks_per_dp_rank=ranks_per_dp_rank, parse=traces.local_rank
        )
        frontend = traces.is_frontend(path.name)
        prefix = naming.engine_trace_prefix(
            role=role, step=step, replica=replica, rank=rank, world_size=world_size, frontend=frontend
        )
        try:
            moved = move_into(path, save_path, prefix + path.name)
            size = moved.stat().st_size
        except (OSError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(path):
                continue  # taken away since the listing: not ours to move, nothing lost by us
            tell("could not move an engine trace into save_path", exc)
            result.failed.append(str(path))
            continue
        record = TraceRecord(
            path=moved.name,  # relative to save_path, like every manifest line
            role=role,
            stage="frontend" if frontend else "engine",
            step=step,
            rank=-1 if rank is None else rank,
            world_size=world_size,
            window=None,
            partial=False,
            bytes=size,
            tool=traces.engine,
        )
        result.moved.append(record)
        if publish is not None:
            try:
                publish(record)
            except Exception as exc:  # the file is in save_path; only its manifest line is missing
                tell("could not list an engine trace in the manifest", exc)
    return result


# --------------------------------------------------------------------------- one rollout worker


class RolloutProfiler:
    """Profile the engine of one rollout worker on the chosen steps, through any :class:`EngineDriver`.

    Never raises after construction: each kind of failure is warned about once and counted
    (:attr:`failures`), and training goes on. ``rank`` / ``world_size`` are global GPU ranks; the
    worker at a replica's local rank 0 drives it. ``profiler_base`` is the directory the engine's
    launch arguments named through :func:`replica_profiler_dir` (pass the same base here).

    What the profiler does not decide is passed in, and it reads nothing else: ``publish`` lists
    each relocated trace (``manifest=Manifest(save_path)`` is short for ``publish=manifest.append``;
    one of them is required unless ``relocate_results`` is off), and ``profiles_step(step)`` says
    whether a step is recorded (default ``config.profiles_step``; in a configured process, the
    run's answer for its open step lets triggers decide too).
    """

    def __init__(
        self,
        config: ProfilerConfig,
        driver: EngineDriver,
        *,
        rank: int,
        world_size: int,
        gpus_per_replica: int,
        profiler_base: str | os.PathLike[str],
        role: str = "rollout",
        publish: Publish | None = None,
        manifest: Manifest | None = None,
        profiles_step: Callable[[int], bool] | None = None,
    ) -> None:
        ranks.validate_ranks([rank], world_size, field="rank")
        if not isinstance(driver, EngineDriver):
            raise TypeError(f"'driver' must have traces, start() and stop(): {type(driver).__name__}")
        if publish is not None and manifest is not None:
            raise TypeError("give 'publish' or 'manifest', not both (manifest= is short for publish=manifest.append)")
        if manifest is not None:
            publish = manifest.append
        if publish is None and config.relocate_results:
            raise TypeError(
                "RolloutProfiler needs 'publish' (where each relocated trace is listed: the run's, in a configured "
                "process) or 'manifest' (manifest=instrument.manifest.Manifest(config.save_path))"
            )
        for name, value in (("publish", publish), ("profiles_step", profiles_step)):
            if value is not None and not callable(value):
                raise TypeError(f"'{name}' must be callable: {value!r}")
        self.config = config
        self.driver = driver
        self.rank = rank
        self.world_size = world_size
        self.gpus_per_replica = gpus_per_replica
        self.role = role
        self.replica = engine_to_drive(rank, gpus_per_replica=gpus_per_replica, world_size=world_size, config=config)
        declined = verl_declines(config) if config.active else None
        if declined is not None and ranks.local_rank_of(rank, gpus_per_replica) == 0:  # one line per replica
            # verl warns about the tool and says nothing about the mode; one line each way here
            log = logger.warning if "tool" in declined else logger.info
            log("instrument: rollout rank %d does not profile its engine: %s (docs/rollout.md)", rank, declined)
        self.profiler_dir = None if self.replica is None else replica_profiler_dir(profiler_base, self.replica)
        self.publish = publish
        self.profiles_step = profiles_step or config.profiles_step
        self.failures = 0  # failures absorbed so far (each kind warned about once)
        self.records: list[TraceRecord] = []
        self._warned: set[str] = set()
        self._running_step: int | None = None
        self._started_ns = 0

    def _fail(self, what: str, exc: BaseException, step: int) -> None:
        """One warning per kind of failure (``what``), a counter, and training goes on."""
        self.failures += 1
        if what in self._warned:
            logger.debug("instrument: rollout step %d: %s: %s", step, what, exc)
            return
        self._warned.add(what)
        logger.warning(
            "instrument: rollout step %d (replica %s): %s: %s: %s; training continues (again: counted, not warned)",
            step,
            self.replica,
            what,
            type(exc).__name__,
            exc,
        )

    def _profiles(self, step: int) -> bool:
        try:
            return bool(self.profiles_step(step))
        except Exception as exc:  # the caller's function: a failure like any other, and the step goes unrecorded
            self._fail("could not tell whether the step is profiled", exc, step)
            return False

    def start(self, step: int) -> bool:
        """Start the engine profiler if this worker drives a replica and ``step`` is profiled."""
        if self.replica is None or not self._profiles(step):
            return False
        self._started_ns = time.time_ns()
        try:
            self.driver.start(prefix=f"step{step}")
        except Exception as exc:
            self._fail("could not start the engine profiler", exc, step)
            return False
        self._running_step = step
        return True

    def stop(self, step: int) -> list[TraceRecord]:
        """Stop the engine profiler and move this replica's kept traces into ``save_path``."""
        if self._running_step != step or self.replica is None or self.profiler_dir is None:
            return []
        self._running_step = None
        try:
            self.driver.stop()
        except Exception as exc:
            self._fail("could not stop the engine profiler", exc, step)
            return []
        if not self.config.relocate_results:
            return []
        try:
            keep = engine_ranks_to_keep(
                self.config, self.replica, world_size=self.world_size, gpus_per_replica=self.gpus_per_replica
            )
            result = relocate_engine_traces(
                self.profiler_dir,
                save_path=self.config.save_path,
                step=step,
                replica=self.replica,
                gpus_per_replica=self.gpus_per_replica,
                world_size=self.world_size,
                keep_ranks=keep,
                role=self.role,
                since_ns=self._started_ns,
                traces=self.driver.traces,
                publish=self.publish,
                report=lambda what, exc: self._fail(what, exc, step),
            )
        except Exception as exc:
            self._fail("could not relocate engine traces", exc, step)
            return []
        self.records.extend(result.moved)
        if not result.moved:
            self._fail(
                "no engine trace after the stop (docs/rollout.md, troubleshooting)",
                FileNotFoundError(f"nothing new in {self.profiler_dir}"),
                step,
            )
        return result.moved
