"""The next GPU questions, per rank over the whole trace, as HolisticTraceAnalysis 0.5.0 answers them:
which kernels take the time, why the GPU sat idle, and how long launches wait.

- **kernels** (HTA's ``get_gpu_kernel_breakdown``): every GPU event (kernel, memcpy, memset) by name:
  count, total (sum of durations) and mean; by type (:data:`~._gpu.KINDS`, HTA's classes) the same
  sums. A share is of the sum of every GPU event's duration, so the shares add up to 100%.
- **idle split** (``get_idle_time_breakdown``): on each stream, events in start order; the gap before
  each one (its start minus the previous event's end) is *host wait* when its launch began after the
  previous event ended (the CPU had not queued it yet), else *kernel wait* when the gap is under
  :data:`KERNEL_WAIT_MAX_US`, else *other* (e.g. waiting on an event from another stream). Summed over
  streams, so it can exceed the ``gpu`` row's idle (time no stream runs anything).
- **launch delay** (``get_cuda_kernel_launch_stats``): GPU start minus the end of its launch
  (:data:`~._gpu.LAUNCH_APIS`, matched by ``args.correlation``), 0 when negative; median and p95.

The events are those of the ``gpu`` row of the whole trace (:meth:`~._gpu.GpuAccumulator.whole`).
A rank written as several files (one per stage) adds its files up (:meth:`KernelTimes.add`).
"""

from __future__ import annotations

import itertools
import statistics
from array import array
from dataclasses import dataclass, field
from typing import Any

from instrument.analyze.traces._gpu import KINDS, GpuAccumulator

__all__ = ["KERNEL_WAIT_MAX_US", "TOP_KERNELS", "KernelTimes", "kernel_times"]

KERNEL_WAIT_MAX_US = 30.0
"""A gap between two events of a stream shorter than this is kernel wait (HTA's ``consecutive_kernel_delay``)."""
TOP_KERNELS = 10
"""Kernels listed per rank, by total time."""

_HOST, _KERNEL, _OTHER = 0, 1, 2


@dataclass
class KernelTimes:
    """One rank's GPU events by name, its idle gaps by stream and cause, and its launch delays (µs)."""

    by_name: dict[str, list[float]] = field(default_factory=dict)
    """name -> [kind, count, total]."""
    idle: dict[int, list[float]] = field(default_factory=dict)
    """stream -> [host wait, kernel wait, other]."""
    delays: array[float] = field(default_factory=lambda: array("d"))

    def add(self, other: KernelTimes) -> None:
        """Fold in another file of the same rank."""
        for name, (kind, count, total) in other.by_name.items():
            held = self.by_name.setdefault(name, [kind, 0.0, 0.0])
            held[1] += count
            held[2] += total
        for stream, parts in other.idle.items():
            held = self.idle.setdefault(stream, [0.0, 0.0, 0.0])
            for i, value in enumerate(parts):
                held[i] += value
        self.delays.extend(other.delays)

    def kernels_row(self, rank: int | None) -> dict[str, Any]:
        """The ``gpu_kernels`` row of the JSON."""
        total = sum(t for _, _, t in self.by_name.values())
        by_type = {kind: {"count": 0, "total_us": 0.0, "share_pct": 0.0} for kind in KINDS}
        for kind, count, spent in self.by_name.values():
            entry = by_type[KINDS[int(kind)]]
            entry["count"] += int(count)
            entry["total_us"] += spent
        for entry in by_type.values():
            entry["share_pct"] = _pct(entry["total_us"], total)
            entry["total_us"] = round(entry["total_us"], 3)
        ranked = sorted(self.by_name.items(), key=lambda item: (-item[1][2], item[0]))[:TOP_KERNELS]
        top = [
            {
                "name": name,
                "type": KINDS[int(kind)],
                "count": int(count),
                "total_us": round(spent, 3),
                "mean_us": round(spent / count, 3),
                "share_pct": _pct(spent, total),
            }
            for name, (kind, count, spent) in ranked
        ]
        delays = sorted(self.delays)
        return {
            "rank": rank,
            "events": int(sum(c for _, c, _ in self.by_name.values())),
            "total_us": round(total, 3),
            "by_type": by_type,
            "top": top,
            "launch_delay_us": {
                "count": len(delays),
                "median": round(statistics.median(delays), 3) if delays else None,
                "p95": round(_p95(delays), 3) if delays else None,
            },
        }

    def idle_row(self, rank: int | None) -> dict[str, Any]:
        """The ``gpu_idle`` row of the JSON."""
        sums = [sum(parts[i] for parts in self.idle.values()) for i in (_HOST, _KERNEL, _OTHER)]
        idle = sum(sums)
        streams = [
            {
                "stream": stream,
                "idle_us": round(sum(parts), 3),
                "host_wait_us": round(parts[_HOST], 3),
                "kernel_wait_us": round(parts[_KERNEL], 3),
                "other_us": round(parts[_OTHER], 3),
            }
            for stream, parts in sorted(self.idle.items())
        ]
        return {
            "rank": rank,
            "idle_us": round(idle, 3),
            "host_wait_us": round(sums[_HOST], 3),
            "kernel_wait_us": round(sums[_KERNEL], 3),
            "other_us": round(sums[_OTHER], 3),
            "host_wait_pct": _pct(sums[_HOST], idle),
            "kernel_wait_pct": _pct(sums[_KERNEL], idle),
            "other_pct": _pct(sums[_OTHER], idle),
            "streams": streams,
        }


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def _p95(ordered: list[float]) -> float:
    """The 95th percentile, interpolated between the two nearest values (numpy's and pandas' default)."""
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=20, method="inclusive")[-1]


def kernel_times(acc: GpuAccumulator) -> KernelTimes | None:
    """The whole trace's kernels, idle split and launch delays; ``None`` without GPU events."""
    if not acc.ts:
        return None
    pick = acc.whole()
    picked = range(len(acc.ts)) if pick is None else pick
    ts, end, names, kinds = acc.ts, acc.end, acc.names, acc.kinds
    out = KernelTimes()
    by_index: dict[int, list[float]] = {}
    per_stream: dict[int, list[int]] = {}
    launches, launch_ends = acc.launches, acc.launch_ends
    for i in picked:
        held = by_index.get(acc.name[i])
        if held is None:
            held = by_index[acc.name[i]] = [float(kinds[i]), 0.0, 0.0]
        held[1] += 1
        held[2] += end[i] - ts[i]
        per_stream.setdefault(acc.stream[i], []).append(i)
        launched = launch_ends.get(acc.corr[i])
        if launched is not None:
            out.delays.append(max(0.0, ts[i] - launched))
    for k, (kind, count, spent) in by_index.items():  # one name in two categories: one entry
        held = out.by_name.setdefault(names[k], [kind, 0.0, 0.0])
        held[1] += count
        held[2] += spent
    for stream, members in per_stream.items():
        members.sort(key=ts.__getitem__)
        parts = out.idle[stream] = [0.0, 0.0, 0.0]
        for before, i in itertools.pairwise(members):
            previous_end = end[before]
            gap = ts[i] - previous_end
            launched = launches.get(acc.corr[i])
            if launched is not None and launched > previous_end:
                parts[_HOST] += gap
            elif gap < KERNEL_WAIT_MAX_US:
                parts[_KERNEL] += gap
            else:
                parts[_OTHER] += gap
    return out
