"""GPU time per rank, whole trace and per ``ProfilerStep``, as HTA defines it.

Definitions follow HolisticTraceAnalysis 0.5.0 (``get_temporal_breakdown`` and
``get_comm_comp_overlap``), so the figures can be checked against it:

- GPU events: ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events, every stream together.
- span: first GPU event start to last GPU event end; busy: the union of all GPU events;
  idle = span - busy.
- a communication kernel's name matches ``^nccl.*Kernel``; a memory one is a memcpy / memset event
  (or a name starting ``Memcpy`` / ``Memset`` / ``dma``); compute is every other kernel except names
  containing ``Memcpy`` or ``Sync`` (HTA's "other"). compute / communication / memory are the unions
  of their kinds; non_compute = busy - compute.
- comm/compute overlap %: time where communication and compute both run, as a % of communication.
- step N: the GPU events whose launching CPU event (same ``args.correlation``) starts inside the
  ``ProfilerStep#N`` range (start inclusive, end exclusive).

The whole-trace row is HTA's with ``include_last_profiler_step=True``: with two steps or more, the
GPU events launched by the end of the last step (HTA's default also leaves out the last step, which
has its own row here); with fewer, every GPU event.

Events are fed one at a time (:meth:`GpuAccumulator.add`); memory is 37 bytes a GPU event and a
dict entry or two per launch, so bounded by the file being read. The kernels by name, the idle-time
split and the launch delays are taken from the same events (:mod:`._kernels`).
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPU_CATS",
    "KINDS",
    "LAUNCH_APIS",
    "LAUNCH_CATS",
    "GpuAccumulator",
    "GpuRow",
    "GpuTimes",
    "is_profiler_step",
]

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Event categories that are work on the GPU."""
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
"""Host events that launch GPU work; their ``args.correlation`` names the GPU event."""
LAUNCH_APIS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"})
"""The launches whose delay is measured, as HTA's ``get_cuda_kernel_launch_stats`` takes them (not graphs)."""

_COMPUTE, _COMM, _MEMORY, _OTHER = 0, 1, 2, 3
KINDS = ("compute", "communication", "memory", "other")
"""The kinds' names, by their number."""
# HTA's own three patterns (hta/utils/utils.py), matched at the start of the name like re.match.
_COMM_NAME = re.compile(r"nccl.*Kernel")
_MEMORY_NAME = re.compile(r"Memcpy|Memset|dma")
_OTHER_NAME = re.compile(r".*Memcpy|.*Sync")
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def is_profiler_step(name: str) -> int | None:
    """``N`` for a ``ProfilerStep#N`` name, else ``None``."""
    match = _STEP.match(name)
    return int(match[1]) if match else None


def _kind(name: str, cat: str) -> int:
    if _COMM_NAME.match(name):
        return _COMM
    if cat != "kernel" or _MEMORY_NAME.match(name):
        return _MEMORY
    if _OTHER_NAME.match(name):
        return _OTHER
    return _COMPUTE


@dataclass
class GpuTimes:
    """Lengths in microseconds; ``overlap_us``: comm and compute both running. Sums are exact for disjoint times."""

    first: float
    last: float
    busy_us: float
    compute_us: float
    communication_us: float
    memory_us: float
    overlap_us: float

    @property
    def span_us(self) -> float:
        """First GPU event start to last GPU event end."""
        return self.last - self.first

    def add(self, other: GpuTimes) -> None:
        """Fold in the times of another file of the same rank (the SDK writes one per stage)."""
        self.first = min(self.first, other.first)
        self.last = max(self.last, other.last)
        self.busy_us += other.busy_us
        self.compute_us += other.compute_us
        self.communication_us += other.communication_us
        self.memory_us += other.memory_us
        self.overlap_us += other.overlap_us

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields of a ``gpu`` row, less rank and step."""
        span = self.span_us
        busy = min(self.busy_us, span)  # files of one rank that overlap in time would count twice
        comm = self.communication_us
        return {
            "span_us": round(span, 3),
            "busy_us": round(busy, 3),
            "idle_us": round(span - busy, 3),
            "compute_us": round(self.compute_us, 3),
            "non_compute_us": round(max(0.0, busy - self.compute_us), 3),
            "communication_us": round(comm, 3),
            "memory_us": round(self.memory_us, 3),
            "comm_comp_overlap_pct": round(100.0 * self.overlap_us / comm, 2) if comm > 0 else None,
        }


@dataclass(frozen=True)
class GpuRow:
    """One file's GPU times: the whole trace (``step=None``) or one ``ProfilerStep``."""

    step: int | None
    times: GpuTimes


def _union(starts: list[float], ends: list[float]) -> float:
    """Length of the union of intervals given as starts and ends each sorted on its own.

    With both sorted, the union has a gap after ``ends[k]`` exactly when ``starts[k+1] > ends[k]``
    (k+1 intervals have started and k+1 have ended then); no (start, end) pairs need building.
    """
    if not starts:
        return 0.0
    gaps = 0.0
    for k in range(len(starts) - 1):
        gap = starts[k + 1] - ends[k]
        if gap > 0:
            gaps += gap
    return ends[-1] - starts[0] - gaps


def _times(ts: array[float], end: array[float], kinds: bytes | array[int], pick: list[int] | None) -> GpuTimes:
    """The figures of the events at indices ``pick`` (every event when ``None``)."""
    idx = range(len(ts)) if pick is None else pick
    by_kind: dict[int, tuple[list[float], list[float]]] = {k: ([], []) for k in (_COMPUTE, _COMM, _MEMORY, _OTHER)}
    for i in idx:
        starts, ends = by_kind[kinds[i]]
        starts.append(ts[i])
        ends.append(end[i])
    for starts, ends in by_kind.values():
        starts.sort()
        ends.sort()
    comp, comm, mem, other = (by_kind[k] for k in (_COMPUTE, _COMM, _MEMORY, _OTHER))
    all_s = sorted(comp[0] + comm[0] + mem[0] + other[0])
    all_e = sorted(comp[1] + comm[1] + mem[1] + other[1])
    compute_us, comm_us = _union(*comp), _union(*comm)
    # Both running (HTA's overlap) = |comm| + |compute| - |comm or compute|.
    both = _union(sorted(comp[0] + comm[0]), sorted(comp[1] + comm[1]))
    return GpuTimes(
        first=all_s[0],
        last=all_e[-1],
        busy_us=_union(all_s, all_e),
        compute_us=compute_us,
        communication_us=comm_us,
        memory_us=_union(*mem),
        overlap_us=max(0.0, compute_us + comm_us - both),
    )


class GpuAccumulator:
    """Takes one file's events; :meth:`rows` gives its whole-trace row and one row per step."""

    def __init__(self) -> None:
        self.ts = array("d")
        self.end = array("d")
        self.kinds = array("b")
        self.corr = array("q")  # the GPU event's correlation id, -1 without one
        self.stream = array("q")  # its args.stream, -1 without one
        self.name = array("l")  # its name, as an index into names
        self.names: list[str] = []
        self.launches: dict[int, float] = {}  # correlation id -> launch start
        self.launch_ends: dict[int, float] = {}  # correlation id -> launch end, for LAUNCH_APIS only
        self.steps: list[tuple[float, float, int]] = []  # start, end, N
        self._kind_of: dict[tuple[str, str], tuple[int, int]] = {}  # (name, cat) -> kind, name index

    def add(self, ev: dict[str, Any], cat: str, ts: float, end: float) -> None:
        """One ``X`` event of category ``cat``; anything but GPU work, launches and steps is ignored."""
        if cat in GPU_CATS:
            if end < ts:  # a negative duration would break the union; HTA has none either
                return
            name = ev.get("name")
            key = (name if isinstance(name, str) else "", cat)
            known = self._kind_of.get(key)
            if known is None:
                known = self._kind_of[key] = (_kind(*key), len(self.names))
                self.names.append(key[0])
            args = ev.get("args")
            stream = args.get("stream") if isinstance(args, dict) else None
            self.ts.append(ts)
            self.end.append(end)
            self.kinds.append(known[0])
            self.name.append(known[1])
            self.corr.append(_correlation(ev))
            self.stream.append(_id(stream))
        elif cat in LAUNCH_CATS:
            corr = _correlation(ev)
            if corr > 0 and corr not in self.launches:
                self.launches[corr] = ts
                if ev.get("name") in LAUNCH_APIS:
                    self.launch_ends[corr] = end

    def add_step(self, number: int, ts: float, end: float) -> None:
        """A ``ProfilerStep#number`` range."""
        self.steps.append((ts, end, number))

    def rows(self) -> list[GpuRow]:
        """No rows without GPU events; else the whole trace, then each step with GPU events."""
        if not self.ts:
            return []
        rows = [GpuRow(None, _times(self.ts, self.end, self.kinds, self.whole()))]
        picks = self._per_step()
        for number in sorted(picks):
            rows.append(GpuRow(number, _times(self.ts, self.end, self.kinds, picks[number])))
        return rows

    def whole(self) -> list[int] | None:
        """Every GPU event, or with two steps or more (as HTA) those launched by the end of the last."""
        if len(self.steps) < 2:
            return None
        last_end = max(end for _, end, _ in self.steps)
        launches = self.launches
        pick = [i for i, corr in enumerate(self.corr) if launches.get(corr, last_end + 1) <= last_end]
        return pick or None  # no launch recorded at all: the GPU events are all there is

    def _per_step(self) -> dict[int, list[int]]:
        steps = sorted(self.steps)
        if not steps:
            return {}
        starts = [s for s, _, _ in steps]
        picks: dict[int, list[int]] = {}
        launches = self.launches
        for i, corr in enumerate(self.corr):
            launched = launches.get(corr) if corr > 0 else None
            if launched is None:
                continue
            # The step that started last before the launch; steps do not overlap.
            k = bisect.bisect_right(starts, launched) - 1
            if k >= 0 and launched < steps[k][1]:
                picks.setdefault(steps[k][2], []).append(i)
        return picks


_INT64 = 1 << 63


def _id(value: Any) -> int:
    """An id field as the arrays hold it: -1 unless an int they can (a hostile file may write anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64 else -1


def _correlation(ev: dict[str, Any]) -> int:
    args = ev.get("args")
    return _id(args.get("correlation")) if isinstance(args, dict) else -1
