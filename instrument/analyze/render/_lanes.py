"""Which timeline lanes a picture draws, and the steps it shades (:func:`timeline_view`): pure, for the page
and the PNG alike.

Up to :data:`FULL_LANES` processes, every one is drawn. Past that, a lane per rank is unreadable (and, at
4,096 ranks, megabytes of bars), so each role becomes a band of a few lanes: its median rank (by busy time
summed over the steps), the ranks its findings name (a straggler) and its :data:`OUTLIERS` busiest others.
The merged trace (``--merged-trace``) keeps every rank.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from instrument.analyze.model import Report, TimelineLane

__all__ = [
    "FULL_LANES",
    "OUTLIERS",
    "DrawnLane",
    "TimelineView",
    "labelled_steps",
    "lane_labels",
    "nesting_depths",
    "steps_within",
    "thin_labels",
    "timeline_view",
]

FULL_LANES = 32
"""Processes drawn one lane each; past this many, role bands."""
OUTLIERS = 3
"""The busiest ranks drawn per role band, beside its median rank and the ranks its findings name."""
_KIND_WORDS = {"straggler": "straggler", "bubble": "bubble", "dominant_stage": "dominant stage", "slow_step": "slow"}


@dataclass(frozen=True)
class DrawnLane:
    lane: TimelineLane
    label: str  # "actor rank 3", or in a band "actor rank 3 (straggler)"
    busy_ms: float  # its stages' time, summed over the steps


@dataclass(frozen=True)
class TimelineView:
    lanes: tuple[DrawnLane, ...]  # by role, then (in a band) median first
    ranks: dict[str, int]  # every process per role, drawn or not
    steps: tuple[tuple[int, int, int], ...]  # (step, first start ns, last end ns) over every lane
    banded: bool
    caption: str  # what is drawn, in words

    @property
    def roles(self) -> list[str]:
        return sorted(self.ranks)


def _busy(report: Report, lanes: tuple[TimelineLane, ...]) -> dict[tuple[str, int], float]:
    """Busy ms per (role, rank), summed over the steps: the analysis's union where it has the lane, else the sum
    of the lane's stage spans."""
    busy: dict[tuple[str, int], float] = defaultdict(float)
    if report.timeline is not None:
        for step in report.timeline.steps:
            for row in step.ranks:
                busy[row.role, row.rank] += row.busy_ms
    for lane in lanes:
        if (lane.role, lane.rank) not in busy:
            stage = [i for i, (kind, _, _) in enumerate(lane.names) if kind == "stage"]
            wanted = set(stage)
            total = sum(e - s for n, s, e in zip(lane.name, lane.start_ns, lane.end_ns, strict=True) if n in wanted)
            busy[lane.role, lane.rank] = total / 1e6
    return busy


def _steps(lanes: tuple[TimelineLane, ...]) -> tuple[tuple[int, int, int], ...]:
    extent: dict[int, list[int]] = {}
    for lane in lanes:
        steps = {i for i, (kind, _, _) in enumerate(lane.names) if kind == "step"}
        for n, step, start, end in zip(lane.name, lane.step, lane.start_ns, lane.end_ns, strict=True):
            if n in steps:
                held = extent.setdefault(step, [start, end])
                held[0], held[1] = min(held[0], start), max(held[1], end)
    return tuple((step, low, high) for step, (low, high) in sorted(extent.items()))


def timeline_view(report: Report, full_lanes: int = FULL_LANES, outliers: int = OUTLIERS) -> TimelineView | None:
    """The lanes to draw (every process, or role bands past ``full_lanes``) and the steps; ``None`` without
    a timeline."""
    spans = report.timeline_spans
    if spans is None or not spans.lanes:
        return None
    busy = _busy(report, spans.lanes)
    by_role: dict[str, list[TimelineLane]] = defaultdict(list)
    for lane in spans.lanes:
        by_role[lane.role].append(lane)
    ranks = {role: len(lanes) for role, lanes in by_role.items()}
    steps = _steps(spans.lanes)
    names = lane_labels(spans.lanes)
    if len(spans.lanes) <= full_lanes:
        drawn = tuple(DrawnLane(lane, names[id(lane)], busy[lane.role, lane.rank]) for lane in spans.lanes)
        caption = f"every process, one lane each ({len(drawn)})"
        return TimelineView(drawn, ranks, steps, banded=False, caption=caption)
    named: dict[tuple[str, int], str] = {}
    for finding in report.timeline.findings if report.timeline is not None else ():
        if finding.role is not None and finding.rank is not None:
            named.setdefault((finding.role, finding.rank), _KIND_WORDS.get(finding.kind, finding.kind))
    out: list[DrawnLane] = []
    for role in sorted(by_role):
        lanes = sorted(by_role[role], key=lambda lane: (busy[lane.role, lane.rank], lane.rank, lane.pid))
        median = lanes[(len(lanes) - 1) // 2]
        chosen = [(median, f"median of {len(lanes):,}")]
        flagged = [lane for lane in lanes if (role, lane.rank) in named and lane is not median]
        chosen += [(lane, named[role, lane.rank]) for lane in flagged]
        taken = {id(lane) for lane, _ in chosen}
        busiest = [lane for lane in reversed(lanes) if id(lane) not in taken][:outliers]
        chosen += [(lane, "busiest") for lane in sorted(busiest, key=lambda lane: lane.rank)]
        out += [DrawnLane(lane, f"{names[id(lane)]} ({why})", busy[role, lane.rank]) for lane, why in chosen]
    caption = (
        f"{len(spans.lanes):,} processes: per role its median rank by busy time, the ranks findings name and the "
        f"{outliers} busiest (--merged-trace writes every rank)"
    )
    return TimelineView(tuple(out), ranks, steps, banded=True, caption=caption)


def nesting_depths(rows: list[tuple[int, int, int]]) -> list[int]:
    """The nesting depth of each (start, end, thread) span among the spans of its thread."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][2], rows[i][0], -rows[i][1]))
    depth = [0] * len(rows)
    stack: list[int] = []  # ends of the open spans of the current thread
    thread = None
    for i in order:
        start, end, th = rows[i]
        if th != thread:
            stack, thread = [], th
        while stack and stack[-1] <= start:
            stack.pop()
        depth[i] = len(stack)
        stack.append(end)
    return depth


def steps_within(view: TimelineView, limit: int) -> tuple[set[int], int]:
    """The first steps whose stage spans (on the drawn lanes) fit in ``limit`` bars, and how many steps there are."""
    per_step: dict[int, int] = defaultdict(int)
    for drawn in view.lanes:
        lane = drawn.lane
        stages = {i for i, (kind, _, _) in enumerate(lane.names) if kind == "stage"}
        for n, step in zip(lane.name, lane.step, strict=True):
            if n in stages:
                per_step[step] += 1
    kept: set[int] = set()
    total = 0
    for step, _, _ in view.steps:
        total += per_step.get(step, 0)
        if total > limit and kept:
            break
        kept.add(step)
    return kept, len(view.steps)


def lane_labels(lanes: tuple[TimelineLane, ...]) -> dict[int, str]:
    """``actor rank 3`` by ``id(lane)``; with the pid when two processes share a role and rank (a restarted worker)."""
    twins = Counter((lane.role, lane.rank) for lane in lanes)
    return {
        id(lane): lane.label if twins[lane.role, lane.rank] == 1 else f"{lane.label} pid {lane.pid}" for lane in lanes
    }


def _strides() -> Iterator[int]:
    """1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, ...: the round numbers a reader counts steps by."""
    yield from (1, 2, 5)
    yield from (m * 10**e for e in itertools.count() for m in (10, 20, 25, 50))


def _roundness(step: int) -> int:
    """The largest of :func:`_strides` that divides ``step`` (0 is the roundest)."""
    if step == 0:
        return 10**18
    best = 1
    for stride in _strides():
        if stride > abs(step):
            return best
        if step % stride == 0:
            best = stride
    raise AssertionError("unreachable: the strides grow without end")


def _place(order: list[int], centers: Sequence[float], widths: Sequence[float], gap: float) -> list[int]:
    """Each label of ``order`` in turn where it overlaps none already placed: the indexes placed."""
    lefts: list[float] = []  # the placed labels' extents, in order: they never overlap, so rights are in order too
    rights: list[float] = []
    placed: list[int] = []
    for i in order:
        left, right = centers[i] - widths[i] / 2, centers[i] + widths[i] / 2
        at = bisect_left(lefts, left)
        if (at > 0 and rights[at - 1] + gap > left) or (at < len(lefts) and right + gap > lefts[at]):
            continue
        lefts.insert(at, left)
        rights.insert(at, right)
        placed.append(i)
    return placed


def thin_labels(steps: Sequence[int], centers: Sequence[float], widths: Sequence[float], gap: float = 0.0) -> list[int]:
    """Which step labels to draw so that no two overlap: the indexes into ``steps`` (centres and widths in one
    unit, e.g. pixels; ``gap`` the least room between two).

    The first step is labelled; then every k-th step, the least k of 1, 2, 5, 10, 20, 25, 50, ... whose
    multiples all fit; then any other step that still fits, the roundest numbers first. So evenly spread steps
    get evenly spread labels (1, 5, 10, 15, 20), a long step among short ones keeps its own, and every label
    left out would overlap one drawn."""
    by_position = sorted(range(len(steps)), key=lambda i: (centers[i], i))
    largest = max((abs(s) for s in steps), default=0)
    multiples: list[int] = []
    for stride in _strides():
        multiples = [i for i in by_position if steps[i] % stride == 0]
        if stride > largest or len(_place(multiples, centers, widths, gap)) == len(multiples):
            break
    rest = sorted(by_position, key=lambda i: -_roundness(steps[i]))  # stable: by position within a roundness
    order = dict.fromkeys([0, *multiples, *rest] if steps else [])  # each once, the first of its places
    return sorted(_place(list(order), centers, widths, gap))


def labelled_steps(
    steps: Sequence[tuple[int, int, int]],
    extent_ms: tuple[float, float],
    plot_width: float,
    char_width: float,
    gap: float,
) -> tuple[tuple[float, float], list[int]]:
    """The time axis's range (ms) and the steps to label above a plot ``plot_width`` wide (a unit of the
    renderer's: px, points), each label ``step N`` at its step's middle, ``char_width`` a character at most:
    :func:`thin_labels` of them.

    The range pads ``extent_ms`` (the first start and last end drawn) by half the widest label each side, so a
    label over the first or last step stays inside the plot."""
    widths = [char_width * len(f"step {step}") for step, _, _ in steps]
    low, high = extent_ms
    span = max(high - low, 1e-3)
    room = max(plot_width - max(widths, default=0.0), plot_width / 2)  # what the extent itself is drawn on
    pad = span * (plot_width / room - 1) / 2
    per_ms = plot_width / (span + 2 * pad)
    centers = [((start + end) / 2e6 - low + pad) * per_ms for _, start, end in steps]
    return (low - pad, high + pad), thin_labels([s for s, _, _ in steps], centers, widths, gap)
