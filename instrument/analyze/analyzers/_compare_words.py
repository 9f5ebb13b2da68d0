"""A comparison of two runs in sentences, in reading order (:func:`findings`; pure).

The step first, with the stage and op that made it slower ("candidate is 14% slower per step (0.81 \u2192 0.92 s,
12 steps each, beyond noise): update_actor +74 ms, aten::mm +61 ms"), then a change common to every stage, once
("every stage +27% (6 of 6 beyond noise): the machine, not a stage"), each reported change, largest first, with
the ranks it moved on and its causes ("update_actor +18% (412 \u2192 486 ms on all 8 ranks): aten::mm +61 ms"), what
did not change, idle shares that moved, stages with too few samples for a verdict, and what only one run holds
(ranks, roles, stages; hosts: runs from different machines).
"""

from __future__ import annotations

from collections.abc import Sequence

from instrument.analyze.analyzers._compare import TimelineSummary
from instrument.analyze.model import (
    Change,
    CompareFinding,
    MachineShift,
    Method,
    Overlap,
    TimelineComparison,
    Verdict,
)

__all__ = ["IDLE_CHANGE_POINTS", "findings"]

IDLE_CHANGE_POINTS = 5.0
"""A role's idle share that moved by this many percentage points is a finding."""


def _ms(value: float) -> str:
    """Three significant figures: ``412 ms``, ``1,234 ms``, ``3.21 ms``."""
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f} ms"
    if size >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms" if size >= 0.01 else f"{value:.3f} ms"


def _signed_ms(value: float) -> str:
    return ("+" if value >= 0 else "\u2212") + _ms(abs(value))


def _pair(before: float, after: float) -> str:
    """``0.81 \u2192 0.92 s`` (both at least 100 ms), else ``412 \u2192 486 ms``: the unit once."""
    if min(before, after) >= 100:
        return f"{before / 1000:.2f} \u2192 {after / 1000:.2f} s"
    return f"{_ms(before).removesuffix(' ms')} \u2192 {_ms(after)}"


def _pct(value: float | None) -> str:
    if value is None:
        return "new"
    sign = "+" if value >= 0 else "\u2212"
    return f"{sign}{abs(value):.0f}%" if abs(value) >= 10 else f"{sign}{abs(value):.1f}%"


def _counted(pair: tuple[int, int], word: str) -> str:
    return f"{pair[0]} {word} each" if pair[0] == pair[1] else f"{pair[0]} and {pair[1]} {word}"


def _ranks_words(change: Change) -> str:
    total = change.ranks[1]
    moved = change.moved_ranks
    if total <= 1:
        return f"on rank {moved[0]}" if moved else "on its rank"
    if len(moved) >= total:
        return f"on all {total} ranks"
    return f"on {len(moved)} of {total} ranks ({_rank_runs(moved)})" if moved else f"on none of {total} ranks alone"


def _name(change: Change, changes: Sequence[Change]) -> str:
    """The stage's name, with its role where another role has a stage of that name."""
    stage = change.stage or "step"
    if sum(1 for c in changes if c.stage == stage) > 1:
        return f"{change.role} {stage}"
    return stage


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "\u2026"


def _cause_words(change: Change) -> str:
    wanted = max(0.01, 0.05 * abs(change.delta_ms))  # a cause worth naming moved at least 5% as much
    named = [c for c in change.causes if abs(c.delta_ms) >= wanted][:3]
    parts = []
    for cause in named:
        tag = " (new)" if cause.status == "new" else " (vanished)" if cause.status == "vanished" else ""
        parts.append(f"{_short(cause.name)}{tag} {_signed_ms(cause.delta_ms)}")
    if not parts and change.causes_from and change.causes_from.startswith("traces"):
        return "no op or kernel of it moved by 5% of that"  # the time is between ops: Python, waits
    return ", ".join(parts)


def _top_words(step: Change, changes: Sequence[Change]) -> str:
    """The reported stage that moved the step most its way, and its top cause: ``: update_actor +74 ms, aten::mm
    +61 ms``; empty when none did."""
    way = [c for c in changes if c.significant and c.delta_ms * step.delta_ms > 0]
    if not way:
        return ""
    top = max(way, key=lambda c: (abs(c.delta_ms), c.label))
    named = [c for c in top.causes if c.delta_ms * top.delta_ms > 0]
    cause = ""
    if named:
        tag = " (new)" if named[0].status == "new" else " (vanished)" if named[0].status == "vanished" else ""
        cause = f", {_short(named[0].name)}{tag} {_signed_ms(named[0].delta_ms)}"
    return f": {_name(top, changes)} {_signed_ms(top.delta_ms)}{cause}"


def _machine_finding(machine: MachineShift) -> CompareFinding:
    """The machine-wide shift, said once."""
    who = "every stage" if machine.moved == machine.stages else f"{machine.moved} of {machine.stages} stages"
    beyond = f"{machine.along} of {machine.stages} beyond noise"
    return CompareFinding(
        "machine", f"{who} {_pct(machine.pct)} ({beyond}): the machine, not a stage; each stage is judged against it"
    )


def _step_finding(step: Change, method: Method, changes: Sequence[Change] = ()) -> CompareFinding:
    pair = _pair(step.baseline_ms, step.candidate_ms)
    counted = _counted(step.samples, "steps")
    if not any(step.samples):
        return CompareFinding("step", "no step times to compare in either run")
    if step.verdict == Verdict.TOO_FEW:
        text = (
            f"step time {pair} ({_pct(step.change_pct)}): too few steps "
            f"({step.samples[0]} and {step.samples[1]}; {method.min_samples} a side needed) for a verdict"
        )
    elif step.verdict == Verdict.CHANGED:
        way = "slower" if step.delta_ms > 0 else "faster"
        size = f"{abs(step.change_pct):.0f}%" if step.change_pct is not None else "much"
        text = f"candidate is {size} {way} per step ({pair}, {counted}, beyond noise){_top_words(step, changes)}"
    elif step.verdict == Verdict.SMALL:
        text = (
            f"step time {pair} ({_pct(step.change_pct)}, {counted}): beyond noise but under "
            f"the {method.min_change_pct:g}% that counts as a change"
        )
    else:
        text = f"step time unchanged within noise ({pair}, {_pct(step.change_pct)}, {counted})"
    return CompareFinding("step", text, step.delta_ms if step.verdict == Verdict.CHANGED else 0.0)


def findings(
    step: Change,
    changes: Sequence[Change],
    overlap: Overlap,
    timeline: TimelineComparison | None,
    method: Method,
    summaries: tuple[TimelineSummary | None, TimelineSummary | None] = (None, None),
    machine: MachineShift | None = None,
) -> tuple[CompareFinding, ...]:
    """The comparison in sentences, in reading order: the step (with the stage and op that moved it most), the
    machine-wide shift when common, each reported change (largest first), what did not change, idle shares
    that moved, stages without a verdict, what only one run holds."""
    out = [_step_finding(step, method, changes)]
    if machine is not None and machine.common:
        out.append(_machine_finding(machine))
    reported = [c for c in changes if c.significant]
    too_few = [c for c in changes if c.verdict == Verdict.TOO_FEW]
    for change in reported:
        causes = _cause_words(change)
        pair = f"{_ms(change.baseline_ms).removesuffix(' ms')} \u2192 {_ms(change.candidate_ms)}"
        if change.machine_pct is not None:  # judged against the machine: its own share first
            size = f"{_pct(change.relative_pct)} beyond the machine ({_pct(change.change_pct)} measured, {pair}"
        else:
            size = f"{_pct(change.change_pct)} ({pair}"
        text = f"{_name(change, changes)} {size} {_ranks_words(change)})" + (f": {causes}" if causes else "")
        out.append(CompareFinding("stage", text, change.delta_ms))
    judged = [c for c in changes if c.verdict != Verdict.TOO_FEW]
    if reported:
        rest = "Nothing else changed beyond noise"
        if len(judged) == len(reported):
            rest = "Every stage compared changed"
        out.append(CompareFinding("nothing_else", rest))
    elif judged:
        what = f"{len(judged)} stage{'s' if len(judged) != 1 else ''} compared"
        limits = f"\u03b1 = {method.alpha:g}, changes from {method.min_change_pct:g}%"
        beyond = " against the machine-wide shift" if machine is not None and machine.common else ""
        out.append(CompareFinding("nothing", f"No stage changed beyond noise{beyond} ({what}; {limits})"))
    elif not changes:
        out.append(CompareFinding("nothing", "no stage in both runs to compare"))
    if timeline is not None:
        for idle in timeline.roles:
            b, c = idle.baseline_pct, idle.candidate_pct
            if b is None or c is None or abs(c - b) < IDLE_CHANGE_POINTS:
                continue
            delta = _idle_per_lane(summaries[1], idle.role) - _idle_per_lane(summaries[0], idle.role)
            moved = f"{_signed_ms(delta)} per rank and step"
            text = f"{idle.role} ranks idle {b:.0f}% \u2192 {c:.0f}% of their step time ({moved})"
            out.append(CompareFinding("idle", text, delta))
    if too_few:
        listed = ", ".join(f"{_name(c, changes)} ({c.samples[0]} and {c.samples[1]})" for c in too_few[:8])
        more = f" and {len(too_few) - 8} more" if len(too_few) > 8 else ""
        out.append(
            CompareFinding(
                "too_few",
                f"too few samples for a verdict ({method.min_samples} a side needed) on {listed}{more}",
            )
        )
    out.extend(_mismatch(overlap))
    return tuple(out)


def _idle_per_lane(summary: TimelineSummary | None, role: str) -> float:
    if summary is None or not summary.lanes.get(role):
        return 0.0
    return summary.idle_ms.get(role, 0.0) / summary.lanes[role]


def _listed(labels: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(labels[:limit])
    return shown + (f" and {len(labels) - limit} more" if len(labels) > limit else "")


def _rank_runs(labels: Sequence[str]) -> str:
    numbers = [int(x) for x in labels if x.isdigit()]
    others = [x for x in labels if not x.isdigit()]
    runs: list[str] = []
    for n in sorted(numbers):
        if runs and "-" in runs[-1] and int(runs[-1].split("-")[1]) == n - 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{n}"
        elif runs and runs[-1].isdigit() and int(runs[-1]) == n - 1:
            runs[-1] = f"{runs[-1]}-{n}"
        else:
            runs.append(str(n))
    return _listed([*runs, *others])


def _mismatch(overlap: Overlap) -> list[CompareFinding]:
    out = []
    if overlap.machines_differ:
        hosts = f"baseline on {_listed(overlap.hosts[0])}; candidate on {_listed(overlap.hosts[1])}"
        out.append(CompareFinding("mismatch", f"the machines differ ({hosts}): a change may be the hardware's"))
    if overlap.only_baseline_ranks or overlap.only_candidate_ranks:
        common = len(overlap.common_ranks)
        both = f"the {common} ranks both ran" if common != 1 else "the one rank both ran"
        parts = [f"compared on {both} ({_rank_runs(overlap.common_ranks)})"]
        if overlap.only_baseline_ranks:
            parts.append(f"only in the baseline: {_rank_runs(overlap.only_baseline_ranks)}")
        if overlap.only_candidate_ranks:
            parts.append(f"only in the candidate: {_rank_runs(overlap.only_candidate_ranks)}")
        text = f"ranks differ ({overlap.ranks[0]} and {overlap.ranks[1]}): " + "; ".join(parts)
        out.append(CompareFinding("mismatch", text))
    for what, pairs in (
        ("roles", (overlap.only_baseline_roles, overlap.only_candidate_roles)),
        ("stages", (overlap.only_baseline_stages, overlap.only_candidate_stages)),
    ):
        b, c = pairs
        if not b and not c:
            continue
        names = [[x if isinstance(x, str) else f"{x[0]} {x[1]}" for x in side] for side in (b, c)]
        parts = []
        if names[0]:
            parts.append(f"only in the baseline: {_listed(names[0])}")
        if names[1]:
            parts.append(f"only in the candidate: {_listed(names[1])}")
        out.append(CompareFinding("mismatch", f"{what} not compared, " + "; ".join(parts)))
    return out
