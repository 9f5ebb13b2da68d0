"""Showing a :class:`~instrument.analyze.Report`: terminal table, PNG and HTML.

``rich`` and ``matplotlib`` are imported inside the functions that need them, so importing
``instrument.analyze`` stays light; without ``rich`` the table is plain text.  The picture
uses matplotlib's object API (``Figure`` + Agg canvas), never ``pyplot``, so it neither needs
a display nor changes the caller's matplotlib backend.

The PNG and the page are written to a new file beside the destination and renamed over it, never
through a symlink or into a FIFO (:func:`write_new_file`).  A stage keeps its colour from one
report to the next: it comes from a hash of its name (:func:`stage_colors`), not from its rank
in the sort.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import math
import os
import secrets
import stat
import statistics
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from instrument.analyze._report import Report, StageStats

__all__ = [
    "HEADERS",
    "UnsafeDestinationError",
    "clock_caveat",
    "hosts",
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


def _size(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count / 1e3:,.1f} kB"  # not "0.0 MB"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 rank``, ``2 ranks``, ``1,024 processes`` (``many``: an irregular plural)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


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


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """The table's cells as text, one row per step x role x stage, worst straggler first."""
    rows: list[tuple[str, ...]] = []
    for s in report.stages:
        compared = len(s.ranks) > 1  # one rank has no straggler: "-", not "0" and "1.00"
        rows.append(
            (
                str(s.step) if s.step else "-",
                s.role,
                s.stage + _windows(s),
                str(len(s.ranks)),
                _ms(s.median_ms),
                _ms(s.max_ms),
                s.straggler if compared else "-",
                "-" if s.ratio is None or not compared else f"{s.ratio:.2f}",
                _ms(s.minibatch_ms if any(r.mini_batches for r in s.ranks) else None),
                _ms(s.cpu_ms),
                _ms(s.kernel_ms),
                f"{s.events:,.0f}",
            )
        )
    return rows


def _summary(report: Report) -> tuple[str, list[str], list[str]]:
    """The headline, what the columns mean, and the notes (caveat, skipped files)."""
    jobs = f" with {plural(report.jobs, 'process', 'processes')}" if report.jobs > 1 else ""
    headline = (
        f"{plural(report.files, 'trace file')}, {_size(report.bytes)}, {plural(report.events, 'event')}, "
        f"{plural(len(report.steps), 'step')}, {plural(len(report.ranks), 'rank')}; "
        f"read in {report.elapsed_s:.2f} s{jobs}"
    )
    legend = ["ms: wall time of the stage range (median and max across ranks);"]
    if any(len(s.ranks) > 1 for s in report.stages):
        legend.append("slowest: the straggler rank, max/med: its time over the median;")
    if any(s.judged_by == "work" and len(s.ranks) > 1 for s in report.stages):
        # a rank waiting in a barrier for a slow peer has as long a wall time as the peer: say how we judged
        legend.append(
            "stragglers judged by work: time outside collectives (barrier, all_reduce), so the rank the others"
            " wait for is named, not the waiters; engines by execution time, not by their profiling window;"
        )
    legend.append("mini-batch, cpu op, gpu ms and events: medians across ranks; -: none in the traces.")
    notes = []
    caveat = clock_caveat(report)
    if caveat:
        notes.append(f"note: {caveat}")
    if report.skipped:
        notes.append(f"skipped {plural(len(report.skipped), 'file')}: see the lines above (stderr)")
    return headline, legend, notes


def _summary_lines(report: Report) -> list[str]:
    headline, legend, notes = _summary(report)
    return [headline, *legend, *notes]


def render_text(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The table with a short summary under it."""
    rows = table_rows(report)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        return _plain(rows, _summary_lines(report))
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
    for line in _summary_lines(report):
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

# Sixteen colours that stay apart side by side: ten strong hues, then six light ones (no two browns).
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#9edae5",
)  # fmt: skip


def _key(label: str) -> str:
    """How file names write a label: ``update_actor`` and ``update-actor`` get one colour."""
    from instrument import naming

    try:
        return naming.sanitize_label(label)
    except (TypeError, ValueError):
        return label


def stage_colors(series: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A colour per (role, stage): the palette entry the stage's name hashes to (crc32 of its label key,
    so the same in every process and every report). Of two series of one report that hash alike, the
    later by name takes the next free entry; past sixteen stages colours repeat."""
    colors: dict[tuple[str, str], str] = {}
    taken: set[int] = set()
    size = len(_PALETTE)
    for role, stage in sorted(set(series), key=lambda k: (_key(k[1]), _key(k[0]), k)):
        start = zlib.crc32(_key(stage).encode("utf-8")) % size
        slot = next(((start + i) % size for i in range(size) if (start + i) % size not in taken), start)
        taken.add(slot)
        colors[(role, stage)] = _PALETTE[slot]
    return colors


def _series_name(role: str, stage: str, roles: int) -> str:
    return stage if roles == 1 else f"{role}: {stage}"  # one role: naming it on every row says nothing


def _heatmap_rows(report: Report) -> tuple[list[str], list[tuple[str, str]], list[str], list[list[float]]]:
    """Row labels, each row's (role, stage), column labels (ranks) and wall ms (NaN where a rank has no trace)."""
    labels: dict[tuple[int, str], str] = {}
    for stage in report.stages:
        for r in stage.ranks:
            labels[(0, f"{r.rank:09d}") if r.rank is not None else (1, f"{r.replica or 0:09d}")] = r.label
    columns = [labels[k] for k in sorted(labels)]
    index = {label: i for i, label in enumerate(columns)}
    ordered = sorted(report.stages, key=lambda s: (s.step, s.role, s.stage))
    roles = len(report.roles)
    rows: list[str] = []
    keys: list[tuple[str, str]] = []
    values: list[list[float]] = []
    if len(ordered) <= _MAX_HEATMAP_ROWS:
        for stage in ordered:
            row = [math.nan] * len(columns)
            for r in stage.ranks:
                row[index[r.label]] = r.wall_ms
            rows.append(f"step {stage.step}  {_series_name(stage.role, stage.stage, roles)}")
            keys.append((stage.role, stage.stage))
            values.append(row)
        return rows, keys, columns, values
    # Too many steps for a row each: the mean over steps per role x stage.
    sums: dict[tuple[str, str], list[list[float]]] = {}
    for stage in ordered:
        acc = sums.setdefault((stage.role, stage.stage), [[] for _ in columns])
        for r in stage.ranks:
            acc[index[r.label]].append(r.wall_ms)
    for (role, name), acc in sorted(sums.items()):
        rows.append(f"{_series_name(role, name, roles)} (mean of steps)")
        keys.append((role, name))
        values.append([statistics.fmean(v) if v else math.nan for v in acc])
    return rows, keys, columns, values


def _figure(report: Report) -> Any:
    from matplotlib.figure import Figure

    rows, keys, columns, values = _heatmap_rows(report)
    colors = stage_colors((s.role, s.stage) for s in report.stages)
    height_a = 1.2 + 0.32 * max(len(rows), 1)
    fig = Figure(figsize=(max(10.0, 3.5 + 0.7 * len(columns)), height_a + 4.4), dpi=110, layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[height_a, 4.0])
    fig.suptitle(f"instrument analyze: {report.directory}", fontsize=11)
    top = fig.add_subplot(grid[0])
    if len(columns) == 1:
        _draw_one_rank(top, rows, [colors[k] for k in keys], columns[0], [row[0] for row in values])
    else:
        _draw_heatmap(fig, top, rows, columns, values)
    _draw_breakdown(fig.add_subplot(grid[1]), report, colors)
    return fig


def _rank_label(column: str) -> str:
    return f"rank {column}" if column.isdigit() else column


def _draw_one_rank(ax: Any, rows: list[str], colors: list[str], column: str, values: list[float]) -> None:
    """(a) for one rank: no straggler to find, so each stage's time as a bar in the stage's colour
    (a heatmap of one column would be one flat colour)."""
    widths = [0.0 if math.isnan(v) else v for v in values]
    positions = range(len(rows))
    ax.barh(positions, widths, color=colors, height=0.7)
    ax.set_yticks(positions, rows, fontsize=8)
    ax.invert_yaxis()  # first step at the top, as in the table's reading order
    right = max(widths, default=0.0) or 1.0
    for i, width in enumerate(widths):
        ax.text(width + right * 0.01, i, _ms(width), va="center", fontsize=7)
    ax.set_xlim(0, right * 1.12)  # room for the last label
    ax.set_xlabel("ms", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"(a) stage wall time, ms: one rank ({_rank_label(column)}), so no straggler to compare", fontsize=10)


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
    ax.set_xticks(range(len(columns)), [_rank_label(c) for c in columns], fontsize=8)
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


def _draw_breakdown(ax: Any, report: Report, colors: dict[tuple[str, str], str]) -> None:
    """(b) per step, the stages' times stacked (each stage's slowest rank), each stage in its own colour."""
    steps = sorted({s.step for s in report.stages})
    series: dict[tuple[str, str], dict[int, float]] = {}
    for stage in report.stages:
        series.setdefault((stage.role, stage.stage), {})[stage.step] = stage.max_ms
    order = sorted(series, key=lambda k: (-sum(series[k].values()), k))
    roles = len(report.roles)
    bottoms = [0.0] * len(steps)
    positions = list(range(len(steps)))
    for key in order:
        heights = [series[key].get(step, 0.0) for step in steps]
        name = _series_name(*key, roles)
        ax.bar(positions, heights, bottom=bottoms, label=name, color=colors[key], edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(positions, [f"step {s}" if s else "step ?" for s in steps])
    ax.set_ylabel("ms" if len(report.ranks) <= 1 else "ms (slowest rank of each stage)")
    ax.set_title("(b) per-step breakdown: stage wall time, stacked", fontsize=10)
    if order:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(3, len(order)), frameon=False)
    ax.grid(axis="y", alpha=0.3)


def png_bytes(report: Report) -> bytes:
    """The picture as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure(report)
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


class UnsafeDestinationError(OSError):
    """The destination is a symlink, a directory, a FIFO or another special file: nothing was written."""


_TEMP_ATTEMPTS = 100


def _check_destination(target: Path) -> None:
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"))
    kind = next((words for test, words in kinds if test(mode)), "a special file")
    raise UnsafeDestinationError(f"{target} is {kind}, not a regular file: refusing to write there")


def write_new_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all, never through a symlink.

    The bytes go to a new file beside ``path`` (created exclusively, not following links), which is
    renamed over ``path``; an existing regular file is replaced, a symlink or a non-regular file is
    refused with :class:`UnsafeDestinationError` (an ``OSError``). A reader never sees half a file.
    """
    target = Path(path)
    _check_destination(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_ATTEMPTS):
        temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 random names taken
        raise FileExistsError(f"no free temporary name beside {target}")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        # Checked again: a link planted while we wrote is refused (rename would replace the link, not
        # follow it, but the user asked for that path and should hear about it).
        _check_destination(target)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return target


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


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write one self-contained page: summary, table, skipped files and the picture inline (:func:`write_new_file`)."""
    esc = html.escape
    picture = base64.b64encode(png_bytes(report)).decode("ascii")
    colors = stage_colors((s.role, s.stage) for s in report.stages)
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADERS)
    body = []
    for row, stage in zip(table_rows(report), report.stages, strict=True):
        ratio = (stage.ratio or 0.0) if len(stage.ranks) > 1 else 0.0
        css = ' class="bad"' if ratio >= _BAD_RATIO else ' class="warn"' if ratio >= _WARN_RATIO else ""
        cells = []
        for cell, header in zip(row, HEADERS, strict=True):
            if header in _NUMERIC:
                cells.append(f'<td class="n">{esc(cell)}</td>')
            elif header == "stage":  # the stage's colour in the picture
                swatch = f'<span class="sw" style="background:{colors[(stage.role, stage.stage)]}"></span>'
                cells.append(f"<td>{swatch}{esc(cell)}</td>")
            else:
                cells.append(f"<td>{esc(cell)}</td>")
        body.append(f"<tr{css}>{''.join(cells)}</tr>")
    skipped = "".join(f"<li><code>{esc(s.path)}</code>: {esc(s.reason)}</li>" for s in report.skipped)
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
{f"<h2>Skipped files</h2><ul>{skipped}</ul>" if skipped else ""}
<h2>Picture</h2>
<img src="data:image/png;base64,{picture}" alt="stage time per rank and per-step breakdown">
</body></html>
"""
    return write_new_file(path, page.encode("utf-8"))
