"""Reading one trace file in a single streaming pass: its header (:func:`read_header`) and its numbers
(:func:`scan_file`).

Both forms of the Chrome trace format are read: an object with ``traceEvents`` (and a header before it),
and a bare array of events, closed or not (:func:`closed_array`).

Reading (:func:`scan_file`) streams ``traceEvents`` with ``ijson`` (its C backend) and keeps,
per file, only what the numbers need: counters, the few stage and mini-batch ranges, and the
start and end of every ``cpu_op`` event (16 bytes each, to take their union per thread). A
file of under :data:`SMALL_FILE_BYTES` is decoded whole with ``orjson`` when installed (the
garbage collector paused), which is faster for small files and still bounded by that size.
Memory is therefore bounded by the largest single file, never by the total.

Only regular files are opened; decoded bytes pass a guard (depth, size: :mod:`._safe_io`).
Which files there are, and who wrote them, is :mod:`._discover`'s part.

Standard library only at import time; ``ijson`` / ``orjson`` are imported when a file is read.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import gzip
import importlib.util
import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from instrument.analyze.model import TraceFile
from instrument.analyze.traces import _safe_io, _stream
from instrument.analyze.traces._gpu import GpuRow
from instrument.analyze.traces._kernels import KernelTimes, kernel_times
from instrument.analyze.traces._safe_io import GuardedReader, TraceError
from instrument.analyze.traces._scanner import Scanner
from instrument.analyze.traces._steps import Segment
from instrument.ranks import registered_trace_names

__all__ = [
    "SMALL_FILE_BYTES",
    "FileScan",
    "Segment",
    "TraceError",
    "closed_array",
    "meta_label",
    "read_header",
    "scan_file",
    "with_rank_from_header",
]

SMALL_FILE_BYTES = 16 << 20
"""Uncompressed size under which a file is decoded whole (with orjson, when it is installed)."""

_READ_CHUNK = 1 << 20


# --------------------------------------------------------------------------- opening


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TraceError):
        return str(exc)
    if isinstance(exc, EOFError):
        return "truncated gzip (the compressed stream ends early)"
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        return f"corrupt gzip ({exc})"
    if isinstance(exc, OSError):
        return f"cannot read ({exc.strerror or exc})"
    if isinstance(exc, UnicodeDecodeError):
        return "not JSON (not UTF-8 text)"
    if isinstance(exc, MemoryError):
        return "too large to read"
    text = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    return f"not JSON ({text})"


# --------------------------------------------------------------------------- header


_HEADER_KEYS = ("distributedInfo", "instrument", "baseTimeNanoseconds", "host_name")
# kineto writes event times in µs after baseTimeNanoseconds (the wall clock, ns) and the host before the events


def read_header(path: str) -> dict[str, Any]:
    """The trace's ``distributedInfo`` and ``instrument`` objects (those found before ``traceEvents``).

    Reads only the beginning of the file; raises :class:`TraceError` when it is no chrome trace.
    """
    try:
        if not _have_ijson():
            return _scan_whole(TraceFile(path, "unknown", "trace", None, None, None), json.loads, 0).header
        with _safe_io.open_json(path) as stream:
            return _header(stream)[0]
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(_reason(exc)) from exc


def _header(stream: GuardedReader) -> tuple[dict[str, Any], bool]:
    """The header, and whether the file is the array form (which has none)."""
    import ijson  # type: ignore[import-untyped,import-not-found,unused-ignore]

    header: dict[str, Any] = {}
    events = ijson.parse(stream, buf_size=1 << 16)
    first = next(iter(events), None)
    if first is not None and first[1] == "start_array":
        return header, True
    if first is None or first[1] != "start_map":
        raise TraceError("not a chrome trace (the JSON is neither an object nor an array)")
    builder: Any = None
    current, began = "", 0
    for prefix, event, value in events:
        if prefix == "" and event in ("map_key", "end_map"):
            if builder is not None:
                header[current] = builder.value
                builder = None
            if event == "end_map":
                break
            current = value
            if value == "traceEvents":
                header["traceEvents"] = True
                return header, False
            if value in _HEADER_KEYS:
                builder, began = ijson.ObjectBuilder(), stream.guard.total
        elif builder is not None:
            builder.event(event, value)
            if stream.guard.total - began > _safe_io.MAX_HEADER_BYTES:  # built whole, a step per value
                raise TraceError(f"over the header limit: {current} over {_safe_io.MAX_HEADER_BYTES:,} bytes")
    raise TraceError("not a chrome trace (no traceEvents)")


# --------------------------------------------------------------------------- scanning


@dataclass
class FileScan:
    """What :func:`scan_file` took from one file."""

    segments: list[Segment]
    header: dict[str, Any]
    events: int
    bytes: int
    gpu: list[GpuRow] = field(default_factory=list)
    """GPU time of the whole file and of each ``ProfilerStep`` (:mod:`._gpu`); empty without GPU events."""
    kernels: KernelTimes | None = None
    """The whole file's GPU events by name, idle split and launch delays (:mod:`._kernels`)."""
    steps: list[tuple[int, float]] = field(default_factory=list)
    """Each ``ProfilerStep#N`` range: ``(N, µs)``."""
    notes: list[str] = field(default_factory=list)
    """Why the file was read as one range (no recognisable stage or step), if it was."""
    stage_ranges: list[tuple[str, int | None, float, float]] = field(default_factory=list)
    """Where each measured stage lies: ``(name, ProfilerStep N or None: the file's own step, start µs, end µs)``."""
    step_ranges: list[tuple[int, float, float]] = field(default_factory=list)
    """Each ``ProfilerStep#N`` range: ``(N, start µs, end µs)``, on the file's clock."""
    extent: tuple[float, float] | None = None
    """The first event's start and the last one's end (µs); ``None`` without events."""
    blocked: tuple[list[float], list[float]] = ([], [])
    """When the CPU side waited in a collective: disjoint sorted (starts, ends), µs (what the stage table's work
    leaves out, and the step timeline from traces cuts out of its stage ranges)."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while millions of short-lived, acyclic event dicts come and go (~15% faster)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Closed:
    """A bare array's bytes with what a writer may leave off appended at the end: the closing ``]``, after
    a trailing comma an empty event (``{}``, which holds nothing to read) before it."""

    def __init__(self, stream: GuardedReader) -> None:
        self.stream = stream
        self.last = b""
        self.done = False

    def read(self, size: int = -1) -> bytes:
        if self.done or size == 0:  # ijson reads 0 bytes first, to learn bytes from text
            return b""
        data = self.stream.read(size)
        if data:
            tail = data.rstrip()
            self.last = tail[-1:] or self.last
            return data
        self.done = True
        return b"" if self.last == b"]" else b"{}]" if self.last == b"," else b"]"


def closed_array(text: bytes) -> bytes:
    """A bare array's whole text closed as the Chrome trace format allows: a trailing comma dropped and
    the ``]`` added when missing (as its viewer does)."""
    text = text.rstrip()
    if text.endswith(b","):
        text = text[:-1].rstrip()
    return text if text.endswith(b"]") else text + b"]"


def _events_ijson(stream: GuardedReader, array: bool) -> Iterator[Any]:
    import ijson  # type: ignore[import-untyped,import-not-found,unused-ignore]

    source: Any = _Closed(stream) if array else stream
    prefix = "item" if array else "traceEvents.item"
    events: Iterator[Any] = ijson.items(source, prefix, use_float=True, buf_size=_READ_CHUNK)
    return events


@functools.cache
def _have_ijson() -> bool:
    return importlib.util.find_spec("ijson") is not None


def _loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


def scan_file(trace: TraceFile, wanted: frozenset[str] | None = None) -> FileScan:
    """Read one file in one pass; raises :class:`TraceError` with the reason when it cannot.

    ``wanted``: stage names (label keys) to pick as stages where stages are found inside the file.
    """
    try:
        size = os.path.getsize(trace.path)
        loads = _loads()
        if loads is not None and _safe_io.uncompressed_size(trace.path) < SMALL_FILE_BYTES:
            with contextlib.suppress(_safe_io.TooLargeError):  # a forged gzip trailer: stream the file instead
                return _scan_whole(trace, loads, size, limit=SMALL_FILE_BYTES, wanted=wanted)
        if not _have_ijson():  # the analyze extra brings it; without it, decode whole (memory ~10x the file)
            return _scan_whole(trace, loads or json.loads, size, wanted=wanted)
        with _safe_io.open_json(trace.path) as stream:
            header, array = _header(stream)
        scanner = _scanner(trace, header, wanted)
        try:  # the standard library's scanner: the same events, ~1.5x faster than ijson's
            with _safe_io.open_json(trace.path) as stream, _gc_paused():
                scanner.feed(_stream.events(stream))
        except _stream.UnfollowedError:  # text it does not follow: ijson decides, and words any error
            scanner = _scanner(trace, header, wanted)
            with _safe_io.open_json(trace.path) as stream, _gc_paused():
                scanner.feed(_events_ijson(stream, array))
        return _scanned(scanner, header, size)
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(_reason(exc)) from exc


def _scan_whole(
    trace: TraceFile, loads: Callable[[bytes], Any], size: int, limit: int = -1, wanted: frozenset[str] | None = None
) -> FileScan:
    """The file decoded whole; ``TooLargeError`` when it decodes to more than ``limit`` bytes."""
    with _safe_io.open_json(trace.path) as stream:
        text = stream.read() if limit < 0 else _safe_io.read_at_most(stream, limit)
    # The collector stays off while the decoded document lives: with millions of objects alive,
    # every full collection would walk them all.
    with _gc_paused():
        try:
            data = loads(text)
        except ValueError:
            if not text.lstrip()[:1] == b"[":
                raise
            data = loads(closed_array(text))  # an array the writer did not close
        del text
        header: dict[str, Any] = {}
        if isinstance(data, list):
            events = data
        elif isinstance(data, dict):
            listed = data.get("traceEvents")
            if not isinstance(listed, list):
                raise TraceError("not a chrome trace (no traceEvents)")
            events = listed
            header = {k: data[k] for k in _HEADER_KEYS if k in data}
        else:
            raise TraceError("not a chrome trace (the JSON is neither an object nor an array)")
        scanner = _scanner(trace, header, wanted)
        scanner.feed(e for e in events if isinstance(e, dict))
        del data, events
    return _scanned(scanner, header, size)


def _scanned(scanner: Scanner, header: dict[str, Any], size: int) -> FileScan:
    segments = scanner.finish()
    steps = [(number, end - start) for number, start, end in scanner.steps]
    gpu = scanner.gpu
    extent = (scanner.first, scanner.last) if scanner.first <= scanner.last else None
    return FileScan(
        segments,
        header,
        scanner.events,
        size,
        gpu.rows(),
        kernel_times(gpu),
        steps,
        scanner.notes,
        scanner.stage_ranges,
        scanner.steps,
        extent,
        scanner.blocked,
    )


def _scanner(trace: TraceFile, header: dict[str, Any], wanted: frozenset[str] | None) -> Scanner:
    # A rollout engine's trace is judged by its work, not by its profiling window.
    engine = trace.stage == "engine" or any(trace.tool == names.engine for names in registered_trace_names())
    return Scanner(_stage_name(trace, header), trace.continuous, inside=trace.inside, engine=engine, wanted=wanted)


def meta_label(meta: Any, key: str) -> str | None:
    """A label from a trace's own metadata, unless no terminal could print it (control characters)."""
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value.isprintable() else None


def _stage_name(trace: TraceFile, header: dict[str, Any]) -> str:
    return meta_label(header.get("instrument"), "stage") or trace.stage


def with_rank_from_header(trace: TraceFile, header: dict[str, Any]) -> TraceFile | None:
    """``trace`` completed from its ``distributedInfo`` / ``instrument`` header; ``None`` without a rank."""
    info = header.get("distributedInfo")
    meta = header.get("instrument")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("rank"), int):
        rank = meta["rank"]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        return None
    world = info.get("world_size") if isinstance(info, dict) else None
    changes: dict[str, Any] = {"rank": rank, "world_size": world if isinstance(world, int) else None}
    if isinstance(meta, dict):
        for key in ("role", "stage"):
            if (label := meta_label(meta, key)) is not None:
                changes[key] = label
        if isinstance(meta.get("step"), int):
            changes["step"] = meta["step"]
    return replace(trace, **changes)
