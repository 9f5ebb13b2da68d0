"""Showing a :class:`~instrument.analyze.Comparison`: the terminal text (:func:`render_compare_text`) and one
self-contained page (:func:`write_compare_html`).

Both hold the same parts in the same order: the findings in words, the table of every (role, stage) both
runs hold, the causes of each reported change, the timeline's view before and after, what only one run
holds. Plain text and the standard library's ``html``: nothing optional is imported.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from instrument.analyze.model import Change, Comparison, Verdict
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._words import ms

__all__ = ["render_compare_text", "write_compare_html"]

_NAME_WIDTH = 60
_VERDICT_WORDS = {
    Verdict.CHANGED: "changed",
    Verdict.SMALL: "small (beyond noise)",
    Verdict.NOISE: "noise",
    Verdict.TOO_FEW: "too few samples",
    Verdict.MACHINE: "machine's",
}
_STAGE_HEADERS = ("role", "stage", "base ms", "cand ms", "change", "interval", "samples", "verdict", "source")
_MACHINE_HEADER = "vs machine"
"""The column of each stage's change beyond the machine-wide shift, shown only when one is common."""
_CAUSE_HEADERS = ("kind", "name", "base ms", "cand ms", "delta ms", "calls", "status")
_PATH_HEADERS = ("role", "stage", "base ms/step", "cand ms/step", "base share", "cand share")
_RIGHT = frozenset(
    {"base ms", "cand ms", "change", _MACHINE_HEADER, "interval", "samples", "delta ms", "calls", *_PATH_HEADERS[2:]}
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _interval(change: Change) -> str:
    """The interval of the ratio the verdict's test inverts: against the machine-wide shift where one was."""
    interval = change.relative_ci_pct if change.machine_pct is not None else change.ci_pct
    if interval is None:
        return "-"
    lo, hi = interval
    return f"[{lo:+.1f}, {hi:+.1f}]%"


def _cut(text: str, width: int = _NAME_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "-") + ms(abs(value))


def _against_machine(comparison: Comparison) -> bool:
    return comparison.machine is not None and comparison.machine.common


def _stage_headers(comparison: Comparison) -> tuple[str, ...]:
    if not _against_machine(comparison):
        return _STAGE_HEADERS
    return (*_STAGE_HEADERS[:5], _MACHINE_HEADER, *_STAGE_HEADERS[5:])


def _row(comparison: Comparison, change: Change, stage: str) -> tuple[str, ...]:
    cells = [
        change.role or "",
        stage,
        ms(change.baseline_ms),
        ms(change.candidate_ms),
        _pct(change.change_pct),
        _interval(change),
        f"{change.samples[0]} / {change.samples[1]}",
        _VERDICT_WORDS.get(change.verdict, change.verdict),
        change.source,
    ]
    if _against_machine(comparison):
        cells.insert(5, "-" if change.stage is None else _pct(change.relative_pct))
    return tuple(cells)


def _stage_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    return [_row(comparison, c, c.stage or "") for c in comparison.changes]


def _step_row(comparison: Comparison) -> tuple[str, ...]:
    return _row(comparison, comparison.step, "step (wall)")


def _cause_rows(change: Change) -> list[tuple[str, ...]]:
    return [
        (
            c.kind + (" (comm)" if c.communication else ""),
            _cut(c.name),
            ms(c.baseline_ms),
            ms(c.candidate_ms),
            _signed(c.delta_ms),
            f"{c.baseline_count:g} / {c.candidate_count:g}",
            c.status,
        )
        for c in change.causes
    ]


def _share_words(change: Change) -> list[str]:
    out = []
    for what, pair in (
        ("CPU blocked in collectives", change.comm_share),
        ("GPU time in communication kernels", change.kernel_comm_share),
    ):
        if pair is not None and any(v for v in pair):
            b, c = ("-" if v is None else f"{v:.1f}%" for v in pair)
            out.append(f"{what}: {b} \u2192 {c}")
    return out


def _path_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    timeline = comparison.timeline
    if timeline is None:
        return []
    return [
        (
            p.role or "",
            p.stage,
            ms(p.baseline_ms),
            ms(p.candidate_ms),
            f"{p.baseline_pct:.1f}%",
            f"{p.candidate_pct:.1f}%",
        )
        for p in timeline.critical_path
    ]


def _idle_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    timeline = comparison.timeline
    if timeline is None:
        return []
    shown = [("-" if v is None else f"{v:.1f}%") for r in timeline.roles for v in (r.baseline_pct, r.candidate_pct)]
    return [(r.role, shown[2 * i], shown[2 * i + 1]) for i, r in enumerate(timeline.roles)]


def _method_line(comparison: Comparison) -> str:
    m = comparison.method
    against = (
        "; stages judged against the machine-wide shift (the interval is vs machine)"
        if _against_machine(comparison)
        else ""
    )
    return (
        f"per (step, rank) stage durations; medians; Mann-Whitney U at alpha = {m.alpha:g} "
        f"({100 * (1 - m.alpha):g}% interval), a change is reported from {m.min_change_pct:g}%, "
        f"{m.min_samples} samples a side at least{against}"
    )


# --------------------------------------------------------------------------- text


def _plain(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if headers[i] in _RIGHT else cell.ljust(widths[i]) for i, cell in enumerate(cells)
        ]
        return (indent + "  ".join(parts)).rstrip()

    return [line(headers), indent + "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def render_compare_text(comparison: Comparison) -> str:
    """The comparison as terminal text: findings first, then the tables."""
    lines = [f"instrument compare: {comparison.baseline} \u2192 {comparison.candidate}", "", "Findings"]
    lines += [f"{i}. {f.text}." for i, f in enumerate(comparison.findings, 1)]
    lines += ["", "Stages", *_plain(_stage_headers(comparison), [_step_row(comparison), *_stage_rows(comparison)])]
    lines.append(_method_line(comparison))
    for change in comparison.significant:
        head = f"Causes: {change.label} {_pct(change.change_pct)}"
        lines += ["", head + (f" ({change.causes_from})" if change.causes_from else "")]
        if change.causes:
            lines += _plain(_CAUSE_HEADERS, _cause_rows(change), indent="  ")
        lines += [f"  {words}" for words in _share_words(change)]
        if change.causes_note:
            lines.append(f"  {change.causes_note}")
        if not change.causes and not change.causes_note:
            lines.append("  nothing inside it changed by itself")
    timeline = comparison.timeline
    if timeline is not None:
        steps = f"{timeline.steps[0]} and {timeline.steps[1]} steps"
        lines += ["", f"Timeline ({steps}): idle share of each role's rank-time"]
        lines += _plain(("role", "base idle", "cand idle"), _idle_rows(comparison), indent="  ")
        if timeline.critical_path:
            lines += ["", "Critical path, per step (mean)", *_plain(_PATH_HEADERS, _path_rows(comparison), indent="  ")]
        if timeline.note:
            lines.append(f"  {timeline.note}")
    if comparison.notes:
        lines += ["", *(f"note: {n}" for n in comparison.notes)]
    if comparison.skipped:
        lines.append(f"{len(comparison.skipped)} file(s) skipped by the analyses (named on stderr)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- html

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { padding: .2em .7em; border-bottom: 1px solid #ddd; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.changed td { background: #fde8e4; } tr.faster td { background: #e4f5e6; }
code { font-size: 90%; } .note { color: #666; }
"""


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], classes: Sequence[str] = ()) -> str:
    def cell(tag: str, head: str, text: str) -> str:
        kind = ' class="n"' if head in _RIGHT else ""
        return f"<{tag}{kind}>{html.escape(text)}</{tag}>"

    head = "".join(cell("th", h, h) for h in headers)
    body = []
    for i, row in enumerate(rows):
        kind = f' class="{classes[i]}"' if i < len(classes) and classes[i] else ""
        body.append(f"<tr{kind}>" + "".join(cell("td", headers[j], v) for j, v in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _row_class(change: Change) -> str:
    if not change.significant:
        return ""
    return "changed" if change.delta_ms > 0 else "faster"


def compare_html(comparison: Comparison) -> str:
    """The page's text."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>instrument compare: {e(comparison.baseline)} \u2192 {e(comparison.candidate)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>instrument compare</h1><p><code>{e(comparison.baseline)}</code> \u2192 "
        f"<code>{e(comparison.candidate)}</code></p>",
        "<h2>Findings</h2><ol>",
        *(f"<li>{e(f.text)}.</li>" for f in comparison.findings),
        "</ol><h2>Stages</h2>",
        _html_table(
            _stage_headers(comparison),
            [_step_row(comparison), *_stage_rows(comparison)],
            [_row_class(comparison.step), *(_row_class(c) for c in comparison.changes)],
        ),
        f"<p class='note'>{e(_method_line(comparison))}</p>",
    ]
    for change in comparison.significant:
        parts.append(f"<h2>Causes: {e(change.label)} {e(_pct(change.change_pct))}</h2>")
        if change.causes_from:
            parts.append(f"<p class='note'>{e(change.causes_from)}</p>")
        if change.causes:
            parts.append(_html_table(_CAUSE_HEADERS, _cause_rows(change)))
        parts += [f"<p>{e(words)}</p>" for words in _share_words(change)]
        if change.causes_note:
            parts.append(f"<p class='note'>{e(change.causes_note)}</p>")
    if comparison.timeline is not None:
        parts += ["<h2>Timeline: idle share per role</h2>"]
        parts.append(_html_table(("role", "base idle", "cand idle"), _idle_rows(comparison)))
        if comparison.timeline.critical_path:
            parts += ["<h2>Critical path, per step (mean)</h2>", _html_table(_PATH_HEADERS, _path_rows(comparison))]
        if comparison.timeline.note:
            parts.append(f"<p class='note'>{e(comparison.timeline.note)}</p>")
    if comparison.notes or comparison.skipped:
        parts.append("<h2>Notes</h2><ul>")
        parts += [f"<li>{e(n)}</li>" for n in comparison.notes]
        parts += [f"<li>skipped {e(p)}: {e(r)}</li>" for p, r in comparison.skipped]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_compare_html(comparison: Comparison, path: str | os.PathLike[str]) -> Path:
    """Write the page to ``path`` (whole, never through a symlink) and return it."""
    return write_new_file(path, compare_html(comparison).encode("utf-8"))
