"""The step timeline in words and rows: the findings first, then one row per step (wall, critical path, idle)."""

from __future__ import annotations

from instrument.analyze.model import Report, StepTimeline, TimeShare, findings_text
from instrument.analyze.render._words import ms

__all__ = ["FINDINGS_SHOWN", "STEP_HEADERS", "findings_lines", "step_rows"]

FINDINGS_SHOWN = 5
"""Findings printed before the tables (the JSON holds them all)."""
STEP_HEADERS = ("step", "wall ms", "critical path", "idle by role")
_PATH_PARTS = 3  # the longest parts of a step's critical path, in time order


def findings_lines(report: Report) -> list[str]:
    """The findings, largest loss first, numbered; or why there is no timeline (nothing without one)."""
    timeline = report.timeline
    if timeline is None:
        return []
    lines = [f"{i}. {text}" for i, text in enumerate(findings_text(timeline, FINDINGS_SHOWN), start=1)]
    if timeline.clock.note:
        lines.append(timeline.clock.note)
    return lines or ["No finding: no straggler, bubble or dominant stage above the floors."]


def _part(part: TimeShare) -> str:
    who = part.role if part.rank is None else f"{part.role} r{part.rank}"
    return f"{who} {part.stage} {ms(part.ms)} ms"


def _path(step: StepTimeline) -> str:
    if not step.critical_path:
        return "-"
    longest = sorted(step.critical_path, key=lambda p: p.ms, reverse=True)[:_PATH_PARTS]
    shown = [p for p in step.critical_path if p in longest]  # time order, as on the path
    more = len(step.critical_path) - len(shown)
    return " → ".join(_part(p) for p in shown) + (f" (+{more} more)" if more else "")


def step_rows(report: Report) -> list[list[str]]:
    """One row per step of the timeline: wall time, the critical path's main parts, each role's idle share."""
    if report.timeline is None:
        return []
    return [
        [
            str(step.step),
            ms(step.wall_ms),
            _path(step),
            " · ".join(f"{name} {role.idle_pct:.0f}%" for name, role in sorted(step.roles.items())),
        ]
        for step in report.timeline.steps
    ]
