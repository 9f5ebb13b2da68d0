"""Where a step's time goes across roles: busy and idle per rank, who waited for whom, the critical path,
consistent stragglers and the findings in words (pure: the standard library and instrument.timeline).

Input: spans on one clock (the caller aligns the clocks of different hosts, says how well:
``clock_uncertainty_ns``): a :class:`~instrument.timeline.SpanTable` of columns (what
:func:`~instrument.analyze.traces._timelines.align` gives), or any :class:`~instrument.timeline.Span` values,
packed into one first. Output: a :class:`TimelineReport` whose :meth:`~TimelineReport.to_json`
is the ``timeline`` / ``findings`` contract of ``instrument analyze --json``.

Semantics (where the issue is silent, the choice is marked *chosen*):

- **Lane.** One process in one step: the ``(role, rank)`` of its step span. A stage span joins the lane of
  its own ``(role, rank)``; when that has no step span in the step and exactly one lane at its rank does,
  it joins that one (*chosen*: a fused process naming a stage after another role,
  ``profiled_stage(name, role="critic")``); otherwise it forms a lane of its own whose step extent is its
  stages' extent. Stage time outside its lane's step span is cut off, so busy + idle == the step span.
- **Busy** is the union of the lane's stage spans (nested stages and concurrent threads counted once);
  **idle** is the rest of its step span, as **gaps**. Window spans are accepted and not used.
- **Wall time** of a step: earliest lane start to latest lane end. Unaligned: the longest lane (*chosen*:
  across hosts only durations are known, and the step lasted at least that long).
- **Waited for.** Only top-level stages (not inside another stage of the same lane) are candidates. A gap
  ``[a, b]`` inside or at the head of a step is attributed to the latest-ending stage on *another* lane
  that started before ``b`` and ended within ``[b - uncertainty - tolerance, b + uncertainty]`` and not
  before ``a - uncertainty`` (*chosen*: a stage that ended before the rank went idle was not waited for);
  another role's stage is preferred. A gap at the end of a lane's step (it finished early) is waiting for
  the step to end: while the critical path runs on one other lane from the gap's start on (a slow peer), it
  waits for that lane's last stage there; the rest goes to the latest-ending stage of the step on another
  lane, of any role, that ended after the gap began (*chosen*: two rows at most a lane). Otherwise
  the gap is ``unattributed`` (role and rank null). Ties: the lower lane ``(role, rank)``.
  :data:`WAIT_TOLERANCE_NS` is the hand-off latency allowed between a producer's end and the resume.
- **Critical path** (aligned only), in time order, tiling the step: from the step's end, the top-level stage
  that ended last; inside a lane's busy time, the covering stage that started first; at the start of a
  lane's busy run, what the lane waited for (rule above, the gap before that run) and, on that stage's
  lane, on. Time on the path when no stage ran (before the first stage, after the last one, a hand-off
  latency, an unattributed gap) is a part with stage ``"idle"`` on the lane that was waiting (*chosen*), so
  the parts add up to the wall time exactly (in ns).
- **Roles.** ``busy_ms`` / ``idle_ms`` are rank-time: summed over the role's lanes (*chosen*; ``ranks``
  says how many); ``idle_pct`` = idle / (busy + idle); ``waited_for`` adds the causes by (role, stage).
- **Generation** (*chosen*): a stage named ``generate_sequences`` or ``generate``, or any stage of the role
  ``rollout``. Its share of a step is the union of such stages over all lanes / wall time (unaligned: the
  longest lane's).
- **Stragglers.** A stage's time on a lane is the union of its calls there. On a step, a lane is slow at a
  (role, stage) when its time is >= :data:`~._findings.STRAGGLER_RATIO` x the median of its peers (the other
  lanes with that role and stage in that step) and at least :data:`~._findings.FLOOR_MS` and
  :data:`~._findings.FLOOR_SHARE` of the step. A consistent straggler is slow on more than half of the steps
  where it ran, and on at least 2 of them unless the timeline holds one step (*chosen*: a stage that ran once
  in a long run is not "consistent").
- **Findings**, largest ``lost_ms`` first; ``lost_ms`` is time per step, averaged over all analysed steps
  (*chosen*, so a one-off and a steady loss compare). straggler: one per straggling (role, rank), naming its
  stage with the most excess and how many others (*chosen*: a rank slow in every chunk of generation is one
  finding, not ten); lost: its time over its peers' median on its slow steps; the text says who waited for
  it and how long. bubble: a role whose idle time is >= :data:`~._findings.BUBBLE_MIN_SHARE` of its rank-time (roles
  that never ran a stage, a driver holding the step open, are left out); lost: idle time per rank; the text
  names the main causes. dominant_stage: the (role, stage) with the largest median share of the step
  (critical-path time; unaligned: its longest lane), when >= :data:`~._findings.DOMINANT_MIN_SHARE`; "lost" is its time
  per step. slow_step: the steps >= :data:`~._findings.SLOW_STEP_RATIO` x the median step (with >= 3 steps); lost:
  their time over the median; the text names the stage that grew most on the slowest.
- **Unaligned clocks** (``aligned=False``): per-lane durations only; ``waited_for`` and ``critical_path``
  are empty and ``clock.note`` says so; findings that need no cross-rank timestamps are still made.

JSON: the contract's keys, plus ``clock.note``, ``skipped_spans``, each step's ``generation_ms`` /
``generation_pct``, each role's ``waited_for`` and a bubble's ``waiting_for``; milliseconds rounded to µs.

Cost: linear in the spans but for a sort per lane, per role and per step (no rank is compared with every other:
"what ended as this rank resumed" is a bisection in the step's stage ends, by role; a step's stragglers are found
from the top of each (role, stage)'s sorted peers down, O(1) a peer). The work is over columns
(:mod:`._timeline_step`): index runs by step slice each step's spans out of the files' columns, and a lane of
sequential stages (in the file's order, each ending before the next starts) is indexed by C-level passes over them;
what is still made per span is its ints, one role-index tuple per top-level stage and one loop turn per idle gap
(the waits: a role's gaps at once, summed and sorted once a role and added to the step's table as columns; the
stragglers' finding reads those columns). ``benchmarks/timeline_analysis.py`` at 4,096 ranks x 100 steps x 10
stages (4.5M spans): 19-22 s, 4.2-5.0 µs of CPU a span, ~355 MB peak (the budget: 15 s and 400 MB;
docs/scale.md). Memory: the spans stay columns; one step's lists (one role's waits) are alive at a time, and
each step's result keeps its lanes and their waits as columns (:class:`~instrument.analyze.model.RankTable`).

Two modules: this one (the entry point, the judgement across steps) and :mod:`._timeline_step` (one step: its
spans, lanes, waits, critical path and values); the result values are in :mod:`instrument.analyze.model`.
"""

from __future__ import annotations

import dataclasses
import gc
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from itertools import repeat
from operator import add, itemgetter

from instrument.analyze.analyzers._findings import (
    FLOOR_MS,
    FLOOR_SHARE,
    STRAGGLER_RATIO,
    Peering,
    TimelineAnalysis,
    findings_of,
)
from instrument.analyze.analyzers._timeline_step import (
    IDLE,
    NS_PER_MS,
    UNATTRIBUTED,
    WAIT_TOLERANCE_NS,
    Lane,
    Step,
    StepSpans,
    names_of,
    step_runs,
)
from instrument.analyze.model import ClockInfo, StepTimeline, TimelineReport
from instrument.timeline import Span, SpanColumns, SpanTable

__all__ = ["IDLE", "UNALIGNED_NOTE", "UNATTRIBUTED", "WAIT_TOLERANCE_NS", "analyze_timeline"]

UNALIGNED_NOTE = (
    "Clocks of different hosts are not aligned: busy and idle are per rank, from durations only; "
    "no waits across ranks and no critical path."
)

_Key = tuple[str, int]  # a lane: (role, rank)


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


# --------------------------------------------------------------------------- across steps


def _peer_median(values: list[int], i: int) -> float:
    """The median of the sorted ``values`` without the ``i``-th (non-increasing in ``i``)."""
    m = len(values) - 1

    def others(k: int) -> int:  # the k-th of the values without the i-th
        return values[k] if k < i else values[k + 1]

    if m % 2:
        return float(others(m // 2))
    return (others(m // 2 - 1) + others(m // 2)) / 2


class _Peers:
    """Every (role, stage, lane) across steps: how often it ran (counted per step in C, by number: lane number
    x stages + stage number) and, for the few that were slow, a :class:`Peering` as it was."""

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        self.keys = keys
        self.lanes: dict[_Key, int] = {}  # lane -> its number across steps
        self.ran: Counter[int] = Counter()
        self.slow: dict[int, Peering] = {}

    def judge(self, step: int, wall_ns: int, lanes: list[Lane]) -> None:
        numbers = self.lanes
        stages = len(self.keys)
        rows: list[tuple[int, int, int]] = []  # (stage number, ns, lane index): sorted by stage, ns, then lane
        bases = []
        for lane in lanes:
            number = numbers.setdefault((lane.role, lane.rank), len(numbers))
            bases.append(number * stages)
            by_stage = lane.by_stage
            if by_stage:
                rows.extend(zip(by_stage, by_stage.values(), repeat(lane.index)))
        if not rows:
            return
        rows.sort()
        kids = list(map(_first, rows))
        self.ran.update(map(add, map(bases.__getitem__, map(_third, rows)), kids))
        floor = max(FLOOR_MS * NS_PER_MS, FLOOR_SHARE * wall_ns)
        first, count = 0, len(rows)
        while first < count:
            kid = kids[first]
            past = bisect_right(kids, kid, first)
            if past - first > 1:
                values = list(map(_second, rows[first:past]))
                # A peer's median is non-increasing up the sorted values, its time non-decreasing: the slow ones
                # are the top of them (times are > 0, so are medians), found from the top down.
                for i in range(len(values) - 1, -1, -1):
                    ns, median = values[i], _peer_median(values, i)
                    if not median > 0:
                        continue
                    if not (ns >= floor and ns >= STRAGGLER_RATIO * median):
                        break
                    code = bases[rows[first + i][2]] + kid
                    record = self.slow.get(code)
                    if record is None:
                        self.slow[code] = record = Peering()
                    record.slow_steps.append(step)
                    record.ratios.append(ns / median)
                    record.excesses.append(ns - round(median))
                    record.excess_ns += record.excesses[-1]
            first = past

    def peering(self) -> dict[tuple[str, str, _Key], Peering]:
        lanes = list(self.lanes)
        stages = len(self.keys)
        found = {}
        for code, ran in self.ran.items():
            number, kid = divmod(code, stages)
            role, stage = self.keys[kid]
            record = self.slow.get(code)
            if record is None:
                record = Peering()
            record.ran = ran
            found[(role, stage, lanes[number])] = record
        return found


_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _as_drivers(timeline: StepTimeline, drivers: set[str]) -> StepTimeline:
    roles = {
        name: dataclasses.replace(role, idle_ms=0.0, driver=True) if name in drivers else role
        for name, role in timeline.roles.items()
    }
    return dataclasses.replace(timeline, roles=roles)


def analyze_timeline(
    spans: SpanTable | SpanColumns | Iterable[Span],
    *,
    aligned: bool,
    clock_uncertainty_ns: int = 0,
    wait_tolerance_ns: int = WAIT_TOLERANCE_NS,
) -> TimelineReport:
    """Every step of ``spans`` (any order; columns or Span values), and the findings across them (see the
    module docstring)."""
    if clock_uncertainty_ns < 0 or wait_tolerance_ns < 0:
        raise ValueError(f"uncertainty and tolerance must be >= 0 (got {clock_uncertainty_ns}, {wait_tolerance_ns})")
    # The analysis makes millions of small tuples that live for one step and form no cycle; each pass of the
    # cyclic collector they trigger would rescan every object alive (the report's rows, a caller's spans).
    paused = gc.isenabled()
    gc.disable()
    try:
        return _analyze(SpanTable.of(spans), aligned, clock_uncertainty_ns, wait_tolerance_ns)
    finally:
        if paused:
            gc.enable()


def _analyze(table: SpanTable, aligned: bool, clock_uncertainty_ns: int, wait_tolerance_ns: int) -> TimelineReport:
    names = names_of(table)
    runs = step_runs(table)
    skipped = 0
    unc = clock_uncertainty_ns if aligned else 0
    timelines: list[StepTimeline] = []
    stage_times: list[dict[tuple[str, str], int]] = []
    peers = _Peers(names.keys)
    worked: set[str] = set()  # roles that ran a stage: a driver that only holds the step open has no bubble
    for step in sorted(runs):
        spans = StepSpans(table, names, runs.pop(step))  # one step's rows at a time
        skipped += spans.skipped
        if not spans.windows and not spans.chunks:
            continue  # only windows or bad spans: no step to analyse
        analysis = Step(step, spans, names, aligned, unc, wait_tolerance_ns)
        del spans
        timeline = analysis.result()
        timelines.append(timeline)
        stage_times.append(analysis.stage_time())
        peers.judge(step, analysis.wall, analysis.lanes)
        worked.update(lane.role for lane in analysis.lanes if lane.block_starts)
    clock = ClockInfo(
        aligned=aligned,
        max_uncertainty_ms=_ms(clock_uncertainty_ns) if aligned else None,
        note=None if aligned else UNALIGNED_NOTE,
    )
    drivers = {role for timeline in timelines for role in timeline.roles} - worked
    if drivers:  # a role that ran no stage holds the step open: what it waited on, never its idle
        timelines = [_as_drivers(timeline, drivers) for timeline in timelines]
    steps = tuple(timelines)
    facts = TimelineAnalysis(steps, tuple(stage_times), peers.peering(), frozenset(worked), aligned)
    return TimelineReport(clock, steps, findings_of(facts), skipped)
