"""The per-process manifest: one JSON line per file written into ``save_path``.

Each process appends to its own ``instrument-manifest-{host}-pid{pid}.jsonl``, so ranks on a
shared filesystem never write into the same file; each record is one ``write`` on an
``O_APPEND`` descriptor, so a crash leaves whole lines behind.  Readers take every
``instrument-manifest-*.jsonl`` and skip lines they cannot parse.

Each line also names the run that wrote it (:class:`RunStamp`: ``run``, ``run_from``, ``run_started``),
so several runs into one ``save_path`` can be told apart; lines of older writers have none.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from instrument import naming
from instrument._safe_files import NotRegularFileError, create_new, open_regular
from instrument.naming import TraceIdentity

__all__ = [
    "CUT_SHORT",
    "MANIFEST_GLOB",
    "Manifest",
    "RunStamp",
    "TraceRecord",
    "manifest_name",
    "read_manifests",
]

MANIFEST_GLOB = "instrument-manifest-*.jsonl"
_NAME_ATTEMPTS = 100


@dataclass(frozen=True)
class RunStamp:
    """Which run wrote a manifest line: its id (shared by every process of the job), where the id came from
    (``env``, ``torchelastic``, ``store``, ``ray``, ``slurm``, ``time``, ``process``) and when this
    process's run started (seconds since the epoch)."""

    id: str
    source: str
    started: float


@dataclass(frozen=True, kw_only=True)
class TraceRecord(TraceIdentity):
    """One file in ``save_path`` and what it holds: the trace's identity, where it is, its size and tool.

    On disk the world size keeps its manifest key ``world`` (every manifest written so far has it).
    """

    path: str
    bytes: int
    tool: str
    run: RunStamp | None = field(default=None, compare=False)
    """The run that wrote the line (read back from a manifest; ``None`` from older writers). Not compared:
    a record read back equals the one published."""

    def to_json(self) -> str:
        """The record as one JSON line (without newline)."""
        data: dict[str, Any] = {key: getattr(self, attr) for key, attr in _ON_DISK}
        data["window"] = None if self.window is None else list(self.window)
        if self.run is not None:
            data.update(run=self.run.id, run_from=self.run.source, run_started=self.run.started)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


# Manifest keys in the order every writer has written them, and the attribute each holds.
_ON_DISK = (
    ("path", "path"),
    ("role", "role"),
    ("stage", "stage"),
    ("step", "step"),
    ("rank", "rank"),
    ("world", "world_size"),
    ("window", "window"),
    ("partial", "partial"),
    ("bytes", "bytes"),
    ("tool", "tool"),
    ("triggered", "triggered"),
)


def manifest_name(host: str | None = None, pid: int | None = None) -> str:
    """This process's manifest file name."""
    host = naming.short_hostname() if host is None else naming.sanitize_label(host)
    return f"instrument-manifest-{host}-pid{os.getpid() if pid is None else pid}.jsonl"


class Manifest:
    """Appends :class:`TraceRecord` lines to this process's manifest in ``save_path``.

    The file is created exclusively and never through a symlink: a name that exists already
    (a planted link, an earlier run of a recycled pid) moves this run to ``…-pid{pid}-{n}.jsonl``.
    """

    def __init__(self, save_path: str | os.PathLike[str], run: RunStamp | None = None) -> None:
        self.path = Path(save_path) / manifest_name()
        self.run = run  # stamped on every line written
        self._lock = threading.Lock()
        self._fd: int | None = None

    def _open(self) -> int:
        stem = self.path.name.removesuffix(".jsonl")
        for n in range(_NAME_ATTEMPTS):
            path = self.path.with_name(f"{stem}-{n}.jsonl" if n else f"{stem}.jsonl")
            try:
                fd = create_new(path, mode=0o644, append=True)
            except FileExistsError:
                continue
            self.path = path
            return fd
        raise FileExistsError(f"no free manifest name like {self.path} after {_NAME_ATTEMPTS} attempts")

    def append(self, record: TraceRecord) -> None:
        """Add one record (one ``write``: a crash leaves whole lines); ``OSError`` when it cannot."""
        if self.run is not None and record.run is None:
            record = replace(record, run=self.run)
        line = (record.to_json() + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                self._fd = self._open()
            written = os.write(self._fd, line)
            if written != len(line):  # a full disk mid-line: end it so the next line stays readable
                os.write(self._fd, b"\n")
                raise OSError(errno.ENOSPC, f"manifest line cut short in {self.path}")

    def close(self) -> None:
        """Close the file (a later ``append`` starts a new one)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


MAX_LINE_BYTES = 1 << 20
"""Longest manifest line read (a record is ~300 bytes): a longer one is skipped without holding it."""

CUT_SHORT = "cut short (no end of line: its writer stopped mid-line, e.g. killed); the lines before it are read"
"""Why the last line of a manifest is skipped when it is no whole record and has no newline."""

_NAMED_PER_MANIFEST = 20  # bad lines named one by one; past that, one count per manifest
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def read_manifests(
    save_path: str | os.PathLike[str], on_skip: Callable[[str, str], None] | None = None
) -> Iterator[TraceRecord]:
    """Every record of every ``instrument-manifest-*.jsonl`` in ``save_path``.

    Only regular files are opened (a FIFO, a directory or a dangling symlink under a manifest's name
    is skipped, never waited on); a line that is not one whole, well-typed record is skipped. Each
    skip is told to ``on_skip(path, reason)`` when given, e.g. ``"line 3: 'rank' must be an int
    (got "0")"``; a last line cut short by a writer killed mid-line is told as :data:`CUT_SHORT`.
    Fields a newer writer adds are ignored. Each manifest is opened once and read line by line (a line
    at most :data:`MAX_LINE_BYTES` held): time linear in the manifests' size, memory in one line.
    """
    tell = on_skip or (lambda _path, _reason: None)
    for manifest in sorted(Path(save_path).glob(MANIFEST_GLOB)):
        where = str(manifest)
        try:
            handle = _open_regular(manifest)
        except OSError as exc:
            tell(where, _why_not(manifest, exc))
            continue
        bad = 0
        with handle:
            for number, line in enumerate(_bounded_lines(handle), 1):
                try:
                    if line is None:
                        raise ValueError(f"longer than {MAX_LINE_BYTES:,} bytes")
                    text = line.decode("utf-8", errors="replace").strip()
                    if text:
                        yield _record(text)
                except ValueError as exc:
                    bad += 1
                    cut = line is not None and not line.endswith(b"\n")  # only the last line can lack its end
                    if bad <= _NAMED_PER_MANIFEST:
                        tell(where, f"line {number}: {CUT_SHORT if cut else exc}")
        if bad > _NAMED_PER_MANIFEST:
            tell(where, f"{bad - _NAMED_PER_MANIFEST} more bad lines")


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file (through a symlink); a FIFO cannot block."""
    return open_regular(path, follow_symlinks=True)


def _why_not(path: Path, exc: OSError) -> str:
    if isinstance(exc, NotRegularFileError):
        kind = next((words for test, words in _KINDS if test(exc.mode)), "a device")
        return f"not a regular file: {kind}"
    if exc.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT and path.is_symlink():
        return "dangling symlink (its target does not exist)"
    return str(exc.strerror) if exc.errno == errno.EINVAL else f"cannot read ({exc.strerror or exc})"


def _bounded_lines(handle: Any) -> Iterator[bytes | None]:
    """The lines of ``handle``; ``None`` for one longer than :data:`MAX_LINE_BYTES` (read past, not kept)."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
            pass
        yield None


_FIELDS = (
    ("path", str, "a string"),
    ("role", str, "a string"),
    ("stage", str, "a string"),
    ("step", int, "an int"),
    ("rank", int, "an int"),
    ("world", int, "an int"),
    ("partial", bool, "true or false"),
    ("bytes", int, "an int"),
    ("tool", str, "a string"),
    ("triggered", bool, "true or false"),
)
_OPTIONAL = frozenset({"triggered"})  # older writers did not write it


def _record(text: str) -> TraceRecord:
    """One manifest line as a record; ``ValueError`` naming the first field that is missing or wrong."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    values: dict[str, Any] = {}
    for key, kind, words in _FIELDS:
        if key in data:
            values[key] = _checked(key, data[key], kind, words)
        elif key not in _OPTIONAL:
            raise ValueError(f"'{key}' is missing")
    if "window" not in data:
        raise ValueError("'window' is missing")
    window = data["window"]
    if window is not None:
        if not (isinstance(window, list) and len(window) == 2):
            raise ValueError(f"'window' must be null or [first, last] (got {_shown(window)})")
        window = tuple(_checked("window", n, int, "null or two ints") for n in window)
    values["world_size"] = values.pop("world")
    return TraceRecord(window=window, run=_stamp(data), **values)


def _stamp(data: dict[str, Any]) -> RunStamp | None:
    """The line's run (``None`` when it names none: an older writer); ``ValueError`` for a malformed one."""
    if "run" not in data:
        return None
    run_id = _checked("run", data["run"], str, "a string")
    source = _checked("run_from", data.get("run_from", "env"), str, "a string")
    started = data.get("run_started", 0.0)
    if isinstance(started, bool) or not isinstance(started, int | float) or not math.isfinite(started):
        raise ValueError(f"'run_started' must be a number (got {_shown(started)})")
    return RunStamp(run_id, source, float(started)) if run_id else None


def _checked(key: str, value: Any, kind: type, words: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"'{key}' must be {words} (got {_shown(value)})")
    if isinstance(value, str) and not value.isprintable():  # control characters, a lone surrogate
        raise ValueError(f"'{key}' must be printable text (got {_shown(value)})")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
