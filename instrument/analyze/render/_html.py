"""One self-contained HTML page of a :class:`~instrument.analyze.Report` (:func:`write_html`).

The page holds the findings and the interactive step timeline (:mod:`._timeline_html`), the terminal's
cells (:mod:`._tables`), the skipped files and the picture (:mod:`._png`) inline; it is written whole,
never through a symlink or into a FIFO (:func:`~._destination.write_new_file`).
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from instrument.analyze._model import Report
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._png import png_bytes, report_colors
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
from instrument.analyze.render._timeline_html import timeline_section

__all__ = ["write_html"]

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 12px 0; }
th, td { padding: 3px 9px; border-bottom: 1px solid #ddd; white-space: nowrap; }
th { background: #f3f3f3; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.warn td { background: #fff6d6; } tr.bad td { background: #fde0dc; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 3px; }
.note { color: #555; }
.sw { display: inline-block; width: .8em; height: .8em; margin-right: 6px; border-radius: 2px; vertical-align: -1px; }
"""


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
        f'<h2>GPU time per rank</h2>\n<table class="gpu"><thead><tr>{head}</tr></thead><tbody>\n{body}\n'
        f'</tbody></table>\n<p class="note">{esc(GPU_LEGEND)}</p>\n'
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
            f"<h2>{esc(title)}</h2>\n<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
            f'<p class="note">{esc(legend)}</p>\n'
        )
    return "".join(out)


def _memory_section(report: Report) -> str:
    """The page's list of memory snapshots and timelines, or nothing."""
    if not report.memory:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in MEMORY_HEADERS)
    rows = memory_rows(report.memory)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    note = html.escape(HOW_TO_OPEN)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<h2>Memory files</h2>\n{table}\n<p class="note">{note}</p>\n'


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write one self-contained page: summary, the tables, skipped files and the picture inline
    (:func:`write_new_file`)."""
    esc = html.escape
    picture = base64.b64encode(png_bytes(report)).decode("ascii")
    colors = report_colors(report)  # one colour per stage in the table, the timeline and the picture
    columns = headers(report)
    head = "".join(f"<th>{esc(h)}</th>" for h in columns)
    body = []
    for row, stage in zip(table_rows(report), report.stages, strict=True):
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
    skipped = "".join(f"<li><code>{esc(s.path)}</code>: {esc(s.reason)}</li>" for s in report.skipped)
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
{timeline_section(report, colors)}<h2>Stages</h2>
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(body)}
</tbody></table>
{_gpu_section(report)}{_gpu_details_section(report)}
{_memory_section(report)}{f"<h2>Skipped files</h2><ul>{skipped}</ul>" if skipped else ""}
<h2>Picture</h2>
<img src="data:image/png;base64,{picture}" alt="{alt}">
</body></html>
"""
    return write_new_file(path, page.encode("utf-8"))
