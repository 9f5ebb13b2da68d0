"""Showing a :class:`~instrument.analyze.Report`: terminal table, PNG and HTML.

``rich`` and ``matplotlib`` are imported inside the functions that need them, so importing
``instrument.analyze`` stays light; without ``rich`` the tables are plain text. The picture is
drawn by :mod:`._picture`; the PNG and the page are written whole, never through a symlink or
into a FIFO (:func:`~instrument.analyze._destination.write_new_file`).

Two tables: the stages (one row per step x role x stage, worst straggler first) and, when the
traces hold GPU work, GPU time per rank (:func:`gpu_rows`). Every ratio in the stage table can be
checked from figures on its row: when ranks are judged by work, the work figures are shown.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from instrument.analyze._destination import UnsafeDestinationError, write_new_file
from instrument.analyze._picture import png_bytes, stage_colors
from instrument.analyze._snapshots import HOW_TO_OPEN, MEMORY_HEADERS, memory_rows
from instrument.analyze._words import ms, pct, plural, size

if TYPE_CHECKING:
    from instrument.analyze._report import Report, StageStats

__all__ = [
    "GPU_HEADERS",
    "HEADERS",
    "UnsafeDestinationError",
    "clock_caveat",
    "gpu_rows",
    "headers",
    "hosts",
    "plural",
    "png_bytes",
    "render_text",
    "stage_colors",
    "table_rows",
    "write_html",
    "write_new_file",
    "write_png",
]

HEADERS = (
    "step",
    "role",
    "stage",
    "ranks",
    "median ms",
    "max ms",
    "work med ms",
    "work max ms",
    "slowest",
    "max/med",
    "mini-batch ms",
    "cpu op ms",
    "gpu ms",
    "events",
)
"""Every column; :func:`headers` leaves out those that would hold only ``-``."""
_WORK = ("work med ms", "work max ms")
GPU_HEADERS = ("rank", "step", "span ms", "compute ms", "communication ms", "memory ms", "idle ms", "overlap")
_LEFT = frozenset({"step", "role", "stage"})
_WARN_RATIO = 1.2
_BAD_RATIO = 1.5


def hosts(report: Report) -> frozenset[str] | None:
    """The hosts the report's traces come from, read from the SDK's file names; ``None`` when a name
    does not say (plain torch, verl or engine names)."""
    from instrument import naming

    found: set[str] = set()
    for stage in report.stages:
        for rank in stage.ranks:
            for path in rank.files:
                parsed = naming.parse_trace_name(os.path.basename(path))
                if parsed is None:
                    return None
                found.add(parsed.host)
    return frozenset(found)


def clock_caveat(report: Report) -> str | None:
    """The report's clock caveat when it applies: traces from more than one host, or from hosts the
    names do not give while more than one rank (or replica) is compared."""
    seen = hosts(report)
    if seen is not None:
        return report.caveat if len(seen) > 1 else None
    return report.caveat if any(len(s.ranks) > 1 for s in report.stages) else None


def _windows(stage: StageStats) -> str:
    parts = [f"mb{a}" if a == b else f"mb{a}-{b}" for a, b in stage.windows]
    if any(r.partial for r in stage.ranks):
        parts.append("partial")
    return f" [{','.join(parts)}]" if parts else ""


def _by_work(stage: StageStats) -> bool:
    return stage.judged_by == "work" and len(stage.ranks) > 1


def _has_mini_batches(report: Report) -> bool:
    return any(r.mini_batches for s in report.stages for r in s.ranks)


def headers(report: Report) -> tuple[str, ...]:
    """The stage table's columns for ``report``: the work pair only when some row is judged by work, the
    mini-batch column only when some trace holds mini-batches (a column of ``-`` only takes room)."""
    left_out: set[str] = set()
    if not any(_by_work(s) for s in report.stages):
        left_out.update(_WORK)
    if not _has_mini_batches(report):
        left_out.add("mini-batch ms")
    return tuple(h for h in HEADERS if h not in left_out)


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """The stage table's cells as text, in the columns of :func:`headers`, worst straggler first.

    ``max/med`` is ``work max ms / work med ms`` on a row judged by work, else ``max ms / median ms``:
    the ratio can always be checked from its row.
    """
    columns = headers(report)
    rows: list[tuple[str, ...]] = []
    for s in report.stages:
        compared = len(s.ranks) > 1  # one rank has no straggler: "-", not "0" and "1.00"
        by_work = _by_work(s)
        cells = {
            "step": str(s.step) if s.step else "-",
            "role": s.role,
            "stage": s.stage + _windows(s),
            "ranks": str(len(s.ranks)),
            "median ms": ms(s.median_ms),
            "max ms": ms(s.max_ms),
            "work med ms": ms(s.median_work_ms) if by_work else "-",
            "work max ms": ms(max(r.judged_ms for r in s.ranks)) if by_work else "-",
            "slowest": s.straggler if compared else "-",
            "max/med": "-" if s.ratio is None or not compared else f"{s.ratio:.2f}",
            "mini-batch ms": ms(s.minibatch_ms if any(r.mini_batches for r in s.ranks) else None),
            "cpu op ms": ms(s.cpu_ms),
            "gpu ms": ms(s.kernel_ms),
            "events": f"{s.events:,.0f}",
        }
        rows.append(tuple(cells[c] for c in columns))
    return rows


def _gpu_cell(part_us: Any, span_us: float) -> str:
    value = float(part_us or 0.0)
    return f"{ms(value / 1000.0)} ({pct(value, span_us)})"


def gpu_rows(report: Report) -> list[tuple[str, ...]]:
    """The GPU table's cells (:data:`GPU_HEADERS`): the whole trace of every rank (step ``all``), then
    each step's ranks; ms and, in brackets, % of the rank's GPU span. Empty for CPU-only traces."""
    order = sorted(report.gpu, key=lambda g: (g["step"] is not None, g["step"] or 0, g["rank"] is None, g["rank"] or 0))
    rows: list[tuple[str, ...]] = []
    for g in order:
        span = float(g["span_us"])
        overlap = g["comm_comp_overlap_pct"]
        rows.append(
            (
                "-" if g["rank"] is None else str(g["rank"]),
                "all" if g["step"] is None else str(g["step"]),
                ms(span / 1000.0),
                _gpu_cell(g["compute_us"], span),
                _gpu_cell(g["communication_us"], span),
                _gpu_cell(g["memory_us"], span),
                _gpu_cell(g["idle_us"], span),
                "-" if overlap is None else f"{overlap:.1f}%",
            )
        )
    return rows


_GPU_LEGEND = (
    "GPU (HTA's definitions): span: first to last GPU event; compute, communication (NCCL kernels) and memory"
    " (memcpy, memset): time each kind of GPU work runs, so they can overlap; idle: no GPU work; (%): of the span;"
    " overlap: the share of communication time during which compute runs too."
)


def _engine_notes(report: Report) -> list[str]:
    """One line per engine stage: what each replica rank did in its profiling window."""
    lines = []
    for stage in report.stages:
        if stage.stage != "engine" and not any(r.iterations for r in stage.ranks):
            continue
        parts = []
        for r in stage.ranks:
            if r.iterations == 0:
                parts.append(f"rank {r.label} idle (0 iterations in {r.wall_ms:,.1f} ms)")
                continue
            tokens = f", {plural(r.tokens, 'token')}" if r.tokens else ""
            parts.append(
                f"rank {r.label} {plural(r.iterations, 'iteration')}{tokens}, "
                f"{r.judged_ms:,.1f} ms in a {r.wall_ms:,.1f} ms window"
            )
        lines.append(f"{stage.role}/{stage.stage} step {stage.step}: " + "; ".join(parts))
    return lines


def _summary(report: Report) -> tuple[str, list[str], list[str]]:
    """The headline, what the columns mean, and the notes (caveat, skipped files)."""
    jobs = f" with {plural(report.jobs, 'process', 'processes')}" if report.jobs > 1 else ""
    headline = (
        f"{plural(report.files, 'trace file')}, {size(report.bytes)}, {plural(report.events, 'event')}, "
        f"{plural(len(report.steps), 'step')}, {plural(len(report.ranks), 'rank')}; "
        f"read in {report.elapsed_s:.2f} s{jobs}"
    )
    legend = ["ms: wall time of the stage range (median and max across ranks);"]
    by_work = any(_by_work(s) for s in report.stages)
    if any(len(s.ranks) > 1 for s in report.stages):
        ratio = "work max / work med where shown, else max / median" if by_work else "max / median"
        legend.append(f"slowest: the straggler rank, max/med: its time over the median ({ratio});")
    if by_work:
        # a rank waiting in a barrier for a slow peer has as long a wall time as the peer: say how we judged
        legend.append(
            "stragglers judged by work (work med / work max ms): time outside collectives (barrier, all_reduce), so"
            " the rank the others wait for is named, not the waiters; engines by execution time, not by their"
            " profiling window; -: judged by wall time;"
        )
    medians = "mini-batch, cpu op, gpu ms" if _has_mini_batches(report) else "cpu op, gpu ms"
    legend.append(f"{medians} and events: medians across ranks; -: none in the traces.")
    notes = _engine_notes(report)
    caveat = clock_caveat(report)
    if caveat:
        notes.append(f"note: {caveat}")
    if report.skipped:
        notes.append(f"skipped {plural(len(report.skipped), 'file')}: see the lines above (stderr)")
    return headline, legend, notes


def render_text(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The stage table with a short summary under it, then the GPU table when there is GPU work."""
    columns = headers(report)
    rows = table_rows(report)
    headline, legend, notes = _summary(report)
    gpu = gpu_rows(report)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        text = _plain(columns, rows, [headline, *legend])
        if gpu:
            text += "\n\nGPU time per rank\n" + _plain(GPU_HEADERS, gpu, [_GPU_LEGEND])
        if report.memory:
            text += "\n\nMemory files\n" + _plain(MEMORY_HEADERS, memory_rows(report.memory), [HOW_TO_OPEN])
        return "\n".join([text, *notes])
    table = Table(title=f"instrument analyze: {report.directory}", title_justify="left", header_style="bold")
    # Labels up to 32 characters stay on one line and the numbers' headers wrap instead ("work med" over
    # "ms" reads better than a stage name cut in three); a longer label folds.
    longest = {h: max((len(r[i]) for r in rows), default=0) for i, h in enumerate(columns)}
    for header in columns:
        whole = header in ("role", "stage") and longest[header] <= 32
        table.add_column(header, justify="left" if header in _LEFT else "right", overflow="fold", no_wrap=whole)
    for row, stage in zip(rows, report.stages, strict=True):
        ratio = stage.ratio or 0.0
        style = "bold red" if ratio >= _BAD_RATIO else "yellow" if ratio >= _WARN_RATIO else None
        table.add_row(*(Text(cell) for cell in row), style=style)  # Text: "[mb2-3]" is no markup
    if not rows:
        table.add_row("-", "no trace found", *([""] * (len(columns) - 2)))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 160,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
    )
    console.print(table)
    for line in (headline, *legend):
        console.print(line, markup=False)
    if gpu:
        small = Table(title="GPU time per rank", title_justify="left", header_style="bold")
        for header in GPU_HEADERS:
            small.add_column(header, justify="left" if header == "step" else "right")
        for row in gpu:
            small.add_row(*(Text(cell) for cell in row))
        console.print()
        console.print(small)
        console.print(_GPU_LEGEND, markup=False)
    if report.memory:  # CUDA snapshots and CPU memory timelines beside the traces
        files = Table(title="Memory files", title_justify="left", header_style="bold")
        for header in MEMORY_HEADERS:
            files.add_column(header, justify="right" if header in ("step", "rank", "size") else "left")
        for row in memory_rows(report.memory):
            files.add_row(*(Text(cell) for cell in row))
        console.print()
        console.print(files)
        console.print(HOW_TO_OPEN, markup=False)
    for line in notes:
        console.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def _plain(columns: Sequence[str], rows: Sequence[tuple[str, ...]], footer: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if h in _LEFT else c.rjust(w) for c, w, h in zip(cells, widths, columns, strict=True)
        ).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out + footer)


def write_png(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the picture to ``path`` (:func:`write_new_file`)."""
    return write_new_file(path, png_bytes(report))


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
    return f"<td>{html.escape(cell)}</td>" if header in _LEFT else f'<td class="n">{html.escape(cell)}</td>'


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
        f'</tbody></table>\n<p class="note">{esc(_GPU_LEGEND)}</p>\n'
    )


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
    colors = stage_colors((s.role, s.stage) for s in report.stages)
    columns = headers(report)
    head = "".join(f"<th>{esc(h)}</th>" for h in columns)
    body = []
    for row, stage in zip(table_rows(report), report.stages, strict=True):
        ratio = (stage.ratio or 0.0) if len(stage.ranks) > 1 else 0.0
        css = ' class="bad"' if ratio >= _BAD_RATIO else ' class="warn"' if ratio >= _WARN_RATIO else ""
        cells = []
        for cell, header in zip(row, columns, strict=True):
            if header not in _LEFT:
                cells.append(f'<td class="n">{esc(cell)}</td>')
            elif header == "stage":  # the stage's colour in the picture
                swatch = f'<span class="sw" style="background:{colors[(stage.role, stage.stage)]}"></span>'
                cells.append(f"<td>{swatch}{esc(cell)}</td>")
            else:
                cells.append(f"<td>{esc(cell)}</td>")
        body.append(f"<tr{css}>{''.join(cells)}</tr>")
    skipped = "".join(f"<li><code>{esc(s.path)}</code>: {esc(s.reason)}</li>" for s in report.skipped)
    alt = "stage time per rank, per-step breakdown" + (" and GPU time per rank" if report.gpu else "")
    headline, legend, notes = _summary(report)
    summary = "".join(f'<p class="note">{esc(line)}</p>' for line in (headline, " ".join(legend), *notes))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>instrument analyze: {esc(report.directory)}</title>
<style>{_CSS}</style></head>
<body>
<h1>instrument analyze</h1>
<p><code>{esc(report.directory)}</code></p>
{summary}
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(body)}
</tbody></table>
{_gpu_section(report)}{_memory_section(report)}{f"<h2>Skipped files</h2><ul>{skipped}</ul>" if skipped else ""}
<h2>Picture</h2>
<img src="data:image/png;base64,{picture}" alt="{alt}">
</body></html>
"""
    return write_new_file(path, page.encode("utf-8"))
