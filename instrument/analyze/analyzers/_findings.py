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
from functools import cached_property
from itertools import compress, repeat
from operator import add, mul, sub

from instrument.analyze.model import GENERATION_STAGES, Finding, RankTable, StepTimeline
from instrument.naming import SDK_STAGE_PREFIX

__all__ = [
    "BUBBLE_MIN_SHARE",
    "DOMINANT_MIN_SHARE",
    "FLOOR_MS",
    "FLOOR_SHARE",
    "GENERATION_ROLE",
    "INSTRUMENT_KIND",
    "MAX_STRAGGLER_FINDINGS",
    "SLOW_STEP_MIN_STEPS",
    "SLOW_STEP_RATIO",
    "STRAGGLER_RATIO",
    "FindingRule",
    "Straggler",
    "LaneKey",
    "Peering",
    "TimelineAnalysis",
    "bubbles",
    "dominant_stage",
    "findings_of",
    "instrument_time",
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
INSTRUMENT_KIND = "instrument"
"""The finding that says how much of the traced steps was the SDK's own work (said last)."""
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
    excesses: list[int] = field(default_factory=list)  # over its peers' median (ns), on each of its slow steps


@dataclass(frozen=True, eq=False)
class Straggler:
    """A consistently slow (role, rank) and what it caused: a cause, whose effects the other findings leave out."""

    role: str
    rank: int
    stages: tuple[tuple[int, str, Peering], ...]
    """(excess ns, stage, its peering), the most excess first."""
    waits: Mapping[str, Mapping[tuple[int, int], float]]
    """Waiting role -> (its rank, step) -> ms it waited for this straggler's slow stages on their slow steps."""
    waits_by_cause: Mapping[str, Mapping[str, float]]
    """Waiting role -> the straggler's stage -> ms (the same waits, by what was waited for)."""

    @property
    def excess_ms(self) -> float:
        """Its stages' time over their peers' median, summed over their slow steps: the step time it added."""
        return _ms(sum(excess for excess, _, _ in self.stages))

    @cached_property
    def caused(self) -> Mapping[str, float]:
        """Waiting role -> the idle rank-time its slowness caused there: of each wait for it, no more than it added
        to that step (what the waiter would have waited for a rank at its peers' pace is not its doing)."""
        return {
            waiter: sum(min(ms, _ms(self.excess_on(step))) for (_, step), ms in entries.items())
            for waiter, entries in self.waits.items()
        }

    @property
    def caused_ms(self) -> float:
        """The idle rank-time its slowness caused other ranks, on its slow steps, in all."""
        return sum(self.caused.values())

    def excess_on(self, step: int) -> int:
        """The ns it added on ``step``: its slow stages' excess there, summed (a lane runs them one after another)."""
        return sum(
            (
                e
                for _, _, record in self.stages
                for s, e in zip(record.slow_steps, record.excesses, strict=True)
                if s == step
            ),
        )


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

    @cached_property
    def stragglers(self) -> tuple[Straggler, ...]:
        """The consistent stragglers (the most excess first, at most :data:`MAX_STRAGGLER_FINDINGS`), with who waited
        for them: the causes the idle and slow-step findings leave out of what they say."""
        return _stragglers(self)


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
    """``findings`` in the order they are said: the most time lost per step first; the SDK's own time
    (:data:`INSTRUMENT_KIND`) last, whatever its size: it is what measuring cost, not what to fix."""
    return tuple(
        sorted(
            findings,
            key=lambda f: (
                f.kind == INSTRUMENT_KIND,
                -f.lost_ms,
                f.kind,
                f.role or "",
                f.stage or "",
                f.rank if f.rank is not None else -1,
            ),
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


def _stragglers(analysis: TimelineAnalysis) -> tuple[Straggler, ...]:
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
    by_cause: dict[tuple[str, int], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(_floats))
    for timeline in steps if aligned and targets else ():
        if isinstance(timeline.ranks, RankTable):
            _waits_for(timeline.ranks, timeline.step, targets, waits, by_cause)
            continue
        for row in timeline.ranks:
            for cause_role, cause_stage, cause_rank, ms in row.waits():  # no TimeShare made: millions of them
                if cause_role is None or cause_rank is None:
                    continue
                found = targets.get((cause_role, cause_stage, cause_rank))
                if found is not None and timeline.step in found[1]:
                    waits[found[0]][row.role][(row.rank, timeline.step)] += ms
                    by_cause[found[0]][row.role][cause_stage] += ms
    found_stragglers = []
    for (role, (_, rank)), stages in ranked:
        stages.sort(key=lambda c: (-c[0], c[1]))
        key = (role, rank)
        found_stragglers.append(Straggler(role, rank, tuple(stages), waits.get(key, {}), by_cause.get(key, {})))
    return tuple(found_stragglers)


def _floats() -> defaultdict[str, float]:
    return defaultdict(float)


def stragglers(analysis: TimelineAnalysis) -> list[Finding]:
    """One finding per straggling rank (a rank slow in every chunk of a stage would otherwise fill the list); its
    loss is the step time it added and the idle it caused other ranks, per step (causes rank above effects)."""
    findings = []
    for straggler in analysis.stragglers:
        role, rank, stages = straggler.role, straggler.rank, straggler.stages
        excess = straggler.excess_ms
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
        for waiter_role, entries in sorted(straggler.waits.items(), key=lambda kv: -sum(kv[1].values()))[:2]:
            each = statistics.median(entries.values())
            if each >= FLOOR_MS:  # not the hand-offs of a few µs between its chunks
                waiters = {r for r, _ in entries}
                verb = "waits" if len(waiters) == 1 else "wait"
                each_ = "" if len(waiters) == 1 else " each"
                text += f"; {_ranks_text(waiter_role, waiters)} {verb} {_duration(each)}{each_} for it"
                mine = straggler.caused[waiter_role] / len(entries)
                if mine >= FLOOR_MS and mine < 0.995 * each:
                    text += f", {_duration(mine)} of it its delay"
        caused = straggler.caused_ms
        if caused / len(slow_steps) >= FLOOR_MS:
            text += f" ({_duration(caused / len(slow_steps))} of idle rank-time it caused a step)"
        top = stages[0][1]
        lost = (excess + caused) / len(analysis.steps)
        findings.append(Finding("straggler", text, lost, role, top, rank, tuple(slow_steps)))
    return findings


def _waits_for(
    table: RankTable,
    step: int,
    targets: Mapping[tuple[str, str, int], tuple[tuple[str, int], set[int]]],
    waits: dict[tuple[str, int], dict[str, dict[tuple[int, int], float]]],
    waited_on: dict[tuple[str, int], dict[str, dict[str, float]]],
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
        target, waiter = wanted[codes[j]], roles[lane_role[lane]]
        waits[target][waiter][(lane_rank[lane], step)] += _ms(ns[j])
        waited_on[target][waiter][table.causes[table.cause[j]][1]] += _ms(ns[j])


def bubbles(analysis: TimelineAnalysis) -> list[Finding]:
    """One finding per role idle at least :data:`BUBBLE_MIN_SHARE` of its rank-time, naming what it waited for; the
    waits for a straggler are that straggler's finding (said there), and the SDK's own time is no one's idle."""
    steps, worked, aligned = analysis.steps, analysis.worked, analysis.aligned
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # rank-time, idle, rank-steps
    causes: dict[str, dict[tuple[str | None, str], float]] = defaultdict(lambda: defaultdict(float))
    seen: dict[str, list[int]] = defaultdict(list)
    for timeline in steps:
        for name, role in timeline.roles.items():
            total = totals[name]
            total[0] += role.busy_ms + role.idle_ms + role.instrument_ms
            total[1] += role.idle_ms
            total[2] += role.ranks
            seen[name].append(timeline.step)
            for w in role.waited_for:
                if not w.stage.startswith(SDK_STAGE_PREFIX):
                    causes[name][(w.role, w.stage)] += w.ms
    explained: dict[str, float] = defaultdict(float)  # waiting role -> ms its stragglers' findings say
    for straggler in analysis.stragglers:
        for waiter, caused in straggler.caused.items():
            explained[waiter] += caused
            stages = straggler.waits_by_cause.get(waiter, {})
            waited = sum(stages.values())
            for stage, ms in stages.items():  # out of what it waited on, in proportion
                causes[waiter][(straggler.role, stage)] -= caused * ms / waited if waited else 0.0
    findings = []
    for name, (rank_time, role_idle, rank_steps) in sorted(totals.items()):
        idle = role_idle - explained[name]
        if name not in worked or rank_time <= 0 or idle / rank_time < BUBBLE_MIN_SHARE:
            continue
        per_rank = idle / rank_steps
        if per_rank < FLOOR_MS:
            continue
        besides = " besides waiting for the straggler above" if explained[name] / rank_steps >= FLOOR_MS else ""
        text = f"{name} ranks are idle {100 * idle / rank_time:.0f}% of their step time{besides}"
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
    """The (role, stage) with the largest median time, when at least :data:`DOMINANT_MIN_SHARE` of the median step
    (the user's: without the SDK's own time); its share and its ms are of the same median."""
    steps, stage_times, aligned = analysis.steps, analysis.stage_times, analysis.aligned
    if not steps:
        return []
    keys = sorted({key for times in stage_times for key in times})
    median_wall = statistics.median(s.user_wall_ms for s in steps)
    best: tuple[float, tuple[str, str]] | None = None
    for key in keys:
        ms = statistics.median(_ms(times.get(key, 0)) for times in stage_times)
        if best is None or ms > best[0]:
            best = (ms, key)
    if best is None or median_wall <= 0 or best[0] / median_wall < DOMINANT_MIN_SHARE:
        return []
    ms, (role, stage) = best
    where = " on the critical path" if aligned else " on its longest rank"
    text = (
        f"step {_duration(median_wall)} (median of {len(steps)}): {role} {stage} is {100 * ms / median_wall:.0f}% "
        f"of it ({_duration(ms)} a step{where}, median)"
    )
    generation = statistics.median(s.generation_ms for s in steps)
    if generation > 0 and stage not in GENERATION_STAGES and role != GENERATION_ROLE:
        text += f"; generation is {100 * generation / median_wall:.0f}% of the step"
    return [Finding("dominant_stage", text, ms, role, stage, None, tuple(s.step for s in steps))]


def slow_steps(analysis: TimelineAnalysis) -> list[Finding]:
    """The steps at least :data:`SLOW_STEP_RATIO` x the median step, naming the stage that grew most. Steps are the
    user's (the SDK's own time left out), and what a straggler added to a step is that straggler's finding."""
    steps, stage_times = analysis.steps, analysis.stage_times
    if len(steps) < SLOW_STEP_MIN_STEPS:
        return []
    median_wall = statistics.median(s.user_wall_ms for s in steps)
    if median_wall <= 0:
        return []
    added: dict[int, int] = defaultdict(int)  # step -> ns the stragglers added to it
    for straggler in analysis.stragglers:
        for _, _, record in straggler.stages:
            for step in record.slow_steps:
                added[step] = max(added[step], straggler.excess_on(step))
    slow = []
    for s, times in zip(steps, stage_times, strict=True):
        wall = s.user_wall_ms - _ms(added.get(s.step, 0))
        if wall >= SLOW_STEP_RATIO * median_wall and wall - median_wall >= FLOOR_MS:
            slow.append((s, times, wall))
    if not slow:
        return []
    slowest, slowest_times, slowest_wall = max(slow, key=lambda st: (st[2], -st[0].step))
    walls = ", ".join(_duration(wall) for _, _, wall in slow[:5])
    numbers = [s.step for s, _, _ in slow]
    traced = any(s.traced for s, _, _ in slow)
    labels = [f"{s.step} (traced)" if s.traced else str(s.step) for s, _, _ in slow]
    shown = ", ".join(labels[:5]) + (", \u2026" if len(labels) > 5 else "")
    without = " without instrument's own time" if traced else ""
    text = (
        f"step{'s' if len(slow) > 1 else ''} {shown} took {walls}{without}, "
        f"{'up to ' if len(slow) > 1 else ''}{slowest_wall / median_wall:.1f}{_TIMES} the median step "
        f"({_duration(median_wall)})"
    )
    if traced:
        text += " (a traced step's code also runs slower under the profiler)"
    grown = []
    for key, ns in slowest_times.items():
        typical = statistics.median(times.get(key, 0) for times in stage_times)
        grown.append((ns - typical, key))
    if grown:
        extra, (role, stage) = max(grown, key=lambda g: (g[0], g[1]))
        if extra > 0:
            text += f"; on step {slowest.step} the most extra was {role} {stage} (+{_duration(_ms(extra))})"
    lost = sum(wall - median_wall for _, _, wall in slow) / len(steps)
    return [Finding("slow_step", text, lost, None, None, None, tuple(numbers))]


def instrument_time(analysis: TimelineAnalysis) -> list[Finding]:
    """The SDK's own time on the traced steps (profiler start-up, stop, export), said so that no one takes it for
    the user's: every other finding leaves it out. Ranked last (:func:`rank`)."""
    steps = analysis.steps
    traced = [s for s in steps if s.instrument_ms >= FLOOR_MS]
    if not traced:
        return []
    parts = [f"{_duration(s.instrument_ms)} of step {s.step}'s {_duration(s.wall_ms)}" for s in traced[:3]]
    more = f" and {len(traced) - 3} more steps" if len(traced) > 3 else ""
    numbers = [s.step for s in traced]
    text = (
        f"step{'s' if len(traced) > 1 else ''} {_steps_text(numbers)} {'were' if len(traced) > 1 else 'was'} "
        f"traced: {', '.join(parts)}{more} is instrument's own work (profiler start-up, stop and export), "
        "not your code; the other findings leave it out"
    )
    lost = sum(s.instrument_ms for s in traced) / len(steps)
    return [Finding(INSTRUMENT_KIND, text, lost, None, None, None, tuple(numbers))]


for _rule in (stragglers, bubbles, dominant_stage, slow_steps, instrument_time):
    register_finding(_rule)
