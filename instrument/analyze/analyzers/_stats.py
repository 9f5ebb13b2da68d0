"""A stage across ranks (:func:`across`): its medians, its straggler and by what the ranks were judged;
every stage of a report compared and put in order (:func:`compare`).

Ranks are judged by work when a trace says what work is (time outside CPU-side waits in collectives;
an engine's execution time), else by wall time: a rank waiting in a barrier for a slow peer has as
long a wall time as the peer, so wall time would name a waiter.

A straggler is named only above a floor: a stage whose slowest rank takes under :data:`STRAGGLER_MIN_MS`
(timer noise and scheduling jitter are a good part of it) or under :data:`STRAGGLER_MIN_SHARE` of its step
(whatever its ranks do, it holds the step up little) names none. The slowest rank, not the median: a
stage of 0.1 ms that one rank takes 500 ms over is a straggler worth naming. The stages are ordered by
the time they lose: the straggler's excess over the median, times the ranks that waited for it
(:attr:`StageStats.lost_ms`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from instrument.analyze.model import (
    ENGINE_STAGES,
    GENERATION_STAGES,
    STRAGGLER_MIN_MS,
    STRAGGLER_MIN_SHARE,
    RankStats,
    StageStats,
    label_key,
)

__all__ = ["US_PER_MS", "across", "compare", "step_totals"]

US_PER_MS = 1000.0
_GENERATING = frozenset(label_key(name) for name in GENERATION_STAGES)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _below_floor(longest_ms: float, step_ms: float | None) -> str | None:
    if longest_ms < STRAGGLER_MIN_MS:
        return f"under {STRAGGLER_MIN_MS:g} ms"
    if step_ms is not None and longest_ms < STRAGGLER_MIN_SHARE * step_ms:
        return f"under {100 * STRAGGLER_MIN_SHARE:g}% of its step ({step_ms:,.1f} ms)"
    return None


def across(members: list[RankStats], step_ms: float | None = None) -> StageStats:
    """The ranks of one step x role x stage together (``members`` is sorted in place: by rank).

    ``step_ms``: the step's time, for the floor; ``None``: only the absolute floor applies.
    """
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
    floor = _below_floor(max(walls), step_ms)
    first = members[0]
    return StageStats(
        step=first.step,
        role=first.role,
        stage=first.stage,
        ranks=tuple(members),
        median_ms=median,
        max_ms=max(walls),
        min_ms=min(walls),
        straggler=None if floor else slowest.label,
        straggler_rank=None if floor else slowest.rank,
        ratio=slowest.judged_ms / median_work if median_work > 0 else None,
        minibatch_ms=_median([r.minibatch_ms for r in members]),
        cpu_ms=_median([r.cpu_ms for r in members]),
        kernel_ms=_median(kernels) if kernels else None,
        events=_median([float(r.events) for r in members]),
        judged_by="work" if by_work else "wall",
        median_work_ms=median_work,
        # every other rank waits for the straggler at the next synchronisation: its excess, once per waiter
        lost_ms=0.0 if floor else (slowest.judged_ms - median_work) * (len(members) - 1),
        below_floor=floor,
    )


def _order(stage: StageStats) -> tuple[float, float, int, str, str]:
    step = -1 if stage.step is None else stage.step
    # ties by what the ranks are judged by: an engine's long, idle profiling window is not long work
    return (-stage.lost_ms, -stage.median_work_ms, step, stage.role, stage.stage)


def step_totals(groups: Mapping[Any, list[RankStats]]) -> dict[int | None, float]:
    """Each step's time from its stages: their median wall times added up, each second once. Engine and
    frontend rows (:data:`~instrument.analyze.model.ENGINE_STAGES`) profile the seconds of the stage that
    generates, and each other's: they add only to a step without a generating stage, and then once (the longest)."""
    own: dict[int | None, float] = {}
    generating: set[int | None] = set()
    engines: dict[int | None, float] = {}
    for members in groups.values():
        first = members[0]
        median = _median([r.wall_ms for r in members])
        if first.stage in ENGINE_STAGES:
            engines[first.step] = max(engines.get(first.step, 0.0), median)
            continue
        own[first.step] = own.get(first.step, 0.0) + median
        if label_key(first.stage) in _GENERATING:
            generating.add(first.step)
    steps = own.keys() | engines.keys()
    return {s: own.get(s, 0.0) + (0.0 if s in generating else engines.get(s, 0.0)) for s in steps}


def compare(groups: Mapping[Any, list[RankStats]], profiler_steps: Mapping[int, float]) -> list[StageStats]:
    """Every step x role x stage of ``groups`` compared, the most time lost first (ties: the longest median work).

    ``profiler_steps``: a step's ``ProfilerStep#N`` time (ms, median over ranks) where the traces hold
    one; a step without is as long as its stages' median wall times together (:func:`step_totals`).
    """
    sums = step_totals(groups)
    out = []
    for members in groups.values():
        step = members[0].step
        step_ms = profiler_steps.get(step) if step is not None else None
        out.append(across(members, sums[step] if step_ms is None else step_ms))
    out.sort(key=_order)
    return out
