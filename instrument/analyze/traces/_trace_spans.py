"""The step timeline from traces, for a run that wrote no timeline file (:class:`TraceSpans`).

What the scanner already took from each trace (:class:`~._reader.FileScan`: its ``ProfilerStep#N``
ranges, the stage ranges its segments measure, its first and last event) becomes
:class:`~instrument.timeline.Span` values, one :class:`~instrument.timeline.Timeline` per process, which
the timeline analysis reads as it reads timeline files. No file is read a second time.

- **Steps.** A ``ProfilerStep#N`` range is step ``N``. A file that is one step and holds its stages
  (continuous SDK traces, verl's whole-step traces) spans that step from its first event to its last
  (the profiler ran the whole step). A file of one stage (discrete SDK traces) says nothing of its
  step's bounds: a process's step is then taken to last from the first to the last stage of that step
  on any process of its host (*chosen*: in a synchronous RL loop every rank is in the same step, and a
  rank idle before its first stage or after its last is idle in the step).
- **Stages.** The ranges the stage table measures: the outermost user annotations given to a step (in a
  file of one step, that step), a discrete trace's stage range, a window trace's mini-batches as one range;
  each without the time its CPU waited in a collective (the stage table's work): a rank waiting for a slower
  one is idle then, and the wait goes to whoever it waited for.
- **Who.** Role and rank as the analysis gives them (name, manifest, ``distributedInfo``; no role at all:
  :data:`WORKER_ROLE`); a file with no
  rank (a single process's plain trace) gets a rank after the known ones, one per file name's worker.
  One process is one lane, as in timeline files: the files of one pid (named in SDK trace names) are
  one process whatever their stages' roles (a fused worker's ``role="critic"`` stages are its own), and
  its role is the one most of its stages have (a process with no pid in its names: one per role).
  Rollout engine and frontend traces are left out: they hold engine iterations, not the run's stages.
- **Clocks.** Kineto writes an event's ``ts`` in µs after the header's ``baseTimeNanoseconds`` (ns of the
  wall clock; absent in older traces: ``ts`` is then the time itself), and the host before the events
  (``host_name``). Traces of one host share its clock; another host's are not aligned to it (no estimate
  of the offset is recorded in a trace), so the analysis keeps to durations there. A range no clock could
  give (not finite, past a signed 64-bit ns) and a step past a u32 (what timeline files hold) are left out.

Only what was traced is there: the profiled steps and ranks, the traced stages (:data:`FROM_TRACES_NOTE`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instrument import naming
from instrument.analyze.model import TraceFile
from instrument.analyze.traces._reader import FileScan
from instrument.timeline import Span, SpanColumns, Timeline

__all__ = ["FROM_TRACES_NOTE", "NO_STEP_RANGES", "WORKER_ROLE", "TraceSpans"]

FROM_TRACES_NOTE = (
    "from traces (the run wrote no timeline file): only the traced steps, ranks and stages are in it, "
    "and idle time is time no traced stage ran"
)
NO_STEP_RANGES = (
    "its traces hold no step range with a stage range in it to build one from "
    "(a ProfilerStep#N range, or an SDK trace's step, and a record_function or SDK stage inside)"
)
WORKER_ROLE = "worker"
"""The role of a process whose traces name none (plain torch.profiler traces): torch's word for such a process."""
_UNNAMED = "unknown"  # what discovery calls a trace whose name and manifest give no role
_ENGINE_STAGES = frozenset({"engine", "frontend"})
_UNKNOWN_HOST = ""
_MAX_STEP = 1 << 32
_MAX_NS = 1 << 62  # what a signed 64-bit column holds, with room for the differences taken from it
_MAX_US = _MAX_NS / 1000


@dataclass
class _Process:
    """The spans of one process so far, on its host's clock (ns)."""

    role: str
    rank: int | None
    worker: str | None
    host: str
    pid: int
    world_size: int
    path: str
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> its measured range
    stages: list[tuple[str, str, int, int, int]] = field(default_factory=list)  # role, name, step, start, end

    def main_role(self) -> str:
        """The role most of its stages have (ties: by name); a fused worker is named after its own role; a trace
        that names none (a plain torch.profiler trace) is torch's ``worker``, never "unknown"."""
        counts: dict[str, int] = {}
        for role, *_ in self.stages:
            counts[role] = counts.get(role, 0) + 1
        return min(counts, key=lambda role: (-counts[role], role)) if counts else self.role


def _role(trace: TraceFile) -> str:
    return WORKER_ROLE if trace.role == _UNNAMED else trace.role


def _base_ns(header: dict[str, Any]) -> int:
    base = header.get("baseTimeNanoseconds")
    return base if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < _MAX_NS else 0


def _step(step: int | None) -> bool:
    """A step a timeline can hold (a u32, as timeline files write it)."""
    return step is not None and 0 <= step < _MAX_STEP


def _range(base: int, start_us: float, end_us: float) -> tuple[int, int] | None:
    """``(start, end)`` in ns on the host's clock; ``None`` for a range no clock could give (forged)."""
    # bounded before it is scaled: 1e306 µs is finite, its ns are not, and round() of them raises
    if not -_MAX_US < start_us <= end_us < _MAX_US:  # False for NaN too
        return None
    start, end = base + round(start_us * 1000), base + round(end_us * 1000)
    return (start, end) if start > -_MAX_NS and end < _MAX_NS else None


def _host(header: dict[str, Any], path: str) -> str:
    host = header.get("host_name")
    if isinstance(host, str) and host.isprintable():
        return host
    parsed = naming.parse_trace_name(Path(path).name)
    return parsed.host if parsed is not None else _UNKNOWN_HOST


def _pid(path: str) -> int:
    parsed = naming.parse_trace_name(Path(path).name)
    return parsed.pid if parsed is not None else 0


class TraceSpans:
    """Collects each read trace's step and stage ranges (:meth:`add`); :meth:`timelines` puts them together."""

    def __init__(self) -> None:
        self._processes: dict[tuple[str, int | str, int | str | None], _Process] = {}  # host, pid or role, who
        self.traces = 0
        """Trace files added (engine and frontend traces included)."""

    def add(self, trace: TraceFile, scan: FileScan) -> None:
        """Keep the ranges of one read file (a few per step: never its events)."""
        self.traces += 1
        if trace.source == "engine" or trace.stage in _ENGINE_STAGES:
            return
        if not scan.stage_ranges and not scan.step_ranges:
            return
        base = _base_ns(scan.header)
        host = _host(scan.header, trace.path)
        who: int | str | None = trace.rank if trace.rank is not None else trace.worker
        pid = _pid(trace.path)
        role = _role(trace)
        key = (host, pid or role, who)
        process = self._processes.get(key)
        if process is None:
            process = self._processes[key] = _Process(
                role, trace.rank, trace.worker, host, pid, trace.world_size or 0, trace.path
            )

        for number, start, end in scan.step_ranges:
            if _step(number) and (kept := _range(base, start, end)) is not None:
                process.steps[number] = kept
        # a file that is its step: the profiler ran from its start to its end
        whole = not scan.step_ranges and (trace.continuous or trace.inside) and scan.extent is not None
        if whole and trace.step is not None and _step(trace.step) and scan.extent is not None:
            kept = _range(base, *scan.extent)
            if kept is not None:
                process.steps[trace.step] = kept
        waits = scan.blocked
        for name, inside, start, end in scan.stage_ranges:
            step = trace.step if inside is None else inside
            if step is None or not _step(step):
                continue
            for lo, hi in _working(start, end, waits):
                if (kept := _range(base, lo, hi)) is not None:
                    process.stages.append((role, name, step, *kept))

    def steps(self) -> set[int]:
        """The steps a read trace holds (a step range, or a stage range in it)."""
        return {step for p in self._processes.values() for step in p.steps} | {
            stage[2] for p in self._processes.values() for stage in p.stages
        }

    def timelines(self) -> list[Timeline]:
        """One timeline per process, with the steps that hold a traced stage; empty when none does."""
        processes = [p for p in self._processes.values() if p.stages]
        if not processes:
            return []
        _apart(processes)
        known = [p.rank for p in processes if p.rank is not None]
        spare = iter(range(max(known, default=-1) + 1, 1 << 31))
        ranks = {id(p): p.rank if p.rank is not None else next(spare) for p in sorted(processes, key=_order)}
        # a step whose bounds no trace of a process measured: its host's first to last traced range of it
        reach: dict[tuple[str, int], tuple[int, int]] = {}
        for p in processes:
            for _, _, step, start, end in p.stages:
                _widen(reach, (p.host, step), start, end)
        for p in processes:  # only steps in which some process of the host ran a traced stage
            for step, (start, end) in p.steps.items():
                if (p.host, step) in reach:
                    _widen(reach, (p.host, step), start, end)
        out = []
        for p in sorted(processes, key=_order):
            rank, role = ranks[id(p)], p.main_role()
            ran = {step for _, _, step, _, _ in p.stages} | {step for step in p.steps if (p.host, step) in reach}
            steps = {step: p.steps.get(step) or reach[(p.host, step)] for step in ran}
            spans = [Span("step", role, "", step, rank, lo, hi) for step, (lo, hi) in sorted(steps.items())]
            stages = sorted(p.stages, key=_start)
            spans.extend(Span("stage", own, name, step, rank, lo, hi) for own, name, step, lo, hi in stages)
            out.append(
                Timeline(
                    path=p.path,
                    role=role,
                    rank=rank,
                    world_size=p.world_size,
                    host=p.host,
                    pid=p.pid,
                    mono_origin_ns=0,
                    wall_origin_ns=0,
                    spans=SpanColumns.of(spans, rank),
                )
            )
        return out


def _working(start: float, end: float, waits: tuple[list[float], list[float]]) -> list[tuple[float, float]]:
    """``[start, end]`` without the collective waits inside it (the pieces its CPU worked in): a rank waiting for a
    slower one is idle there, and a stage is judged by its work, as the stage table judges it."""
    starts, ends = waits
    i = bisect.bisect_right(ends, start)
    if i >= len(starts) or starts[i] >= end:
        return [(start, end)]
    pieces = []
    at = start
    while i < len(starts) and starts[i] < end:
        if starts[i] > at:
            pieces.append((at, starts[i]))
        at = max(at, ends[i])
        i += 1
    if at < end:
        pieces.append((at, end))
    return pieces


def _apart(processes: list[_Process]) -> None:
    """Processes of no known host share a clock only when their traced times overlap: traces of one job do, and
    traces of different jobs days apart (HTA's trace_diff pair) are put on hosts of their own (never aligned)."""
    groups: list[list[int]] = []  # [first ns, last ns] of each group of unnamed hosts
    for p in sorted((p for p in processes if p.host == _UNKNOWN_HOST), key=_first_ns):
        lo, hi = _first_ns(p), max(end for *_, end in p.stages)
        n = next((i for i, (a, b) in enumerate(groups) if lo <= b and a <= hi), len(groups))
        if n == len(groups):
            groups.append([lo, hi])
        else:
            groups[n] = [min(groups[n][0], lo), max(groups[n][1], hi)]
        if n:
            p.host = f"{_UNKNOWN_HOST}#{n + 1}"


def _first_ns(p: _Process) -> int:
    return min(start for *_, start, _ in p.stages)


def _order(p: _Process) -> tuple[int, int, str, str]:
    return (p.rank is None, -1 if p.rank is None else p.rank, p.worker or "", p.role)


def _start(stage: tuple[str, str, int, int, int]) -> tuple[int, int]:
    return stage[3], -stage[4]


def _widen(reach: dict[tuple[str, int], tuple[int, int]], key: tuple[str, int], start: int, end: int) -> None:
    held = reach.get(key)
    reach[key] = (start, end) if held is None else (min(held[0], start), max(held[1], end))
