"""One self-contained HTML page of a :class:`~instrument.analyze.Report` (:func:`write_html`).

The page holds the findings and the interactive step timeline (:mod:`._timeline_html`), the terminal's
cells (:mod:`._tables`), the skipped files and the picture (:mod:`._png`) inline; it is written whole,
never through a symlink or into a FIFO (:func:`~._destination.write_new_file`).
"""

from __future__ import annotations

import base64
import html
import os
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from instrument.analyze.model import Report
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._png import png_bytes, report_colors, windows_label
from instrument.analyze.render._tables import (
    BAD_RATIO,
    GPU_HEADERS,
    GPU_LEGEND,
    HOW_TO_OPEN,
    IDLE_HEADERS,
    IDLE_LEGEND,
    KERNEL_HEADERS,
    KERNEL_LEGEND,
    LEFT,
    MEMORY_HEADERS,
    WARN_RATIO,
    gpu_rows,
    headers,
    idle_rows,
    kernel_rows,
    memory_rows,
    shown_ratio,
    summary,
    table_rows,
)
from instrument.analyze.render._timeline_html import DIV_ID, MIN_WIDTH_PX, timeline_section
from instrument.analyze.render._words import ms, plural

__all__ = ["MAX_LINKED_FILES", "write_html"]

MAX_LINKED_FILES = 2000
"""Trace files the page links (the rest are counted): a link a file keeps the page small at thousands of ranks."""

# The page never scrolls sideways: a table wider than the window scrolls in its own box (div.table), long cells of
# words wrap (td.w, th, the run's facts), the chart keeps MIN_WIDTH_PX in a box of its own, long words break.
_CSS = (
    """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; overflow-wrap: break-word; }
div.table { overflow-x: auto; margin: 12px 0; }
table { border-collapse: collapse; }
th, td { padding: 3px 9px; border-bottom: 1px solid #ddd; white-space: nowrap; }
th { background: #f3f3f3; text-align: left; white-space: normal; vertical-align: bottom; }
td.w, table.facts td { white-space: normal; min-width: 14em; }
div.timeline { overflow-x: auto; }
"""
    + f"#{DIV_ID} {{ min-width: {MIN_WIDTH_PX}px; }}"
    + """
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.warn td { background: #fff6d6; } tr.bad td { background: #fde0dc; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 3px; }
.note { color: #555; }
table.facts th { background: none; font-weight: 600; } table.ops td { vertical-align: top; }
details summary h2 { display: inline; } a { color: #1f5fa8; }
.sw { display: inline-block; width: .8em; height: .8em; margin-right: 6px; border-radius: 2px; vertical-align: -1px; }
"""
)


def _td(cell: str, header: str) -> str:
    return f"<td>{html.escape(cell)}</td>" if header in LEFT else f'<td class="n">{html.escape(cell)}</td>'


def _gpu_section(report: Report) -> str:
    """The page's GPU table (the terminal's numbers), or nothing for CPU-only traces."""
    rows = gpu_rows(report)
    if not rows:
        return ""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in GPU_HEADERS)
    body = "".join("<tr>" + "".join(_td(c, h) for c, h in zip(r, GPU_HEADERS, strict=True)) + "</tr>" for r in rows)
    return (
        f'<h2>GPU time per rank</h2>\n<div class="table"><table class="gpu"><thead><tr>{head}</tr></thead><tbody>\n'
        f'{body}\n</tbody></table></div>\n<p class="note">{esc(GPU_LEGEND)}</p>\n'
    )


def _gpu_details_section(report: Report) -> str:
    """The page's tables of time by kernel type, idle split and launch delay, and of the top kernels."""
    esc = html.escape
    out = []
    for title, columns, rows, legend in (
        ("GPU kernels and idle time per rank", IDLE_HEADERS, idle_rows(report), IDLE_LEGEND),
        ("Top kernels per rank", KERNEL_HEADERS, kernel_rows(report), KERNEL_LEGEND),
    ):
        if not rows:
            continue
        head = "".join(f"<th>{esc(h)}</th>" for h in columns)
        body = "".join("<tr>" + "".join(_td(c, h) for c, h in zip(r, columns, strict=True)) + "</tr>" for r in rows)
        out.append(
            f'<h2>{esc(title)}</h2>\n<div class="table"><table><thead><tr>{head}</tr></thead><tbody>\n{body}\n'
            "</tbody></table></div>\n"
            f'<p class="note">{esc(legend)}</p>\n'
        )
    return "".join(out)


def _link(path: str, here: Path, text: str | None = None) -> str:
    """A link to ``path`` relative to the page's folder (the page and the traces move together), its name shown."""
    target = os.path.relpath(os.path.abspath(path), here)
    shown = os.path.basename(path) if text is None else text
    title = html.escape(os.path.basename(path), quote=True)
    return f'<a href="{html.escape(quote(target), quote=True)}" title="{title}">{html.escape(shown)}</a>'


def _memory_section(report: Report, here: Path) -> str:
    """The page's table of memory snapshots and timelines (the text's), each file linked, or nothing."""
    if not report.memory:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in MEMORY_HEADERS)
    body = []
    for f, row in zip(report.memory, memory_rows(report.memory), strict=True):
        cells = [f"<td>{html.escape(c)}</td>" for c in row[:-1]] + [f"<td>{_link(f.path, here)}</td>"]
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = html.escape(HOW_TO_OPEN)
    table = f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    return f'<h2>Memory files</h2>\n{table}\n<p class="note">{note}</p>\n'


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ranges(values: tuple[int, ...]) -> str:
    """``0-3, 5``."""
    out: list[str] = []
    for value in values:
        if out and value == int(out[-1].rpartition("-")[2]) + 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{value}"
        else:
            out.append(str(value))
    return ", ".join(out)


def _run_section(report: Report) -> str:
    """The run's facts (:attr:`Report.run`): hosts, dates, tools, roles, steps, mode, windows; nothing without them."""
    run = report.run
    if run is None:
        return ""
    facts: list[tuple[str, str]] = []
    if run.hosts:
        facts.append(("hosts", ", ".join(run.hosts)))
    if run.first_ns is not None and run.last_ns is not None:
        when = _utc(run.first_ns) if run.first_ns == run.last_ns else f"{_utc(run.first_ns)} to {_utc(run.last_ns)}"
        facts.append(("traces written", when))
    if run.tools:
        facts.append(("tool", ", ".join(run.tools)))
    for role, world, ranks in run.roles:
        of = f" of world size {world}" if world else ""
        which = f" ({_ranges(ranks)})" if ranks else ""
        facts.append((f"role {role}", f"{plural(len(ranks), 'rank')} traced{which}{of}"))
    if run.steps:
        facts.append(("steps traced", _ranges(run.steps)))
    if run.modes:
        facts.append(("mode", " and ".join(run.modes)))
    if run.windows:
        facts.append(("mini-batch windows", ", ".join(f"mb{a}" if a == b else f"mb{a}-{b}" for a, b in run.windows)))
    special = [f"{plural(run.triggered, 'file')} by a trigger"] if run.triggered else []
    special += [f"{plural(run.partial, 'partial window')}"] if run.partial else []
    if special:
        facts.append(("also", ", ".join(special)))
    facts.append(("manifests", str(run.manifests)))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return f'<h2>Run</h2>\n<div class="table"><table class="facts"><tbody>{body}</tbody></table></div>\n'


def _ops_section(report: Report, colors: dict[tuple[str, str], str], here: Path) -> str:
    """Each role's stage's top ops by self time (:attr:`Report.stage_ops`), from the files of one instance."""
    if not report.stage_ops:
        return ""
    esc = html.escape
    body = []
    for entry in report.stage_ops:
        swatch = f'<span class="sw" style="background:{colors.get((entry.role, entry.stage), "#7f7f7f")}"></span>'
        step = "-" if entry.step is None else str(entry.step)
        rank = f"rank {entry.rank}" if entry.rank.isdigit() else entry.rank
        source = ", ".join(
            _link(f, here, f"{rank}, step {step}" if len(entry.files) == 1 else None) for f in entry.files
        )
        label = f"<td rowspan={max(1, len(entry.ops))}>{swatch}{esc(entry.role)}: {esc(entry.stage)}<br>"
        label += f'<span class="note">{source}</span></td>'
        if not entry.ops:
            body.append(f'<tr>{label}<td colspan=3 class="note">no cpu ops in the trace</td></tr>')
        for i, (name, spent, calls) in enumerate(entry.ops):
            cells = f'<td><code>{esc(name)}</code></td><td class="n">{esc(ms(spent))}</td><td class="n">{calls:,}</td>'
            body.append(f"<tr>{label if i == 0 else ''}{cells}</tr>")
    head = "<tr><th>stage (trace read)</th><th>op</th><th>self ms</th><th>calls</th></tr>"
    note = (
        "self time: an op's time less that of the ops directly inside it; from the trace of each stage's slowest"
        " rank in its last step"
    )
    return (
        f'<h2>Top ops per stage</h2>\n<div class="table"><table class="ops"><thead>{head}</thead><tbody>'
        f"{''.join(body)}</tbody></table></div>\n"
        f'<p class="note">{esc(note)}</p>\n'
    )


def _files_section(report: Report, here: Path) -> str:
    """Every trace file read, linked relative to the page, per stage row (the first :data:`MAX_LINKED_FILES`)."""
    esc = html.escape
    items: list[str] = []
    linked = total = 0
    for stage in report.pipeline:
        links = []
        for r in stage.ranks:
            for f in r.files:
                total += 1
                if linked < MAX_LINKED_FILES:
                    linked += 1
                    links.append(_link(f, here, f"rank {r.label}" if r.rank is not None else r.label))
        if links:
            step = "-" if stage.step is None else str(stage.step)
            what = f"step {step} {stage.role}: {stage.stage}{windows_label(stage.windows)}"
            items.append(f"<li>{esc(what)}: {' '.join(links)}</li>")
    if not items:
        return ""
    more = f'<p class="note">and {total - linked:,} more files</p>' if total > linked else ""
    return (
        f"<details><summary><h2>Trace files ({total:,})</h2></summary>\n<ul>{''.join(items)}</ul>{more}"
        '\n<p class="note">links are relative to this page: keep it beside the analysed folder as it was written,'
        " or open the files in Perfetto (ui.perfetto.dev)</p></details>\n"
    )


def _skipped_section(report: Report) -> str:
    esc = html.escape
    items = "".join(f"<li><code>{esc(s.path)}</code>: {esc(s.reason)}</li>" for s in report.skipped)
    return f"<h2>Skipped files ({len(report.skipped):,})</h2><ul>{items}</ul>\n" if items else ""


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write one self-contained page: summary, the tables, skipped files and the picture inline
    (:func:`write_new_file`)."""
    esc = html.escape
    picture = base64.b64encode(png_bytes(report)).decode("ascii")
    here = Path(os.path.abspath(path)).parent  # links to the traces are relative to the page
    colors = report_colors(report)  # one colour per stage in the table, the timeline and the picture
    columns = headers(report)
    head = "".join(f"<th>{esc(h)}</th>" for h in columns)
    body = []
    stages = report.pipeline  # in the order they ran, as the text shows them
    for row, stage in zip(table_rows(report, stages), stages, strict=True):
        ratio = shown_ratio(stage)
        css = ' class="bad"' if ratio >= BAD_RATIO else ' class="warn"' if ratio >= WARN_RATIO else ""
        cells = []
        for cell, header in zip(row, columns, strict=True):
            if header not in LEFT:
                cells.append(f'<td class="n">{esc(cell)}</td>')
            elif header == "stage":  # the stage's colour in the picture
                swatch = f'<span class="sw" style="background:{colors[(stage.role, stage.stage)]}"></span>'
                cells.append(f"<td>{swatch}{esc(cell)}</td>")
            else:
                cells.append(f"<td>{esc(cell)}</td>")
        body.append(f"<tr{css}>{''.join(cells)}</tr>")
    alt = "stage time per rank, per-step breakdown" + (" and GPU time per rank" if report.gpu else "")
    headline, legend, notes = summary(report)
    notes_html = "".join(f'<p class="note">{esc(line)}</p>' for line in (headline, " ".join(legend), *notes))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>instrument analyze: {esc(report.directory)}</title>
<style>{_CSS}</style></head>
<body>
<h1>instrument analyze</h1>
<p><code>{esc(report.directory)}</code></p>
{notes_html}
{_run_section(report)}{timeline_section(report, colors)}<h2>Stages</h2>
<div class="table"><table><thead><tr>{head}</tr></thead><tbody>
{"".join(body)}
</tbody></table></div>
{_ops_section(report, colors, here)}{_gpu_section(report)}{_gpu_details_section(report)}
{_memory_section(report, here)}{_skipped_section(report)}{_files_section(report, here)}
<h2>Picture</h2>
<img src="data:image/png;base64,{picture}" alt="{alt}">
</body></html>
"""
    return write_new_file(path, page.encode("utf-8"))
