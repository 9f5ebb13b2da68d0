"""A stage across ranks (:func:`across`): its medians, its straggler and by what the ranks were judged.

:func:`across` names the straggler. Ranks are judged by work when a trace says what work is (time
outside collectives; an engine's execution time), else by wall time: a rank waiting in a barrier for
a slow peer has as long a wall time as the peer, so wall time would name a waiter.
"""

from __future__ import annotations

import statistics

from instrument.analyze._model import RankStats, StageStats

__all__ = ["US_PER_MS", "across"]

US_PER_MS = 1000.0


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def across(members: list[RankStats]) -> StageStats:
    """The ranks of one step x role x stage together (``members`` is sorted in place: by rank)."""
    members.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else r.replica or 0, r.worker or ""))
    walls = [r.wall_ms for r in members]
    median = _median(walls)
    # Judged by work: a rank that waits in a collective for a slow peer has a long wall time too, so
    # the slow one is the rank with the most time outside collectives (an engine: its execution time).
    works = [r.judged_ms for r in members]
    median_work = _median(works)
    slowest = max(members, key=lambda r: r.judged_ms)  # max keeps the first of equals: the lowest rank
    by_work = any(r.work_ms is not None for r in members)
    kernels = [r.kernel_ms for r in members if r.kernel_ms is not None]
    first = members[0]
    return StageStats(
        step=first.step,
        role=first.role,
        stage=first.stage,
        ranks=tuple(members),
        median_ms=median,
        max_ms=max(walls),
        min_ms=min(walls),
        straggler=slowest.label,
        straggler_rank=slowest.rank,
        ratio=slowest.judged_ms / median_work if median_work > 0 else None,
        minibatch_ms=_median([r.minibatch_ms for r in members]),
        cpu_ms=_median([r.cpu_ms for r in members]),
        kernel_ms=_median(kernels) if kernels else None,
        events=_median([float(r.events) for r in members]),
        judged_by="work" if by_work else "wall",
        median_work_ms=median_work,
    )
