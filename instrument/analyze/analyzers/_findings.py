"""The step timeline's findings: one list of rules, each ``(analysis) -> Iterable[Finding]``, ranked in one place.

A rule reads a :class:`TimelineAnalysis` (the analysed steps and what was judged across them) and returns
:class:`~instrument.analyze.model.Finding` values; :func:`findings_of` runs every registered rule and ranks what
they say by :func:`rank` (largest ``lost_ms`` first, ties by kind, role, stage, rank). The built-in rules are
:func:`stragglers`, :func:`bubbles`, :func:`dominant_stage` and :func:`slow_steps` (their semantics: the
module docstring of :mod:`._timeline`); :func:`register_finding` adds one (docs/architecture.md, "How to add a
finding"). A rule that raises is left out with one warning: the other findings are still said.
"""

from __future__ import annotations

import logging
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, mul, sub

from instrument.analyze.model import GENERATION_STAGES, Finding, RankTable, StepTimeline

__all__ = [
    "BUBBLE_MIN_SHARE",
    "DOMINANT_MIN_SHARE",
    "FLOOR_MS",
    "FLOOR_SHARE",
    "GENERATION_ROLE",
    "MAX_STRAGGLER_FINDINGS",
    "SLOW_STEP_MIN_STEPS",
    "SLOW_STEP_RATIO",
    "STRAGGLER_RATIO",
    "FindingRule",
    "LaneKey",
    "Peering",
    "TimelineAnalysis",
    "bubbles",
    "dominant_stage",
    "findings_of",
    "rank",
    "register_finding",
    "registered_findings",
    "slow_steps",
    "stragglers",
    "unregister_finding",
]

logger = logging.getLogger("instrument.analyze")

STRAGGLER_RATIO = 1.2  # below it, run-to-run noise of equal work
FLOOR_MS = 2.0  # below it a stage is timer noise: never a straggler, never a bubble
FLOOR_SHARE = 0.01  # a stage under 1% of its step is not worth a straggler finding
BUBBLE_MIN_SHARE = 0.10
DOMINANT_MIN_SHARE = 0.25
SLOW_STEP_RATIO = 1.5
SLOW_STEP_MIN_STEPS = 3  # a median of two is their mean: one step cannot stand out against it
MAX_STRAGGLER_FINDINGS = 10  # thousands of ranks can hold many; the largest are the ones to read
GENERATION_ROLE = "rollout"
_NS_PER_MS = 1_000_000
_TIMES = "\u00d7"
_DASH = "\u2013"

LaneKey = tuple[str, int]
"""A lane across steps: (role, rank)."""


def _ms(ns: float) -> float:
    return ns / _NS_PER_MS


# --------------------------------------------------------------------------- what a rule reads


@dataclass
class Peering:
    """A (role, stage, lane) across steps: how often it ran, and was slow (filled while the steps are read)."""

    ran: int = 0
    slow_steps: list[int] = field(default_factory=list)
    excess_ns: int = 0  # over its peers' median, summed over its slow steps
    ratios: list[float] = field(default_factory=list)  # to its peers' median, on its slow steps


@dataclass(frozen=True)
class TimelineAnalysis:
    """What a finding rule reads: the analysed steps and what was judged across them."""

    steps: tuple[StepTimeline, ...]
    """Every analysed step, in order."""
    stage_times: tuple[Mapping[tuple[str, str], int], ...]
    """Per step (as :attr:`steps`): (role, stage) -> ns of the step it accounts for (on the critical path;
    unaligned clocks: its longest lane)."""
    peering: Mapping[tuple[str, str, LaneKey], Peering]
    """(role, stage, lane) -> how it compared with its peers on the steps it ran."""
    worked: frozenset[str]
    """The roles that ran a stage (a driver that only holds the step open has none)."""
    aligned: bool
    """Whether the hosts' clocks are aligned (waits and the critical path exist only then)."""


# --------------------------------------------------------------------------- the list, ranked in one place


FindingRule = Callable[[TimelineAnalysis], Iterable[Finding]]
"""A finding rule: what it finds in one analysis (nothing, one finding or several)."""

_RULES: list[FindingRule] = []


def register_finding(rule: FindingRule) -> FindingRule:
    """Add ``rule`` to the findings every analysis says (once; usable as a decorator); returns it."""
    if not callable(rule):
        raise TypeError(f"a finding rule must be callable (analysis) -> Iterable[Finding] (got {rule!r})")
    if rule not in _RULES:
        _RULES.append(rule)
    return rule


def unregister_finding(rule: FindingRule) -> None:
    """Take ``rule`` out of the list (nothing happens if it is not in it)."""
    if rule in _RULES:
        _RULES.remove(rule)


def registered_findings() -> tuple[FindingRule, ...]:
    """The rules every analysis runs, in the order they were registered (built-in ones first)."""
    return tuple(_RULES)


def rank(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """``findings`` in the order they are said: the most time lost per step first."""
    return tuple(
        sorted(
            findings,
            key=lambda f: (-f.lost_ms, f.kind, f.role or "", f.stage or "", f.rank if f.rank is not None else -1),
        )
    )


def findings_of(analysis: TimelineAnalysis) -> tuple[Finding, ...]:
    """What every registered rule finds in ``analysis``, ranked; a rule that raises is left out, with a warning."""
    found: list[Finding] = []
    for rule in _RULES:
        try:
            found.extend(rule(analysis))
        except Exception as exc:  # one rule's bug must not cost the report its other findings
            name = getattr(rule, "__qualname__", repr(rule))
            logger.warning("instrument analyze: finding rule %s failed, its findings are left out: %r", name, exc)
    return rank(found)


# --------------------------------------------------------------------------- the built-in rules, in words


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.3g} ms"
    return f"{ms / 1000:.3g} s" if ms < 100_000 else f"{ms / 1000:,.0f} s"


def _ranks_text(role: str, ranks: Iterable[int]) -> str:
    """``actor rank 3``, ``actor ranks 0-2, 5``, ``52 actor ranks (2-63)`` (with an en dash)."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    if len(runs) > 4:
        return f"{len(ordered)} {role} ranks ({ordered[0]}{_DASH}{ordered[-1]})"
    words = [str(a) if a == b else f"{a}{_DASH}{b}" for a, b in runs]
    return f"{role} {'rank' if len(ordered) == 1 else 'ranks'} {', '.join(words)}"


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:5])
    return shown + (", \u2026" if len(steps) > 5 else "")


def stragglers(analysis: TimelineAnalysis) -> list[Finding]:
    """One finding per straggling rank (a rank slow in every chunk of a stage would otherwise fill the list)."""
    steps, peering, aligned = analysis.steps, analysis.peering, analysis.aligned
    lone_step = len(steps) == 1
    by_rank: dict[tuple[str, LaneKey], list[tuple[int, str, Peering]]] = defaultdict(list)
    for (role, stage, lane_key), record in peering.items():
        slow = record.slow_steps
        if len(slow) * 2 > record.ran and (len(slow) >= 2 or lone_step):
            by_rank[(role, lane_key)].append((record.excess_ns, stage, record))
    ranked = sorted(by_rank.items(), key=lambda kv: (-sum(c[0] for c in kv[1]), kv[0]))[:MAX_STRAGGLER_FINDINGS]
    # Who waited for each straggler on its slow steps: one pass over every rank's causes.
    targets: dict[tuple[str, str, int], tuple[tuple[str, int], set[int]]] = {}
    for (role, (_, rank)), stages in ranked:
        for _, stage, record in stages:
            targets[(role, stage, rank)] = ((role, rank), set(record.slow_steps))
    waits: dict[tuple[str, int], dict[str, dict[tuple[int, int], float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    for timeline in steps if aligned and targets else ():
        if isinstance(timeline.ranks, RankTable):
            _waits_for(timeline.ranks, timeline.step, targets, waits)
            continue
        for row in timeline.ranks:
            for cause_role, cause_stage, cause_rank, ms in row.waits():  # no TimeShare made: millions of them
                if cause_role is None or cause_rank is None:
                    continue
                found = targets.get((cause_role, cause_stage, cause_rank))
                if found is not None and timeline.step in found[1]:
                    waits[found[0]][row.role][(row.rank, timeline.step)] += ms
    findings = []
    for (role, (_, rank)), stages in ranked:
        stages.sort(key=lambda c: (-c[0], c[1]))
        excess = _ms(sum(c[0] for c in stages))
        slow_steps = sorted({step for _, _, record in stages for step in record.slow_steps})
        said = [
            f"{stage} {statistics.median(record.ratios):.1f}{_TIMES} on {len(record.slow_steps)} of {record.ran} steps"
            for _, stage, record in stages[:3]
        ]
        if len(stages) == 1:
            _, stage, record = stages[0]
            text = (
                f"{role} {stage} on rank {rank} is {statistics.median(record.ratios):.1f}{_TIMES} its "
                f"peers' median on {len(slow_steps)} of {record.ran} steps"
            )
        else:
            more = f", {len(stages) - 3} more" if len(stages) > 3 else ""
            text = f"{role} rank {rank} is slower than its peers in {len(stages)} stages: {', '.join(said)}{more}"
        text += f" (+{_duration(excess / len(slow_steps))} a step)"
        for waiter_role, entries in sorted(waits[(role, rank)].items(), key=lambda kv: -sum(kv[1].values()))[:2]:
            each = statistics.median(entries.values())
            if each >= FLOOR_MS:  # not the hand-offs of a few µs between its chunks
                text += f"; {_ranks_text(waiter_role, (r for r, _ in entries))} wait {_duration(each)} each for it"
        top = stages[0][1]
        findings.append(Finding("straggler", text, excess / len(steps), role, top, rank, tuple(slow_steps)))
    return findings


def _waits_for(
    table: RankTable,
    step: int,
    targets: Mapping[tuple[str, str, int], tuple[tuple[str, int], set[int]]],
    waits: dict[tuple[str, int], dict[str, dict[tuple[int, int], float]]],
) -> None:
    """What :func:`stragglers` adds up from one step's lanes, read from the table's columns: only the waits for a
    target (cause and rank, one int) are looked at one by one, in the lanes' order."""
    by_cause: dict[tuple[str | None, str], list[int]] = defaultdict(list)
    for number, cause in enumerate(table.causes):
        by_cause[cause].append(number)
    wanted = {}  # the code of a target's (cause, rank) -> the target
    ranks = table.wait_rank
    if not ranks:
        return
    low = min(ranks)
    span = max(ranks) - low + 1
    for (role, stage, rank), found in targets.items():
        if step in found[1] and low <= rank < low + span:
            for number in by_cause.get((role, stage), ()):
                wanted[number * span + rank - low] = found[0]
    if not wanted:
        return
    codes = list(map(add, map(mul, table.cause, repeat(span)), map(sub, ranks, repeat(low))))
    at, roles, lane_role, lane_rank, ns = table.at, table.roles, table.role, table.rank, table.wait_ns
    for j in compress(range(len(codes)), map(wanted.__contains__, codes)):
        lane = bisect_right(at, j) - 1
        waits[wanted[codes[j]]][roles[lane_role[lane]]][(lane_rank[lane], step)] += _ms(ns[j])


def bubbles(analysis: TimelineAnalysis) -> list[Finding]:
    """One finding per role idle at least :data:`BUBBLE_MIN_SHARE` of its rank-time, naming what it waited for."""
    steps, worked, aligned = analysis.steps, analysis.worked, analysis.aligned
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # busy, idle, rank-steps
    causes: dict[str, dict[tuple[str | None, str], float]] = defaultdict(lambda: defaultdict(float))
    seen: dict[str, list[int]] = defaultdict(list)
    for timeline in steps:
        for name, role in timeline.roles.items():
            total = totals[name]
            total[0] += role.busy_ms
            total[1] += role.idle_ms
            total[2] += role.ranks
            seen[name].append(timeline.step)
            for w in role.waited_for:
                causes[name][(w.role, w.stage)] += w.ms
    findings = []
    for name, (busy, idle, rank_steps) in sorted(totals.items()):
        rank_time = busy + idle
        if name not in worked or rank_time <= 0 or idle / rank_time < BUBBLE_MIN_SHARE:
            continue
        per_rank = idle / rank_steps
        if per_rank < FLOOR_MS:
            continue
        text = f"{name} ranks are idle {100 * idle / rank_time:.0f}% of their step time"
        text += f" ({_duration(per_rank)} a step each)"
        ranked = sorted(causes[name].items(), key=lambda kv: (-kv[1], kv[0][0] or "", kv[0][1]))
        ranked = [(cause, ms) for cause, ms in ranked[:2] if ms >= 0.01 * rank_time]  # not a 0% cause
        if ranked:
            said = [f"{r} {s} {100 * ms / rank_time:.0f}%" for (r, s), ms in ranked if r is not None]
            alone = sum(ms for (r, _), ms in ranked if r is None)
            if said:
                text += ", waiting for " + ", ".join(said)
            if alone:  # no stage of another rank ended as it resumed: its own code between its stages
                text += f"; {100 * alone / rank_time:.0f}% " if said else ", "
                text += "in their own code between profiled stages (no other rank's stage ended as they resumed)"
        elif not aligned:
            text += " (clocks not aligned: what they waited for is unknown)"
        cause = next(((r, s) for (r, s), _ in ranked if r is not None), None)
        findings.append(Finding("bubble", text, per_rank, name, None, None, tuple(seen[name]), cause))
    return findings


def dominant_stage(analysis: TimelineAnalysis) -> list[Finding]:
    """The (role, stage) with the largest median share of the step, when at least :data:`DOMINANT_MIN_SHARE`."""
    steps, stage_times, aligned = analysis.steps, analysis.stage_times, analysis.aligned
    if not steps:
        return []
    keys = sorted({key for times in stage_times for key in times})
    walls = [s.wall_ms for s in steps]
    median_wall = statistics.median(walls)
    best: tuple[float, float, tuple[str, str]] | None = None
    for key in keys:
        shares = [
            _ms(times.get(key, 0)) / s.wall_ms if s.wall_ms > 0 else 0.0
            for s, times in zip(steps, stage_times, strict=True)
        ]
        share = statistics.median(shares)
        ms = statistics.median(_ms(times.get(key, 0)) for times in stage_times)
        if best is None or share > best[0]:
            best = (share, ms, key)
    if best is None or best[0] < DOMINANT_MIN_SHARE:
        return []
    share, ms, (role, stage) = best
    where = " on the critical path" if aligned else " on its longest rank"
    text = (
        f"step {_duration(median_wall)} (median of {len(steps)}): {role} {stage} is {100 * share:.0f}% of it "
        f"({_duration(ms)} a step{where})"
    )
    generation = statistics.median(s.generation_pct for s in steps)
    if generation > 0 and stage not in GENERATION_STAGES and role != GENERATION_ROLE:
        text += f"; generation is {generation:.0f}% of the step"
    return [Finding("dominant_stage", text, ms, role, stage, None, tuple(s.step for s in steps))]


def slow_steps(analysis: TimelineAnalysis) -> list[Finding]:
    """The steps at least :data:`SLOW_STEP_RATIO` x the median step, naming the stage that grew most."""
    steps, stage_times = analysis.steps, analysis.stage_times
    if len(steps) < SLOW_STEP_MIN_STEPS:
        return []
    median_wall = statistics.median(s.wall_ms for s in steps)
    if median_wall <= 0:
        return []
    slow = [
        (s, times)
        for s, times in zip(steps, stage_times, strict=True)
        if s.wall_ms >= SLOW_STEP_RATIO * median_wall and s.wall_ms - median_wall >= FLOOR_MS
    ]
    if not slow:
        return []
    slowest, slowest_times = max(slow, key=lambda st: (st[0].wall_ms, -st[0].step))
    walls = ", ".join(_duration(s.wall_ms) for s, _ in slow[:5])
    numbers = [s.step for s, _ in slow]
    text = (
        f"step{'s' if len(slow) > 1 else ''} {_steps_text(numbers)} took {walls}, "
        f"{'up to ' if len(slow) > 1 else ''}{slowest.wall_ms / median_wall:.1f}{_TIMES} the median step "
        f"({_duration(median_wall)})"
    )
    grown = []
    for key, ns in slowest_times.items():
        typical = statistics.median(times.get(key, 0) for times in stage_times)
        grown.append((ns - typical, key))
    if grown:
        extra, (role, stage) = max(grown, key=lambda g: (g[0], g[1]))
        if extra > 0:
            text += f"; on step {slowest.step} the most extra was {role} {stage} (+{_duration(_ms(extra))})"
    lost = sum(s.wall_ms - median_wall for s, _ in slow) / len(steps)
    return [Finding("slow_step", text, lost, None, None, None, tuple(numbers))]


for _rule in (stragglers, bubbles, dominant_stage, slow_steps):
    register_finding(_rule)
