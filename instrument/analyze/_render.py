"""Showing a :class:`~instrument.analyze.Report`: terminal table, PNG and HTML.

``rich`` and ``matplotlib`` are imported inside the functions that need them, so importing
``instrument.analyze`` stays light; without ``rich`` the table is plain text.  The picture
uses matplotlib's object API (``Figure`` + Agg canvas), never ``pyplot``, so it neither needs
a display nor changes the caller's matplotlib backend.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from instrument.analyze._report import Report, StageStats

__all__ = ["HEADERS", "png_bytes", "render_text", "table_rows", "write_html", "write_png"]

HEADERS = (
    "step",
    "role",
    "stage",
    "ranks",
    "median ms",
    "max ms",
    "slowest",
    "max/med",
    "mini-batch ms",
    "cpu op ms",
    "gpu ms",
    "events",
)
_NUMERIC = frozenset(HEADERS[3:8]) | frozenset(HEADERS[8:])
_WARN_RATIO = 1.2
_BAD_RATIO = 1.5
_MAX_HEATMAP_ROWS = 40


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


def _windows(stage: StageStats) -> str:
    parts = [f"mb{a}" if a == b else f"mb{a}-{b}" for a, b in stage.windows]
    if any(r.partial for r in stage.ranks):
        parts.append("partial")
    return f" [{','.join(parts)}]" if parts else ""


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """The table's cells as text, one row per step x role x stage, worst straggler first."""
    rows: list[tuple[str, ...]] = []
    for s in report.stages:
        rows.append(
            (
                str(s.step) if s.step else "-",
                s.role,
                s.stage + _windows(s),
                str(len(s.ranks)),
                _ms(s.median_ms),
                _ms(s.max_ms),
                s.straggler,
                "-" if s.ratio is None else f"{s.ratio:.2f}",
                _ms(s.minibatch_ms),
                _ms(s.cpu_ms),
                _ms(s.kernel_ms),
                f"{s.events:,.0f}",
            )
        )
    return rows


def _summary(report: Report) -> list[str]:
    ranks = report.ranks
    lines = [
        f"{report.files} trace files, {report.bytes / 1e6:,.1f} MB, {report.events:,} events, "
        f"{len(report.steps)} steps, {len(ranks)} ranks; read in {report.elapsed_s:.2f} s"
        + (f" with {report.jobs} processes" if report.jobs > 1 else ""),
        "ms: wall time of the stage range (median and max across ranks); slowest: the straggler rank,",
        "max/med: its time over the median; mini-batch, cpu op, gpu ms and events: medians across ranks.",
        f"note: {report.caveat}",
    ]
    if report.skipped:
        lines.append(f"skipped {len(report.skipped)} file(s): see the lines above (stderr)")
    return lines


def render_text(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The table with a short summary under it."""
    rows = table_rows(report)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        return _plain(rows, _summary(report))
    table = Table(title=f"instrument analyze: {report.directory}", title_justify="left", header_style="bold")
    for header in HEADERS:
        table.add_column(header, justify="right" if header in _NUMERIC else "left", overflow="fold")
    for row, stage in zip(rows, report.stages, strict=True):
        ratio = stage.ratio or 0.0
        style = "bold red" if ratio >= _BAD_RATIO else "yellow" if ratio >= _WARN_RATIO else None
        table.add_row(*(Text(cell) for cell in row), style=style)  # Text: "[mb2-3]" is no markup
    if not rows:
        table.add_row("-", "no trace found", *([""] * (len(HEADERS) - 2)))
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
    for line in _summary(report):
        console.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def _plain(rows: Sequence[tuple[str, ...]], footer: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if h in _NUMERIC else c.ljust(w) for c, w, h in zip(cells, widths, HEADERS, strict=True)
        ).rstrip()

    out = [line(HEADERS), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out + footer)


# --------------------------------------------------------------------------- picture


def _heatmap_rows(report: Report) -> tuple[list[str], list[str], list[list[float]]]:
    """Row labels, column labels (ranks) and wall ms (NaN where a rank has no trace)."""
    labels: dict[tuple[int, str], str] = {}
    for stage in report.stages:
        for r in stage.ranks:
            labels[(0, f"{r.rank:09d}") if r.rank is not None else (1, f"{r.replica or 0:09d}")] = r.label
    columns = [labels[k] for k in sorted(labels)]
    index = {label: i for i, label in enumerate(columns)}
    ordered = sorted(report.stages, key=lambda s: (s.step, s.role, s.stage))
    rows: list[str] = []
    values: list[list[float]] = []
    if len(ordered) <= _MAX_HEATMAP_ROWS:
        for stage in ordered:
            row = [math.nan] * len(columns)
            for r in stage.ranks:
                row[index[r.label]] = r.wall_ms
            rows.append(f"step {stage.step}  {stage.role}: {stage.stage}")
            values.append(row)
        return rows, columns, values
    # Too many steps for a row each: the mean over steps per role x stage.
    sums: dict[tuple[str, str], list[list[float]]] = {}
    for stage in ordered:
        acc = sums.setdefault((stage.role, stage.stage), [[] for _ in columns])
        for r in stage.ranks:
            acc[index[r.label]].append(r.wall_ms)
    for (role, name), acc in sorted(sums.items()):
        rows.append(f"{role}: {name} (mean of steps)")
        values.append([statistics.fmean(v) if v else math.nan for v in acc])
    return rows, columns, values


def _figure(report: Report) -> Any:
    from matplotlib.figure import Figure

    rows, columns, values = _heatmap_rows(report)
    height_a = 1.2 + 0.32 * max(len(rows), 1)
    fig = Figure(figsize=(max(10.0, 3.5 + 0.7 * len(columns)), height_a + 4.4), dpi=110, layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[height_a, 4.0])
    fig.suptitle(f"instrument analyze: {report.directory}", fontsize=11)
    _draw_heatmap(fig, fig.add_subplot(grid[0]), rows, columns, values)
    _draw_breakdown(fig.add_subplot(grid[1]), report)
    return fig


def _draw_heatmap(fig: Any, ax: Any, rows: list[str], columns: list[str], values: list[list[float]]) -> None:
    """(a) stage time per rank, coloured by time / median of the row's ranks; the straggler boxed."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    if not rows or not columns:
        ax.text(0.5, 0.5, "no traces", ha="center", va="center")
        ax.set_axis_off()
        return
    ratios = []
    for row in values:
        present = [v for v in row if not math.isnan(v)]
        med = statistics.median(present) if present else math.nan
        ratios.append([v / med if med and not math.isnan(v) else math.nan for v in row])
    top = max([r for row in ratios for r in row if not math.isnan(r)] + [1.5])
    norm = TwoSlopeNorm(vmin=min(0.5, 1 / top), vcenter=1.0, vmax=top)  # 3x slower and 3x faster: the same shade
    image = ax.imshow(ratios, aspect="auto", cmap="RdYlGn_r", norm=norm, interpolation="nearest")
    ax.set_xticks(range(len(columns)), [f"rank {c}" if c.isdigit() else c for c in columns], fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    annotate = len(rows) * len(columns) <= 600
    for i, row in enumerate(values):
        finite = [v for v in row if not math.isnan(v)]
        for j, value in enumerate(row):
            if annotate and not math.isnan(value):
                dark = not 0.2 <= norm(ratios[i][j]) <= 0.8  # the ends of the colour map are dark
                ax.text(j, i, _ms(value), ha="center", va="center", fontsize=7, color="white" if dark else "black")
        if len(finite) > 1:
            slowest = row.index(max(finite))
            if ratios[i][slowest] >= 1.1:
                ax.add_patch(Rectangle((slowest - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.01)
    bar.set_label("time / median of ranks", fontsize=8)
    ax.set_title("(a) stage wall time per rank, ms (boxed: the straggler, >= 1.1x the median)", fontsize=10)


def _draw_breakdown(ax: Any, report: Report) -> None:
    """(b) per step, the stages' times stacked (each stage's slowest rank)."""
    steps = sorted({s.step for s in report.stages})
    series: dict[str, dict[int, float]] = {}
    for stage in report.stages:
        series.setdefault(f"{stage.role}: {stage.stage}", {})[stage.step] = stage.max_ms
    order = sorted(series, key=lambda k: -sum(series[k].values()))
    bottoms = [0.0] * len(steps)
    colors = _palette(len(order))
    positions = list(range(len(steps)))
    for k, name in enumerate(order):
        heights = [series[name].get(step, 0.0) for step in steps]
        ax.bar(positions, heights, bottom=bottoms, label=name, color=colors[k], edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(positions, [f"step {s}" if s else "step ?" for s in steps])
    ax.set_ylabel("ms (slowest rank of each stage)")
    ax.set_title("(b) per-step breakdown: stage wall time, stacked", fontsize=10)
    if order:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(3, len(order)), frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _palette(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def png_bytes(report: Report) -> bytes:
    """The picture as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure(report)
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def write_png(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the picture to ``path``."""
    target = Path(path)
    data = png_bytes(report)
    target.write_bytes(data)
    return target


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
"""


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write one self-contained page: summary, table, skipped files and the picture inline."""
    esc = html.escape
    picture = base64.b64encode(png_bytes(report)).decode("ascii")
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADERS)
    body = []
    for row, stage in zip(table_rows(report), report.stages, strict=True):
        ratio = stage.ratio or 0.0
        css = ' class="bad"' if ratio >= _BAD_RATIO else ' class="warn"' if ratio >= _WARN_RATIO else ""
        cells = "".join(
            f'<td class="n">{esc(c)}</td>' if h in _NUMERIC else f"<td>{esc(c)}</td>"
            for c, h in zip(row, HEADERS, strict=True)
        )
        body.append(f"<tr{css}>{cells}</tr>")
    skipped = "".join(f"<li><code>{esc(s.path)}</code>: {esc(s.reason)}</li>" for s in report.skipped)
    lines = _summary(report)
    summary = "".join(f'<p class="note">{esc(line)}</p>' for line in (lines[0], " ".join(lines[1:3]), lines[3]))
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
{f"<h2>Skipped files</h2><ul>{skipped}</ul>" if skipped else ""}
<h2>Picture</h2>
<img src="data:image/png;base64,{picture}" alt="stage time per rank and per-step breakdown">
</body></html>
"""
    target = Path(path)
    target.write_text(page, encoding="utf-8")
    return target
