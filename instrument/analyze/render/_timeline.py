"""The step timeline in words and rows: the findings first, then one row per step (wall, critical path, idle)."""

from __future__ import annotations

from instrument.analyze.model import Report, RoleTimeline, StepTimeline, TimeShare, findings_text
from instrument.analyze.render._words import ms

__all__ = ["FINDINGS_SHOWN", "STEP_HEADERS", "TRACED", "findings_lines", "step_rows"]

FINDINGS_SHOWN = 5
"""Findings printed before the tables (the JSON holds them all)."""
STEP_HEADERS = ("step", "wall ms", "instrument ms", "critical path", "idle by role")
"""The per-step table's columns: ``instrument ms`` is the SDK's own time in the step (a traced step's profiler start,
stop and export), never the user's stage time or idle."""
TRACED = "traced"
"""Beside a step's number, where a profiler recorded it (the step's time holds the profiler's cost)."""
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


def _idle(name: str, role: RoleTimeline) -> str:
    return f"{name} driver" if role.driver else f"{name} {role.idle_pct:.0f}%"


def step_rows(report: Report) -> list[list[str]]:
    """One row per step of the timeline: its number (marked when traced), wall time, the SDK's own time in it, the
    critical path's main parts, each role's idle share (a driver, which runs no stage, is named so, never idle)."""
    if report.timeline is None:
        return []
    return [
        [
            f"{step.step} {TRACED}" if step.traced else str(step.step),
            ms(step.wall_ms),
            ms(step.instrument_ms) if step.instrument_ms else "-",
            _path(step),
            " · ".join(_idle(name, role) for name, role in sorted(step.roles.items())),
        ]
        for step in report.timeline.steps
    ]
