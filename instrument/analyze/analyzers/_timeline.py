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
  another role's stage is preferred. A gap at the end of a lane's step (it finished early) goes to the
  latest-ending stage of the step on another lane, of any role, that ended after the gap began. Otherwise
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
Cost: linear in the spans but for a sort per lane and per role (no rank is compared with every other:
"what ended as this rank resumed" is a bisection in the step's stage ends, by role). Memory: the spans stay
columns; one step's worth of them is made into objects at a time (index runs by step find them), and each
step's result keeps its lanes and their waits as columns (:class:`~instrument.analyze.model.RankTable`).

One module of ~730 lines, on purpose: the step analysis, the judgement across steps and the words share
private index types (lanes, the per-role end index); the result values are in :mod:`instrument.analyze.model`,
and the rulers mark where it would split (one step, across steps, words).
"""

from __future__ import annotations

import gc
from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from instrument.analyze.analyzers._findings import (
    FLOOR_MS,
    FLOOR_SHARE,
    GENERATION_ROLE,
    STRAGGLER_RATIO,
    Peering,
    TimelineAnalysis,
    findings_of,
)
from instrument.analyze.model import (
    GENERATION_STAGES,
    ClockInfo,
    RankTable,
    RoleTimeline,
    StepTimeline,
    TimelineReport,
    TimeShare,
    WaitRow,
)
from instrument.timeline import Span, SpanColumns, SpanTable

__all__ = ["IDLE", "UNALIGNED_NOTE", "UNATTRIBUTED", "WAIT_TOLERANCE_NS", "analyze_timeline"]

NS_PER_MS = 1_000_000
WAIT_TOLERANCE_NS = 50_000_000  # a collective's release, an RPC or a Ray object fetch, on a busy host
IDLE = "idle"
UNATTRIBUTED = "unattributed"
UNALIGNED_NOTE = (
    "Clocks of different hosts are not aligned: busy and idle are per rank, from durations only; "
    "no waits across ranks and no critical path."
)

_Key = tuple[str, int]  # a lane: (role, rank)


class _Row(NamedTuple):
    """A stage span while its step is analysed: :class:`Span`'s fields in its order, so it sorts as a Span
    does; a tuple, as it is made for every stage of every step."""

    kind: str
    role: str
    stage: str
    step: int
    rank: int
    start_ns: int
    end_ns: int
    thread: int


_Top = tuple[int, int, _Row]  # a top-level stage, clipped to its lane: (start, end, span)
# A stage in the per-role index, sorted so that the one preferred on a tie comes last:
# (end, -lane index, -start, -thread, start, lane index, span).
_Ended = tuple[int, int, int, int, int, int, _Row]
_new_row = tuple.__new__  # a _Row without the keyword handling of its constructor
_FAR = 1 << 62  # later than any clock (ns)


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


def _round(value: float) -> float:
    return round(value, 3)


# --------------------------------------------------------------------------- one step


class _Lane:
    """One process in one step, while it is analysed (mutable scratch; the result is a RankTimeline)."""

    __slots__ = ("blocks", "busy", "by_stage", "end", "generation", "index", "rank", "role", "start", "top_ends")

    def __init__(self, key: _Key, index: int, start: int, end: int) -> None:
        self.role, self.rank = key
        self.index = index
        self.start = start
        self.end = end
        self.blocks: list[tuple[int, int]] = []  # busy runs: the merged top-level stages
        self.top_ends: list[int] = []  # the ends of its top-level stages: ascending, as their starts are
        self.busy = 0
        self.by_stage: dict[tuple[str, str], int] = {}  # (role, stage) -> ns, the union of its calls
        self.generation = 0


class _Step:
    """The analysis of one step; :meth:`result` builds the step's values once the lanes are indexed."""

    def __init__(
        self,
        step: int,
        step_spans: dict[_Key, list[int]],
        stage_spans: list[_Row],
        aligned: bool,
        uncertainty: int,
        tolerance: int,
    ) -> None:
        self.step = step
        self.aligned = aligned
        self.uncertainty = uncertainty
        self.tolerance = tolerance
        self.path: list[tuple[str, str, int, int]] = []  # the critical path: (role, stage, rank, ns)
        self.wall = 0
        members = self._assign(step_spans, stage_spans)
        self.lanes: list[_Lane] = []
        self.tops: list[list[_Top]] = []
        by_role: dict[str, list[_Ended]] = defaultdict(list)
        self.generation_runs: list[tuple[int, int]] = []
        for index, key in enumerate(sorted(members)):
            spans = members[key]
            window = step_spans.get(key)
            if window is not None:
                start, end = window
            else:
                start, end = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
            lane = _Lane(key, index, start, end)
            self.tops.append(self._index_lane(lane, spans, by_role[lane.role] if aligned else None))
            self.lanes.append(lane)
        self.by_role: dict[str, list[_Ended]] = {}
        self.ends_by_role: dict[str, list[int]] = {}
        for role in sorted(by_role):
            entries = sorted(by_role[role])  # unique on the first four: the span is never compared
            self.by_role[role] = entries
            self.ends_by_role[role] = [e[0] for e in entries]

    @staticmethod
    def _assign(step_spans: dict[_Key, list[int]], stage_spans: list[_Row]) -> dict[_Key, list[_Row]]:
        members: dict[_Key, list[_Row]] = {key: [] for key in step_spans}
        owners: dict[int, list[_Key]] = defaultdict(list)
        for key in step_spans:
            owners[key[1]].append(key)
        for span in stage_spans:
            key = (span.role, span.rank)
            if key not in step_spans:
                at_rank = owners.get(span.rank)
                if at_rank is not None and len(at_rank) == 1:
                    key = at_rank[0]  # a fused process naming this stage after another role
            group = members.get(key)
            if group is None:
                members[key] = group = []
            group.append(span)
        return members

    def _index_lane(self, lane: _Lane, spans: list[_Row], role_index: list[_Ended] | None) -> list[_Top]:
        start, end = lane.start, lane.end
        clipped = []
        for s in spans:
            a = s.start_ns if s.start_ns > start else start
            b = s.end_ns if s.end_ns < end else end
            if b > a:
                clipped.append((a, -b, s.thread, s.role, s.stage, s))
        # By start, the longer first: a span that ends within the reach of those before it is nested.
        clipped.sort()  # equal up to the span: equal spans (a _Row orders by its fields, as a Span)
        top: list[_Top] = []
        runs: dict[tuple[str, str], list[int]] = {}  # (role, stage) -> [run start, run end, total before]
        gen_run: list[int] | None = None
        reach = start
        for a, neg_b, thread, role, stage, s in clipped:
            b = -neg_b
            run = runs.get((role, stage))
            if run is None:
                runs[(role, stage)] = [a, b, 0]
            elif a <= run[1]:
                run[1] = max(run[1], b)
            else:
                run[2] += run[1] - run[0]
                run[0], run[1] = a, b
            if stage in GENERATION_STAGES or role == GENERATION_ROLE:
                if gen_run is not None and a <= gen_run[1]:
                    gen_run[1] = max(gen_run[1], b)
                else:
                    if gen_run is not None:
                        self.generation_runs.append((gen_run[0], gen_run[1]))
                        lane.generation += gen_run[1] - gen_run[0]
                    gen_run = [a, b]
            if top and b <= reach:
                continue  # inside a stage of this lane that started no later
            if lane.blocks and a <= reach:
                lane.blocks[-1] = (lane.blocks[-1][0], b)
            else:
                lane.blocks.append((a, b))
            top.append((a, b, s))
            lane.top_ends.append(b)
            reach = b
            if role_index is not None:  # only waits need it, and only aligned clocks have waits
                role_index.append((b, -lane.index, -a, -thread, a, lane.index, s))
        if gen_run is not None:
            self.generation_runs.append((gen_run[0], gen_run[1]))
            lane.generation += gen_run[1] - gen_run[0]
        lane.by_stage = {key: total + b - a for key, (a, b, total) in runs.items()}
        lane.busy = sum(b - a for a, b in lane.blocks)
        return top

    # ---------------------------------------------------------------- who waited for whom

    def _latest(self, role: str, low: int, high: int, lane: int, before: int) -> _Ended | None:
        """The latest-ending stage of ``role`` that ended in [low, high], on a lane other than ``lane``,
        and started before ``before``."""
        ends = self.ends_by_role[role]
        entries = self.by_role[role]
        i = bisect_right(ends, high) - 1
        while i >= 0 and ends[i] >= low:
            entry = entries[i]
            if entry[5] != lane and entry[4] < before:
                return entry
            i -= 1
        return None

    def _waited_for(self, lane: _Lane, gap_start: int, gap_end: int, *, at_end: bool) -> _Ended | None:
        """What ``lane`` waited for in its idle gap ``[gap_start, gap_end]`` (rules in the module docstring)."""
        unc = self.uncertainty
        if at_end:  # whatever ended last elsewhere, after this lane stopped
            low, high, before = gap_start - unc + 1, _FAR, _FAR
        else:
            low, high, before = max(gap_end - unc - self.tolerance, gap_start - unc), gap_end + unc, gap_end
        best = None
        for role in self.by_role:
            if role != lane.role or at_end:
                entry = self._latest(role, low, high, lane.index, before)
                if entry is not None and (best is None or entry > best):  # unique on the first four: never the span
                    best = entry
        if best is None and not at_end and lane.role in self.by_role:
            best = self._latest(lane.role, low, high, lane.index, before)
        return best

    def _waits(self, lane: _Lane) -> list[WaitRow]:
        """What ``lane`` waited for, by cause, largest first: (role, stage, rank, ns)."""
        gaps, previous = [], lane.start
        for a, b in lane.blocks:
            if a > previous:
                gaps.append((previous, a, False))
            previous = b
        if lane.end > previous:
            gaps.append((previous, lane.end, True))  # it finished early (or ran no stage at all)
        waited: dict[tuple[str, str, int] | None, int] = defaultdict(int)
        for a, b, at_end in gaps:
            cause = self._waited_for(lane, a, b, at_end=at_end)
            waited[None if cause is None else (cause[6].role, cause[6].stage, cause[5])] += b - a
        rows: list[WaitRow] = [
            (None, UNATTRIBUTED, None, ns) if key is None else (key[0], key[1], self.lanes[key[2]].rank, ns)
            for key, ns in waited.items()
        ]
        # The order TimeShare values sort in: by their ms (the float a reader gets), then the cause.
        rows.sort(key=lambda w: (-_ms(w[3]), w[0] or "", w[1], w[2] if w[2] is not None else -1))
        return rows

    # ---------------------------------------------------------------- the critical path

    def _critical_path(self, w0: int, w1: int) -> list[tuple[str, str, int, int]]:
        parts: list[tuple[str, str, int, int]] = []  # (role, stage, rank, ns), from the end backwards

        def add(role: str, stage: str, rank: int, ns: int) -> None:
            if ns <= 0:
                return
            if parts and parts[-1][:3] == (role, stage, rank):
                parts[-1] = (role, stage, rank, parts[-1][3] + ns)
            else:
                parts.append((role, stage, rank, ns))

        last_lane = max(self.lanes, key=lambda lane: (lane.end, -lane.index))
        ended = [entries[-1] for entries in self.by_role.values() if entries]
        if not ended:
            add(last_lane.role, IDLE, last_lane.rank, w1 - w0)
            return parts
        last = max(ended)
        add(last_lane.role, IDLE, last_lane.rank, w1 - last[0])
        lane, t = self.lanes[last[5]], last[0]
        while t > w0:
            blocks = lane.blocks
            k = bisect_right(blocks, (t, _FAR)) - 1  # the last block that starts at or before t
            if k >= 0 and blocks[k][0] < t <= blocks[k][1]:
                # The first top-level stage ending at or after t covers t (t is busy) and started first.
                a, _, span = self.tops[lane.index][bisect_left(lane.top_ends, t)]
                add(span.role, span.stage, lane.rank, t - max(a, w0))
                t = a
                continue
            # t starts a busy run: what did the lane wait for in the gap before it?
            if k >= 0 and blocks[k][0] == t:
                k -= 1
            gap_start = blocks[k][1] if k >= 0 else lane.start
            cause = self._waited_for(lane, gap_start, t, at_end=False)
            if cause is not None:
                resume = min(cause[0], t)  # the cause may end after t, within the clocks' uncertainty
                add(lane.role, IDLE, lane.rank, t - max(resume, w0))
                lane, t = self.lanes[cause[5]], resume
            elif k >= 0:
                add(lane.role, IDLE, lane.rank, t - gap_start)
                t = gap_start
            else:  # before the lane's first stage, and nothing it waited for: idle since the step began
                add(lane.role, IDLE, lane.rank, t - w0)
                t = w0
        parts.reverse()
        return parts

    # ---------------------------------------------------------------- the step's values

    def result(self) -> StepTimeline:
        lanes = self.lanes
        if self.aligned:
            w0, w1 = min(lane.start for lane in lanes), max(lane.end for lane in lanes)
            self.wall = wall = w1 - w0
            self.path = self._critical_path(w0, w1)
            path = tuple(TimeShare(r, s, k, _ms(ns)) for r, s, k, ns in self.path)
            generation = _union_length(self.generation_runs, w0, w1)
        else:
            self.wall = wall = max(lane.end - lane.start for lane in lanes)
            path = ()
            generation = max(lane.generation for lane in lanes)
        rows = RankTable()  # the step's lanes and waits as columns: millions of waits at thousands of ranks
        role_sums: dict[str, list[int]] = {}
        role_causes: dict[str, dict[tuple[str | None, str], float]] = defaultdict(lambda: defaultdict(float))
        for lane in lanes:
            idle = lane.end - lane.start - lane.busy
            waits = self._waits(lane) if self.aligned else []
            rows.add(lane.rank, lane.role, lane.busy, idle, waits)
            sums = role_sums.setdefault(lane.role, [0, 0, 0])
            sums[0] += 1
            sums[1] += lane.busy
            sums[2] += idle
            causes = role_causes[lane.role]
            for role, stage, _, ns in waits:
                causes[(role, stage)] += _ms(ns)
        roles = {}
        for role, (count, busy, idle) in role_sums.items():
            ranked = sorted(role_causes[role].items(), key=lambda kv: (-kv[1], kv[0][0] or "", kv[0][1]))
            shares = tuple(TimeShare(r, s, None, ms) for (r, s), ms in ranked)
            roles[role] = RoleTimeline(role, count, _ms(busy), _ms(idle), shares)
        return StepTimeline(self.step, _ms(wall), path, roles, rows, _ms(generation))

    def stage_time(self) -> dict[tuple[str, str], int]:
        """(role, stage) -> ns of the step it accounts for: on the critical path; unaligned, its longest lane."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        if self.aligned:
            for role, stage, _, ns in self.path:
                if stage != IDLE:
                    totals[(role, stage)] += ns
        else:
            for lane in self.lanes:
                for key, ns in lane.by_stage.items():
                    totals[key] = max(totals[key], ns)
        return totals


def _union_length(runs: list[tuple[int, int]], low: int, high: int) -> int:
    total, reach = 0, low
    for start, end in sorted(runs):
        a, b = max(start, reach), min(end, high)
        if b > a:
            total += b - a
            reach = b
    return total


# --------------------------------------------------------------------------- across steps


def _peer_medians(values: list[int]) -> list[float]:
    """For each of the sorted ``values``, the median of the others (exact, in O(1) each)."""
    n = len(values)
    m = n - 1

    def others(i: int, k: int) -> int:  # the k-th of the values without the i-th
        return values[k] if k < i else values[k + 1]

    if m % 2:
        return [float(others(i, m // 2)) for i in range(n)]
    return [(others(i, m // 2 - 1) + others(i, m // 2)) / 2 for i in range(n)]


def _judge_peers(step: int, wall_ns: int, lanes: list[_Lane], peering: dict[tuple[str, str, _Key], Peering]) -> None:
    groups: dict[tuple[str, str], list[tuple[int, _Key]]] = defaultdict(list)
    for lane in lanes:
        for key, ns in lane.by_stage.items():
            groups[key].append((ns, (lane.role, lane.rank)))
    floor = max(FLOOR_MS * NS_PER_MS, FLOOR_SHARE * wall_ns)
    for (role, stage), members in groups.items():
        members.sort()
        medians = _peer_medians([ns for ns, _ in members]) if len(members) > 1 else [0.0]
        for (ns, lane_key), median in zip(members, medians, strict=True):
            record = peering.get((role, stage, lane_key))
            if record is None:
                peering[(role, stage, lane_key)] = record = Peering()
            record.ran += 1
            if len(members) > 1 and ns >= floor and median > 0 and ns >= STRAGGLER_RATIO * median:
                record.slow_steps.append(step)
                record.ratios.append(ns / median)
                record.excess_ns += ns - round(median)


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


def _step_runs(table: SpanTable) -> dict[int, array[int]]:
    """Where each step's spans lie: step -> (part, first, past the last) index triples, flattened.

    A timeline file holds its spans step after step, so a part has about one run per step."""
    runs: dict[int, array[int]] = {}
    for part, (columns, _) in enumerate(table.parts):
        steps = columns.step
        first, current = 0, None
        for i, step in enumerate(steps):
            if step != current:
                if i:
                    runs.setdefault(current, array("q")).extend((part, first, i))  # type: ignore[arg-type]
                first, current = i, step
        if len(steps):
            runs.setdefault(current, array("q")).extend((part, first, len(steps)))  # type: ignore[arg-type]
    return runs


def _step_spans(table: SpanTable, runs: array[int], step: int) -> tuple[dict[_Key, list[int]], list[_Row], int]:
    """One step's step windows by lane and its stage spans (shifted onto the axis), and how many were bad."""
    windows: dict[_Key, list[int]] = {}
    stages: list[_Row] = []
    skipped = 0
    for k in range(0, len(runs), 3):
        columns, shift = table.parts[runs[k]]
        lo, hi = runs[k + 1], runs[k + 2]
        names, rank = columns.names, columns.rank
        sliced = (columns.name[lo:hi], columns.start_ns[lo:hi], columns.duration_ns[lo:hi], columns.thread[lo:hi])
        for n, written, duration, thread in zip(*sliced, strict=True):
            if duration < 0:
                skipped += 1
                continue
            kind, role, stage = names[n]
            start = written - shift
            if kind == "stage":
                stages.append(_new_row(_Row, (kind, role, stage, step, rank, start, start + duration, thread)))
            elif kind == "step":
                window = windows.get((role, rank))
                if window is None:
                    windows[(role, rank)] = [start, start + duration]
                else:  # the same process twice in one step (a retried step): its whole extent
                    window[0], window[1] = min(window[0], start), max(window[1], start + duration)
            elif kind != "window":
                skipped += 1
    return windows, stages, skipped


def _analyze(table: SpanTable, aligned: bool, clock_uncertainty_ns: int, wait_tolerance_ns: int) -> TimelineReport:
    runs = _step_runs(table)
    skipped = 0
    unc = clock_uncertainty_ns if aligned else 0
    timelines: list[StepTimeline] = []
    stage_times: list[dict[tuple[str, str], int]] = []
    peering: dict[tuple[str, str, _Key], Peering] = {}
    worked: set[str] = set()  # roles that ran a stage: a driver that only holds the step open has no bubble
    for step in sorted(runs):
        windows, stages, bad = _step_spans(table, runs.pop(step), step)  # one step's objects at a time
        skipped += bad
        if not windows and not stages:
            continue  # only windows or bad spans: no step to analyse
        analysis = _Step(step, windows, stages, aligned, unc, wait_tolerance_ns)
        timeline = analysis.result()
        timelines.append(timeline)
        stage_times.append(analysis.stage_time())
        _judge_peers(step, analysis.wall, analysis.lanes, peering)
        worked.update(lane.role for lane in analysis.lanes if lane.blocks)
    clock = ClockInfo(
        aligned=aligned,
        max_uncertainty_ms=_ms(clock_uncertainty_ns) if aligned else None,
        note=None if aligned else UNALIGNED_NOTE,
    )
    steps = tuple(timelines)
    facts = TimelineAnalysis(steps, tuple(stage_times), peering, frozenset(worked), aligned)
    return TimelineReport(clock, steps, findings_of(facts), skipped)
