"""The ops and kernels of a stage in one trace file, by name: what a comparison reads for its causes.

An analysis keeps no op names (its scan sums time, not names), so the causes of a reported change are read
afterwards, and only for the files :func:`~.analyzers._compare.pick_files` chose (a few stage instances a
side). One streaming pass a file with the analysis's reader (:mod:`.traces._safe_io` guards the bytes,
:mod:`.traces._stream` decodes the events), for every stage asked of that file at once:

- **ops** (``cpu_op``): self time — the duration less that of the ops directly inside it on its thread —
  and calls; an op counts for a stage when it starts inside one of the stage's ranges (any thread: autograd
  runs backward on a thread of its own). A file without such a range (a mini-batch window's trace) is the
  stage whole.
- **kernels** (``kernel``, ``gpu_memcpy``, ``gpu_memset``): duration and calls; a kernel counts for a stage
  when the launch with its ``correlation`` started inside the stage, else (no launch recorded) when it
  started inside the stage's GPU annotation, else its CPU range.
- **steps**: where a file holds several steps (``ProfilerStep#N``) only the stage ranges of the steps asked
  count.

Collectives (:data:`~.traces._steps.COLLECTIVE`: ``nccl``, ``gloo:``, ``c10d::`` …) are marked, so the
communication share of a stage's GPU time can be given. ``B`` / ``E`` pairs are passed over (torch writes
complete events).
"""

from __future__ import annotations

import bisect
import gc
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from instrument.analyze.model import OpTable, label_key
from instrument.analyze.traces import _safe_io, _stream
from instrument.analyze.traces._gpu import GPU_CATS, LAUNCH_CATS, is_profiler_step
from instrument.analyze.traces._reader import TraceError, closed_array
from instrument.analyze.traces._scanner import MAX_US
from instrument.analyze.traces._steps import COLLECTIVE, union

__all__ = ["read_ops"]

_RANGE_CATS = frozenset({"user_annotation", "cpu_op"})
_GPU_RANGE = "gpu_user_annotation"
_US_PER_MS = 1000.0


_ORDINARY, _SKIP, _STEP = "", "-", "#"  # what a range's name is, besides a stage key


@dataclass
class _Seen:
    """What one pass over a file keeps."""

    stages: frozenset[str]
    ops: dict[tuple[Any, Any], list[tuple[float, float, str]]] = field(default_factory=dict)
    cpu_ranges: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gpu_ranges: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    launches: dict[Any, float] = field(default_factory=dict)
    kernels: list[tuple[str, float, float, Any]] = field(default_factory=list)
    kinds: dict[Any, str] = field(default_factory=dict)  # name -> a stage key, _ORDINARY, _SKIP or _STEP

    def kind(self, name: Any) -> str:
        text = str(name)
        key = label_key(text)
        if key in self.stages:
            kind = key
        elif text.startswith("ProfilerStep") and is_profiler_step(text) is not None:
            kind = _STEP
        elif text.startswith("mini_batch"):
            kind = _SKIP
        else:
            kind = _ORDINARY
        self.kinds[name] = kind
        return kind

    def feed(self, events: Iterable[Any]) -> None:  # one hot loop, inline for speed
        ops, launches, kernels, kinds = self.ops, self.launches, self.kernels, self.kinds
        low, high = -MAX_US, MAX_US
        for ev in events:
            if type(ev) is not dict or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            ts = ev.get("ts")
            if ts is None or cat is None:
                continue
            if not (low < ts < high and low < ts + (ev.get("dur") or 0) < high):  # as the scanner: left out
                continue
            if cat in _RANGE_CATS:
                name = ev.get("name")
                kind = kinds.get(name)
                if kind is None:
                    kind = self.kind(name)
                end = ts + (ev.get("dur") or 0)
                if kind is _ORDINARY:
                    if cat == "cpu_op":
                        thread = (ev.get("pid"), ev.get("tid"))
                        held = ops.get(thread)
                        if held is None:
                            held = ops[thread] = []
                        held.append((ts, end, name if type(name) is str else str(name)))
                elif kind is _STEP:
                    self.steps.append((is_profiler_step(str(name)) or 0, ts, end))
                elif kind is not _SKIP:
                    self.cpu_ranges.setdefault(kind, []).append((ts, end))
            elif cat in GPU_CATS:
                args = ev.get("args")
                correlation = args.get("correlation") if type(args) is dict else None
                kernels.append((str(ev.get("name")), ts, ev.get("dur") or 0, correlation))
            elif cat in LAUNCH_CATS:
                args = ev.get("args")
                if type(args) is dict and args.get("correlation") is not None:
                    launches[args["correlation"]] = ts
            elif cat == _GPU_RANGE:
                name = ev.get("name")
                kind = kinds.get(name)
                if kind is None:
                    kind = self.kind(name)
                if kind not in (_ORDINARY, _SKIP, _STEP):
                    self.gpu_ranges.setdefault(kind, []).append((ts, ts + (ev.get("dur") or 0)))


def _events(path: str) -> Iterator[Any]:
    with _safe_io.open_json(path) as stream:
        yield from _stream.events(stream)


def _whole(path: str) -> list[Any]:
    """The file decoded whole (what :mod:`._stream` does not follow), under the reader's size limit."""
    with _safe_io.open_json(path) as stream:
        text = _safe_io.read_at_most(stream, _safe_io.max_decoded_bytes())
    try:
        data = json.loads(text)
    except ValueError:
        data = json.loads(closed_array(text))
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError("not a chrome trace (no traceEvents)")
    return events


def _seen(path: str, stages: frozenset[str]) -> _Seen:
    enabled = gc.isenabled()
    gc.disable()  # millions of short-lived, acyclic event dicts: no collection while they come and go
    try:
        seen = _Seen(stages)
        try:
            seen.feed(_events(path))
        except _stream.UnfollowedError:  # text the fast decoder does not follow: read it whole instead
            seen = _Seen(stages)
            seen.feed(_whole(path))
        return seen
    finally:
        if enabled:
            gc.enable()


def _self_times(seen: _Seen) -> tuple[list[float], list[float], list[str]]:
    """Every op of the file as columns sorted by start: start, self time (µs; its duration less its direct
    children's on its thread), name."""
    rows: list[tuple[float, float, str]] = []
    for ops in seen.ops.values():
        ops.sort(key=lambda op: (op[0], -op[1]))
        stack: list[list[Any]] = []  # [end, start, name, children's time]
        for start, end, name in ops:
            while stack and stack[-1][0] <= start:
                top = stack.pop()
                rows.append((top[1], top[0] - top[1] - top[3], top[2]))
            if stack:
                stack[-1][3] += min(end, stack[-1][0]) - start
            stack.append([end, start, name, 0.0])
        rows.extend((top[1], top[0] - top[1] - top[3], top[2]) for top in reversed(stack))
    rows.sort(key=lambda row: row[0])
    return [r[0] for r in rows], [max(0.0, r[1]) for r in rows], [r[2] for r in rows]


Ranges = list[tuple[float, float, int | None]]
"""Disjoint (start, end, step) ranges, sorted; step ``None``: the file is not split by step."""


def _ranges_for(seen: _Seen, stage: str, steps: frozenset[int] | None) -> Ranges | None:
    """The stage's CPU ranges, merged, each with the step it belongs to where the file holds several steps and
    ``steps`` asks for some; ``None``: the file has no range of it (it is the stage whole)."""
    ranges = seen.cpu_ranges.get(stage)
    if not ranges:
        return None
    by_step: dict[int | None, list[tuple[float, float]]] = {}
    if steps is not None and seen.steps:
        windows = sorted((start, end, n) for n, start, end in seen.steps)
        starts = [w[0] for w in windows]
        for lo, hi in ranges:
            i = bisect.bisect_right(starts, lo) - 1
            step = windows[i][2] if i >= 0 and lo <= windows[i][1] else None
            if step in steps:
                by_step.setdefault(step, []).append((lo, hi))
    # not split (or none kept: the ProfilerSteps are not the steps asked, a window trace's mini-batches): all
    if not by_step:
        by_step = {None: list(ranges)}
    merged: Ranges = []
    for step, pairs in by_step.items():
        lows, highs = union(pairs)
        merged.extend((lo, hi, step) for lo, hi in zip(lows, highs, strict=True))
    merged.sort(key=lambda r: r[0])
    return merged


def _step_at(ranges: Ranges, starts: list[float], at: float) -> tuple[bool, int | None]:
    """Whether ``at`` falls in one of ``ranges``, and that range's step."""
    i = bisect.bisect_right(starts, at) - 1
    if i >= 0 and at <= ranges[i][1]:
        return True, ranges[i][2]
    return False, None


def read_ops(path: str, stages: Mapping[str, frozenset[int] | None]) -> dict[str, dict[int | None, OpTable]]:
    """Per stage (label key) asked of the file — with the steps to keep where it holds several, ``None``: every
    range — and per step (``None`` where the file is not split by step), its ops' self times and its kernels'
    times (``instances`` left 0 for the caller).

    Raises :class:`~.traces._reader.TraceError` or ``OSError`` when the file cannot be read."""
    try:
        seen = _seen(path, frozenset(stages))
    except (TraceError, OSError):
        raise
    except Exception as exc:  # a decoder's error on a file the analysis read: say why, as the reader does
        raise TraceError(f"cannot read its ops ({type(exc).__name__}: {exc})") from exc
    columns = _self_times(seen)
    comm: dict[str, bool] = {}
    out: dict[str, dict[int | None, OpTable]] = {}
    for stage, steps in stages.items():
        tables: dict[int | None, OpTable] = {}
        cpu = _ranges_for(seen, stage, steps)
        _add_ops(tables, columns, cpu, comm)
        _add_kernels(tables, seen, stage, cpu, comm)
        out[stage] = tables
    return out


def _collective(name: str, known: dict[str, bool]) -> bool:
    found = known.get(name)
    if found is None:
        found = known[name] = COLLECTIVE.match(name) is not None
    return found


def _add_ops(
    tables: dict[int | None, OpTable],
    columns: tuple[list[float], list[float], list[str]],
    cpu: Ranges | None,
    comm: dict[str, bool],
) -> None:
    """The ops that start inside the stage's ranges (all of them without ranges), by the step of their range."""
    starts, selfs, names = columns
    spans = [(0, len(starts), None)] if cpu is None else _slices(starts, cpu)
    for lo, hi, step in spans:
        table = tables.get(step) or tables.setdefault(step, OpTable())
        rows = table.rows
        for k in range(lo, hi):
            row = rows.get(("op", names[k]))
            if row is None:
                row = rows[("op", names[k])] = [0.0, 0.0]
                if _collective(names[k], comm):
                    table.comm.add(("op", names[k]))
            row[0] += selfs[k] / _US_PER_MS
            row[1] += 1


def _add_kernels(
    tables: dict[int | None, OpTable], seen: _Seen, stage: str, cpu: Ranges | None, comm: dict[str, bool]
) -> None:
    """The kernels launched inside the stage (by their launch's correlation; else by their GPU annotation, or
    their own start), by the step of that range."""
    gpu = seen.gpu_ranges.get(stage)
    gpu_ranges: Ranges | None = None
    if gpu and (cpu is None or all(r[2] is None for r in cpu)):  # a GPU annotation says no step
        gpu_ranges = [(lo, hi, None) for lo, hi in zip(*union(gpu), strict=True)]
    cpu_starts = [r[0] for r in cpu] if cpu is not None else []
    gpu_starts = [r[0] for r in gpu_ranges] if gpu_ranges is not None else []
    for name, ts, dur, correlation in seen.kernels:
        step: int | None = None
        if cpu is not None:
            launched = seen.launches.get(correlation) if correlation is not None else None
            if launched is not None:
                inside, step = _step_at(cpu, cpu_starts, launched)
            elif gpu_ranges is not None:
                inside, step = _step_at(gpu_ranges, gpu_starts, ts)
            else:
                inside, step = _step_at(cpu, cpu_starts, ts)
            if not inside:
                continue
        table = tables.get(step) or tables.setdefault(step, OpTable())
        row = table.rows.setdefault(("kernel", name), [0.0, 0.0])
        row[0] += dur / _US_PER_MS
        row[1] += 1
        table.kernel_ms += dur / _US_PER_MS
        if _collective(name, comm):
            table.comm.add(("kernel", name))
            table.kernel_comm_ms += dur / _US_PER_MS


def _slices(starts: list[float], ranges: Ranges) -> list[tuple[int, int, int | None]]:
    """Index ranges of ``starts`` (sorted) inside each of ``ranges``, with its step."""
    return [(bisect.bisect_left(starts, lo), bisect.bisect_right(starts, hi), step) for lo, hi, step in ranges]
