"""What ``instrument rollout start`` leaves for the stop, and the stop's relocation of every replica.

``start`` and ``stop`` are separate commands, so the start leaves one marker per worker URL: the
prefix it sent and when (``time.time_ns()`` before the request), the engine's name and whether the
start asked the engine to stop by itself (SGLang's ``num_steps``). The stop reads it to tell a
stop after a start ("flushed") from a stop without one ("not profiling"), and to relocate only
what the replicas wrote since this start. Markers live in ``$XDG_STATE_HOME/instrument/rollout``
(default ``~/.local/state/...``) or ``--state-dir``; each is one small JSON file written to a
temp name, fsynced and renamed over the old one (:func:`instrument._safe_files.write_atomically`), so
a reader never sees half a marker.

Relocation walks ``BASE/replica{N}`` (the directories :func:`instrument.rollout.replica_profiler_dir`
names, as ``instrument rollout launch-args`` gives them) and moves each replica's files with
:func:`~instrument.rollout.relocate_engine_traces`: this step's only, by global rank, TP peers
left in place, atomically (across filesystems too), each listed through the caller's ``publish``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from instrument import ranks
from instrument._safe_files import write_atomically
from instrument.config import ProfilerConfig
from instrument.recorders import Publish
from instrument.rollout._profiler import engine_ranks_to_keep, relocate_engine_traces

__all__ = [
    "MarkerStore",
    "ReplicaMove",
    "StartMarker",
    "default_state_dir",
    "relocate_replicas",
    "replica_dirs",
    "summary",
]

_REPLICA_DIR = re.compile(r"^replica(\d+)$")
_UNNAMED_ENGINE = "vllm"  # markers written before a second engine existed name none: they were all vLLM's
_UNSAFE = re.compile(r"[^A-Za-z0-9.=+-]+")


@dataclass(frozen=True)
class StartMarker:
    """One worker's start: its URL, the prefix sent, ``time.time_ns()`` just before the request, the
    engine, and whether the engine stops by itself (SGLang after ``num_steps``)."""

    url: str
    prefix: str | None
    started_ns: int
    engine: str = _UNNAMED_ENGINE
    stops_by_itself: bool = False

    def clock(self) -> str:
        """The start as local wall-clock time, ``HH:MM:SS``."""
        return time.strftime("%H:%M:%S", time.localtime(self.started_ns / 1e9))


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/instrument/rollout``, else ``~/.local/state/instrument/rollout``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "instrument" / "rollout"


class MarkerStore:
    """Start markers by worker URL in one directory (created on the first write)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_state_dir()

    def path(self, url: str) -> Path:
        """The marker file of ``url``: readable host and port, and a hash so distinct URLs never share one."""
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]
        readable = _UNSAFE.sub("_", url.split("://", 1)[-1]).strip("._")[:60]
        return self.directory / f"start-{readable}-{digest}.json"

    def read(self, url: str) -> StartMarker | None:
        """The marker of ``url``, or ``None`` when there is none or it cannot be read as one."""
        try:
            data = json.loads(self.path(url).read_text(encoding="utf-8"))
            prefix, engine = data.get("prefix"), data.get("engine", _UNNAMED_ENGINE)
            marker = StartMarker(
                str(data["url"]),
                prefix if isinstance(prefix, str) else None,
                int(data["started_ns"]),
                engine if isinstance(engine, str) else _UNNAMED_ENGINE,
                data.get("stops_by_itself") is True,
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):  # Infinity: no int
            return None
        return marker if marker.url == url else None

    def write(self, marker: StartMarker) -> None:
        """Replace the marker of ``marker.url`` atomically (temp name, fsync, rename); ``OSError`` on failure."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps(
            {
                "url": marker.url,
                "prefix": marker.prefix,
                "started_ns": marker.started_ns,
                "engine": marker.engine,
                "stops_by_itself": marker.stops_by_itself,
            }
        ).encode()
        write_atomically(self.path(marker.url), data, mode=0o600)  # private to the user, as mkstemp made it

    def remove(self, url: str) -> None:
        """Forget the start of ``url`` (nothing if there was none)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(url))


# --------------------------------------------------------------------------- relocation after a stop


@dataclass
class ReplicaMove:
    """What the stop's relocation did with one replica directory."""

    replica: int
    directory: str
    moved: list[str] = field(default_factory=list)  # names in save_path
    dropped: int = 0  # TP peers and ranks not profiled, left in place
    skipped: int = 0  # another step's or an earlier session's files, left in place
    failed: list[str] = field(default_factory=list)  # what went wrong, one line each


def replica_dirs(base: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(replica, directory)`` for each ``replica{N}`` directory of ``base`` (never through a link), by N."""
    found = []
    for entry in Path(base).iterdir():
        match = _REPLICA_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.append((int(match[1]), entry))
    return sorted(found)


def relocate_replicas(
    base: str | os.PathLike[str],
    *,
    save_path: str | os.PathLike[str],
    step: int,
    config: ProfilerConfig,
    gpus_per_replica: int,
    world_size: int,
    since_ns: int | None,
    traces: ranks.TraceNames,
    publish: Publish | None,
    quiet_s: float = 0.5,
    timeout_s: float = 120.0,
) -> list[ReplicaMove]:
    """Move what every replica under ``base`` wrote for ``step`` (since ``since_ns``) into ``save_path``.

    ``traces`` is the engine's grammar; each moved file's record goes to ``publish`` (``None``: no
    manifest line). Ranks kept are the configuration's (``ranks`` / ``all_ranks``; every rank of a driven
    replica with ``keep_engine_peers``) among ``world_size`` global ranks of ``gpus_per_replica`` each; a
    replica directory past ``world_size`` is reported, not moved. Raises ``ValueError`` for bad numbers and
    ``OSError`` when ``base`` cannot be listed.
    """
    ranks.validate_ranks([0], world_size, field="world_size")
    if isinstance(gpus_per_replica, bool) or not isinstance(gpus_per_replica, int) or gpus_per_replica < 1:
        raise ValueError(f"'gpus_per_replica' must be an int >= 1: {gpus_per_replica!r}")
    if world_size % gpus_per_replica:
        raise ValueError(f"'world_size' {world_size} is not a multiple of 'gpus_per_replica' {gpus_per_replica}")
    replicas = world_size // gpus_per_replica
    moves = []
    for replica, directory in replica_dirs(base):
        move = ReplicaMove(replica, str(directory))
        moves.append(move)
        if replica >= replicas:
            move.failed.append(
                f"{directory}: replica {replica} is past the {replicas} replicas of --world-size {world_size} "
                f"(--gpus-per-replica {gpus_per_replica}); left in place"
            )
            continue
        keep = engine_ranks_to_keep(config, replica, world_size=world_size, gpus_per_replica=gpus_per_replica)
        result = relocate_engine_traces(
            directory,
            save_path=save_path,
            step=step,
            replica=replica,
            gpus_per_replica=gpus_per_replica,
            world_size=world_size,
            keep_ranks=keep,
            since_ns=since_ns,
            quiet_s=quiet_s,
            timeout_s=timeout_s,
            traces=traces,
            publish=publish,
            report=_reporter(move),
        )
        move.moved = [record.path for record in result.moved]
        move.dropped = len(result.dropped)
        move.skipped = len(result.skipped)
    return moves


def _reporter(move: ReplicaMove) -> Callable[[str, BaseException], None]:
    def report(what: str, exc: BaseException) -> None:
        move.failed.append(f"{what}: {exc}")

    return report


def summary(moves: Sequence[ReplicaMove], save_path: str | os.PathLike[str]) -> list[str]:
    """Lines saying what the relocation moved, left and could not do."""
    moved = sum(len(m.moved) for m in moves)
    per = ", ".join(f"replica{m.replica}: {len(m.moved)}" for m in moves)
    lines = [f"relocated {moved} file{'s' if moved != 1 else ''} into {save_path}" + (f" ({per})" if moves else "")]
    dropped, skipped = sum(m.dropped for m in moves), sum(m.skipped for m in moves)
    if dropped or skipped:
        lines.append(
            f"left in place: {dropped} of ranks not profiled (TP peers), {skipped} of another step or an earlier start"
        )
    lines.extend(f"relocation FAILED: {line}" for m in moves for line in m.failed)
    return lines
