"""Finding trace files in a ``save_path`` and reading each one in a single streaming pass.

Discovery (:func:`discover`) takes the manifests first (every ``instrument-manifest-*.jsonl``),
then every other ``.json`` / ``.json.gz`` file by its name: SDK names (:func:`parse_trace_name`),
relocated vLLM engine and frontend traces (``{role}_engine_step{S}_rank{g}-of-{W}_replica{r}_…``,
``{role}_frontend_step{S}_replica{r}_…``), plain vLLM / SGLang worker names
(:func:`engine_trace_local_rank`), and last the trace's own ``distributedInfo.rank``.

Reading (:func:`scan_file`) streams ``traceEvents`` with ``ijson`` (its C backend) and keeps,
per file, only what the numbers need: counters, the few stage and mini-batch ranges, and the
start and end of every ``cpu_op`` event (16 bytes each, to take their union per thread). A
file of under :data:`SMALL_FILE_BYTES` is decoded whole with ``orjson`` when installed (the
garbage collector paused), which is faster for small files and still bounded by that size.
Memory is therefore bounded by the largest single file, never by the total.

Only regular files are opened; decoded bytes pass a guard (depth, size: :mod:`._safe_io`).

Standard library only at import time; ``ijson`` / ``orjson`` are imported when a file is read.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import gzip
import importlib.util
import json
import operator
import os
import re
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

from instrument import naming
from instrument._manifest import read_manifests
from instrument.analyze import _safe_io
from instrument.analyze._gpu import GpuAccumulator, GpuRow, is_profiler_step
from instrument.analyze._safe_io import GuardedReader, TraceError
from instrument.ranks import engine_trace_local_rank

__all__ = [
    "SMALL_FILE_BYTES",
    "FileScan",
    "Segment",
    "Skipped",
    "TraceError",
    "TraceFile",
    "discover",
    "label_key",
    "read_header",
    "scan_file",
]

SMALL_FILE_BYTES = 16 << 20
"""Uncompressed size under which a file is decoded whole (with orjson, when it is installed)."""

CONTINUOUS = naming.CONTINUOUS_STAGE
_TRACE_SUFFIXES = (".json.gz", ".json")
_HOST_CATS = frozenset({"cpu_op", "user_annotation"})  # where the SDK's stage and mini-batch ranges live
_MINI_BATCH = re.compile(r"mini_batch(\d+)\Z")
# A name that can be a stage range in a continuous trace: a label, not an op ("aten::mm") or a
# profiler row ("ProfilerStep#3", "Optimizer.step#Adam.step").
_STAGE_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_.=+-]*\Z")
_ENGINE = naming.ENGINE_TRACE
_FRONTEND = naming.FRONTEND_TRACE
_PREFIX_STEP = re.compile(r"(?:^|_)step(\d+)(?:_|$)")
_READ_CHUNK = 1 << 20
_GPU_OTHER = frozenset({"gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"})  # GPU work and launches


def label_key(label: str) -> str:
    """The form two labels are compared in: ``update_actor`` and ``update-actor`` are one stage."""
    try:
        return naming.sanitize_label(label)
    except (TypeError, ValueError):
        return str(label)


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class TraceFile:
    """One trace file and who wrote it."""

    path: str
    role: str
    stage: str
    step: int  # 0 when the name carries no step (plain engine traces)
    rank: int | None  # global rank; None for a frontend (see replica) or before the header is read
    world: int | None
    window: tuple[int, int] | None = None
    partial: bool = False
    tool: str = "torch"
    replica: int | None = None
    source: str = "manifest"  # manifest | name | engine | trace

    @property
    def continuous(self) -> bool:
        """A continuous-mode trace: one file per step holding every stage as a range."""
        return self.stage == CONTINUOUS

    def key(self) -> tuple[int, str, str, str, int, tuple[int, int] | None]:
        """What two files must not share: step, role, stage, rank (or replica), window."""
        who, number = ("rank", self.rank) if self.rank is not None else ("replica", self.replica)
        return (
            self.step,
            label_key(self.role),
            label_key(self.stage),
            who,
            -1 if number is None else number,
            self.window,
        )


@dataclass(frozen=True)
class Skipped:
    """A file left out of the analysis, and why."""

    path: str
    reason: str


def _is_trace_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(_TRACE_SUFFIXES)


def _from_name(path: Path) -> TraceFile | None:
    """Who wrote ``path``, read from its name alone; ``None`` when the name says nothing."""
    name = path.name
    parsed = naming.parse_trace_name(name)
    if parsed is not None:
        return TraceFile(
            path=str(path),
            role=parsed.role,
            stage=parsed.stage,
            step=parsed.step,
            rank=parsed.rank,
            world=parsed.world_size,
            window=parsed.window,
            partial=parsed.partial,
            source="name",
        )
    match = _ENGINE.match(name)
    if match is not None:
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="engine",
            step=int(match["step"]),
            rank=None if match["rank"] is None else int(match["rank"]),
            world=int(match["world"]),
            tool="vllm",
            replica=int(match["replica"]),
            source="engine",
        )
    match = _FRONTEND.match(name)
    if match is not None:
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="frontend",
            step=int(match["step"]),
            rank=None,
            world=None,
            tool="vllm",
            replica=int(match["replica"]),
            source="engine",
        )
    local = engine_trace_local_rank(name)
    if local is not None:
        step = _PREFIX_STEP.search(name)
        tool = "sglang" if "-TP-" in name else "vllm"
        return TraceFile(
            path=str(path),
            role="rollout",
            stage="engine",
            step=int(step[1]) if step else 0,
            rank=local,
            world=None,
            tool=tool,
            source="engine",
        )
    return None


def discover(directory: str | os.PathLike[str]) -> tuple[list[TraceFile], list[Skipped]]:
    """Every trace file of ``directory`` (manifest records first, then names), sorted by path.

    Files whose rank the name does not give come back with ``rank=None`` and ``source="trace"``:
    :func:`read_header` reads it from the trace.  Entries named like a trace or manifest that are no
    regular file, and bad manifest lines, come back :class:`Skipped`.  Raises ``OSError`` when the
    directory cannot be listed, ``ValueError`` for a bad ``$INSTRUMENT_ANALYZE_MAX_BYTES``.
    """
    root = Path(directory)
    _safe_io.max_decoded_bytes()  # a bad override fails the run here, not once per file
    on_disk: dict[str, Path] = {}
    skipped: list[Skipped] = []
    named: set[str] = set()  # reported once: not again as "listed in a manifest"
    with os.scandir(root) as listing:
        for name in (item.name for item in listing if _is_trace_name(item.name)):
            problem = _safe_io.entry_problem(str(root / name))  # manifests: read_manifests checks them
            if problem is None:
                on_disk[name] = root / name
            else:
                skipped.append(Skipped(str(root / name), problem))
                named.add(name)
    found: dict[str, TraceFile] = {}
    for record in read_manifests(root, on_skip=lambda path, reason: skipped.append(Skipped(path, reason))):
        # By name: relative to save_path, or (older manifests) absolute, maybe from another machine
        name = os.path.basename(record.path)
        if not name.endswith(_TRACE_SUFFIXES):
            continue  # an nsys report or another file we cannot read
        if name not in on_disk:
            if name not in named:
                named.add(name)
                skipped.append(Skipped(str(root / name), "listed in a manifest but not in the directory"))
            continue
        if record.rank < 0:
            continue  # relocated with an unknown rank: the name decides below
        found.setdefault(
            name,
            TraceFile(
                path=str(on_disk[name]),
                role=record.role,
                stage=record.stage,
                step=record.step,
                rank=record.rank,
                world=record.world,
                window=record.window,
                partial=record.partial,
                tool=record.tool,
            ),
        )
    for name, entry in on_disk.items():
        if name in found:
            continue
        by_name = _from_name(entry)
        if by_name is None:
            by_name = TraceFile(
                path=str(entry), role="unknown", stage="trace", step=0, rank=None, world=None, source="trace"
            )
        found[name] = by_name
    return sorted(found.values(), key=lambda f: f.path), skipped


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


_HEADER_KEYS = ("distributedInfo", "instrument")


def read_header(path: str) -> dict[str, Any]:
    """The trace's ``distributedInfo`` and ``instrument`` objects (those found before ``traceEvents``).

    Reads only the beginning of the file; raises :class:`TraceError` when it is no chrome trace.
    """
    try:
        if not _have_ijson():
            return _scan_whole(TraceFile(path, "unknown", "trace", 0, None, None), json.loads, 0).header
        with _safe_io.open_json(path) as stream:
            return _header(stream)
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(_reason(exc)) from exc


def _header(stream: GuardedReader) -> dict[str, Any]:
    import ijson  # type: ignore[import-untyped,import-not-found,unused-ignore]

    header: dict[str, Any] = {}
    events = ijson.parse(stream, buf_size=1 << 16)
    first = next(iter(events), None)
    if first is None or first[1] != "start_map":
        raise TraceError("not a chrome trace (the JSON is not an object)")
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
                return header
            if value in _HEADER_KEYS:
                builder, began = ijson.ObjectBuilder(), stream.guard.total
        elif builder is not None:
            builder.event(event, value)
            if stream.guard.total - began > _safe_io.MAX_HEADER_BYTES:  # built whole, a step per value
                raise TraceError(f"over the header limit: {current} over {_safe_io.MAX_HEADER_BYTES:,} bytes")
    raise TraceError("not a chrome trace (no traceEvents)")


# --------------------------------------------------------------------------- scanning


@dataclass
class Segment:
    """One stage's numbers from one file (times in microseconds, as chrome traces count them)."""

    stage: str
    wall_us: float
    basis: str  # what wall_us measures: "stage" range, "mini_batches" union, or whole trace "span"
    minibatch_us: float = 0.0
    mini_batches: int = 0
    cpu_us: float = 0.0
    kernel_us: float = 0.0
    kernels: int = 0
    events: int = 0


@dataclass
class FileScan:
    """What :func:`scan_file` took from one file."""

    segments: list[Segment]
    header: dict[str, Any]
    events: int
    bytes: int
    gpu: list[GpuRow] = field(default_factory=list)
    """GPU time of the whole file and of each ``ProfilerStep`` (:mod:`._gpu`); empty without GPU events."""


@dataclass
class _Ranges:
    """Start/end pairs kept while streaming."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def merged(self) -> tuple[list[float], list[float]]:
        """The union as sorted, disjoint intervals (starts, ends)."""
        starts, ends = self.starts, self.ends
        if not starts:
            return [], []
        if not all(map(operator.le, starts, islice(starts, 1, None))):
            return self._merged_apart()
        pairs = zip(starts, ends, strict=True)
        cur_s, cur_e = next(pairs)
        out_s: list[float] = []
        out_e: list[float] = []
        for s, e in pairs:
            if s > cur_e:
                out_s.append(cur_s)
                out_e.append(cur_e)
                cur_s, cur_e = s, e
            elif e > cur_e:
                cur_e = e
        out_s.append(cur_s)
        out_e.append(cur_e)
        return out_s, out_e

    def _merged_apart(self) -> tuple[list[float], list[float]]:
        # Unsorted starts (rare; hostile files): sorted apart, 8 bytes a value where (start, end) tuples
        # take ~56. With both sorted, the union has a gap after ends[k] exactly when starts[k+1] > ends[k].
        self.starts = starts = array("d", sorted(self.starts))
        self.ends = ends = array("d", sorted(self.ends))
        cuts = [k for k, (s, e) in enumerate(zip(islice(starts, 1, None), ends, strict=False)) if s > e]
        return [starts[0], *(starts[k + 1] for k in cuts)], [*(ends[k] for k in cuts), ends[-1]]


def _length(starts: list[float], ends: list[float]) -> float:
    # Differences first: timestamps are ~1e12 us, and summing them would lose the microseconds.
    return float(sum(map(operator.sub, ends, starts)))


def _overlap(starts: list[float], ends: list[float], lo: float, hi: float) -> float:
    """Length of the disjoint sorted intervals inside ``[lo, hi]``."""
    total = 0.0
    i = bisect.bisect_right(ends, lo)
    while i < len(starts) and starts[i] < hi:
        total += max(0.0, min(ends[i], hi) - max(starts[i], lo))
        i += 1
    return total


class _Scanner:
    """Takes events one at a time; :meth:`finish` turns them into segments."""

    def __init__(self, stage: str, continuous: bool) -> None:
        self.stage_key = label_key(stage)
        self.stage = stage
        self.continuous = continuous
        self.kinds: dict[str, int] = {}
        self.cpu: dict[tuple[Any, Any], _Ranges] = {}
        self.markers: list[tuple[str, float, float, Any, Any, str]] = []  # name, start, end, pid, tid, cat
        self.mini: list[tuple[float, float]] = []
        self.kernel_us = 0.0
        self.kernels = 0
        self.events = 0
        self.first = float("inf")
        self.last = float("-inf")
        # continuous mode only: where every event and kernel falls
        self.event_ts = array("d")
        self.kernel_ts = array("d")
        self.kernel_dur = array("d")
        self.gpu = GpuAccumulator()

    def _kind(self, name: str) -> int:
        """0: an ordinary event, 1: a mini-batch range, 2: a stage range (or, continuous, a candidate),
        3: a ``ProfilerStep#N`` range (otherwise an ordinary event)."""
        if is_profiler_step(name) is not None:
            kind = 3
        elif _MINI_BATCH.match(name):
            kind = 1
        elif self.continuous:
            kind = 2 if _STAGE_LIKE.match(name) and not name.startswith("ProfilerStep") else 0
        else:
            kind = 2 if name == self.stage or label_key(name) == self.stage_key else 0
        self.kinds[name] = kind
        return kind

    def feed(self, events: Iterable[Any]) -> None:  # noqa: PLR0915 - one hot loop, inline for speed
        kinds = self.kinds
        cpu = self.cpu
        continuous = self.continuous
        event_ts = self.event_ts
        count = 0
        first, last = self.first, self.last
        kernel_us, kernels = self.kernel_us, self.kernels
        for ev in events:
            if ev.get("ph") != "X":
                continue
            count += 1
            ts = ev.get("ts")
            if ts is None:
                continue
            end = ts + (ev.get("dur") or 0)
            if ts < first:  # noqa: PLR1730 - a comparison is cheaper than a call to min() here
                first = ts
            if end > last:  # noqa: PLR1730
                last = end
            if continuous:
                event_ts.append(ts)
            cat = ev.get("cat")
            if cat in _HOST_CATS:
                name = ev.get("name")
                kind = kinds.get(name)
                if kind is None:
                    kind = self._kind(str(name))
                if kind == 1:
                    self.mini.append((ts, end))
                    continue
                if kind == 2:
                    self.markers.append((str(name), ts, end, ev.get("pid"), ev.get("tid"), cat))
                    continue
                if kind == 3:
                    self.gpu.add_step(is_profiler_step(str(name)) or 0, ts, end)
                if cat == "cpu_op":
                    key = (ev.get("pid"), ev.get("tid"))
                    ranges = cpu.get(key)
                    if ranges is None:
                        ranges = cpu[key] = _Ranges()
                    ranges.starts.append(ts)
                    ranges.ends.append(end)
            elif cat == "kernel":
                kernels += 1
                kernel_us += end - ts
                if continuous:
                    self.kernel_ts.append(ts)
                    self.kernel_dur.append(end - ts)
                self.gpu.add(ev, cat, ts, end)
            elif cat in _GPU_OTHER:
                self.gpu.add(ev, cat, ts, end)
        self.events += count
        self.first, self.last = first, last
        self.kernel_us, self.kernels = kernel_us, kernels

    def finish(self) -> list[Segment]:
        if self.continuous:
            return self._continuous()
        return [self._discrete()]

    def _discrete(self) -> Segment:
        stage_ranges = _Ranges()
        for _, start, end, *_ in self.markers:
            stage_ranges.add(start, end)
        if stage_ranges.starts:
            wall, basis = _length(*stage_ranges.merged()), "stage"
        elif self.mini:
            mini = _Ranges()
            for start, end in self.mini:
                mini.add(start, end)
            wall, basis = _length(*mini.merged()), "mini_batches"
        else:
            wall, basis = (self.last - self.first if self.events else 0.0), "span"
        cpu_us = 0.0
        for ranges in self.cpu.values():
            cpu_us += _length(*ranges.merged())
        return Segment(
            stage=self.stage,
            wall_us=wall,
            basis=basis,
            minibatch_us=sum(end - start for start, end in self.mini),
            mini_batches=len(self.mini),
            cpu_us=cpu_us,
            kernel_us=self.kernel_us,
            kernels=self.kernels,
            events=self.events,
        )

    def _continuous(self) -> list[Segment]:
        # Stage ranges are the candidates no other candidate contains; the rest are the user's own
        # ranges inside a stage, and count as ordinary events again.
        markers = sorted(self.markers, key=lambda m: (m[1], -m[2]))
        stages: dict[str, _Ranges] = {}
        outer_end = float("-inf")
        for name, start, end, pid, tid, cat in markers:
            if start >= outer_end or end > outer_end:
                stages.setdefault(name, _Ranges()).add(start, end)
                outer_end = max(outer_end, end)
            elif cat == "cpu_op":
                self.cpu.setdefault((pid, tid), _Ranges()).add(start, end)
        cpu_merged = [ranges.merged() for ranges in self.cpu.values()]
        event_ts = sorted(self.event_ts)
        kernel_order = sorted(range(len(self.kernel_ts)), key=self.kernel_ts.__getitem__)
        kernel_ts = [self.kernel_ts[i] for i in kernel_order]
        kernel_cum = [0.0]
        for i in kernel_order:
            kernel_cum.append(kernel_cum[-1] + self.kernel_dur[i])
        segments = []
        for name, ranges in stages.items():
            starts, ends = ranges.merged()
            seg = Segment(stage=name, wall_us=_length(starts, ends), basis="stage")
            for lo, hi in zip(starts, ends, strict=True):
                for mini_start, mini_end in self.mini:
                    if lo <= mini_start and mini_end <= hi:
                        seg.minibatch_us += mini_end - mini_start
                        seg.mini_batches += 1
                seg.cpu_us += sum(_overlap(s, e, lo, hi) for s, e in cpu_merged)
                a, b = bisect.bisect_left(kernel_ts, lo), bisect.bisect_right(kernel_ts, hi)
                seg.kernels += b - a
                seg.kernel_us += kernel_cum[b] - kernel_cum[a]
                seg.events += bisect.bisect_right(event_ts, hi) - bisect.bisect_left(event_ts, lo)
            segments.append(seg)
        return segments


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


def _events_ijson(stream: GuardedReader) -> Iterator[Any]:
    import ijson  # type: ignore[import-untyped,import-not-found,unused-ignore]

    events: Iterator[Any] = ijson.items(stream, "traceEvents.item", use_float=True, buf_size=_READ_CHUNK)
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


def scan_file(trace: TraceFile) -> FileScan:
    """Read one file in one pass; raises :class:`TraceError` with the reason when it cannot."""
    try:
        size = os.path.getsize(trace.path)
        loads = _loads()
        if loads is not None and _safe_io.uncompressed_size(trace.path) < SMALL_FILE_BYTES:
            with contextlib.suppress(_safe_io.TooLargeError):  # a forged gzip trailer: stream the file instead
                return _scan_whole(trace, loads, size, limit=SMALL_FILE_BYTES)
        if not _have_ijson():  # the analyze extra brings it; without it, decode whole (memory ~10x the file)
            return _scan_whole(trace, loads or json.loads, size)
        with _safe_io.open_json(trace.path) as stream:
            header = _header(stream)
        scanner = _Scanner(_stage_name(trace, header), trace.continuous)
        with _safe_io.open_json(trace.path) as stream, _gc_paused():
            scanner.feed(_events_ijson(stream))
        return FileScan(scanner.finish(), header, scanner.events, size, scanner.gpu.rows())
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(_reason(exc)) from exc


def _scan_whole(trace: TraceFile, loads: Callable[[bytes], Any], size: int, limit: int = -1) -> FileScan:
    """The file decoded whole; ``TooLargeError`` when it decodes to more than ``limit`` bytes."""
    with _safe_io.open_json(trace.path) as stream:
        text = stream.read() if limit < 0 else _safe_io.read_at_most(stream, limit)
    # The collector stays off while the decoded document lives: with millions of objects alive,
    # every full collection would walk them all.
    with _gc_paused():
        data = loads(text)
        del text
        if not isinstance(data, dict):
            raise TraceError("not a chrome trace (the JSON is not an object)")
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError("not a chrome trace (no traceEvents)")
        header = {k: data[k] for k in _HEADER_KEYS if k in data}
        scanner = _Scanner(_stage_name(trace, header), trace.continuous)
        scanner.feed(e for e in events if isinstance(e, dict))
        del data, events
    return FileScan(scanner.finish(), header, scanner.events, size, scanner.gpu.rows())


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
    changes: dict[str, Any] = {"rank": rank, "world": world if isinstance(world, int) else None}
    if isinstance(meta, dict):
        for key in ("role", "stage"):
            if (label := meta_label(meta, key)) is not None:
                changes[key] = label
        if isinstance(meta.get("step"), int):
            changes["step"] = meta["step"]
    return replace(trace, **changes)
