"""The picture of a :class:`~instrument.analyze.Report` (:func:`write_png`): (a) stage time per rank,
(b) the per-step breakdown of stages, when the traces hold GPU work (c) GPU time per rank,
(d) its idle time split by cause and (e) the kernels that take the most time, and when the run wrote a
step timeline (f) its lanes by rank, grouped by role, steps shaded (role bands at scale, :mod:`._lanes`).

matplotlib's object API (``Figure`` + Agg canvas), never ``pyplot``: no display needed and the caller's
backend untouched; matplotlib is imported only when a picture is drawn. A stage keeps its colour from
one report to the next: it comes from a hash of its name (:func:`stage_colors`), not from its place in
the sort. The PNG is written whole, never through a symlink or into a FIFO
(:func:`~._destination.write_new_file`).
"""

from __future__ import annotations

import io
import math
import os
import statistics
import zlib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from instrument.analyze.model import GENERATION_STAGES, Report, StageStats, label_key
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._lanes import TimelineView, labelled_steps, nesting_depths, steps_within, timeline_view
from instrument.analyze.render._words import ms

__all__ = [
    "gpu_parts",
    "pipeline_order",
    "png_bytes",
    "report_colors",
    "shown_ms",
    "stage_colors",
    "windows_label",
    "write_png",
]

_MAX_HEATMAP_ROWS = 40

_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#9edae5",
)  # fmt: skip


_GENERATING = frozenset(label_key(name) for name in GENERATION_STAGES)


def stage_colors(series: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A colour per (role, stage): the palette entry the stage's name hashes to (crc32 of its label key,
    so the same in every process and every report, and ``update_actor`` and ``update-actor`` get one).
    Of two series of one report that hash alike, the later by name takes the next free entry; past
    sixteen stages colours repeat."""
    colors: dict[tuple[str, str], str] = {}
    taken: set[int] = set()
    size = len(_PALETTE)
    for role, stage in sorted(set(series), key=lambda k: (label_key(k[1]), label_key(k[0]), k)):
        start = zlib.crc32(label_key(stage).encode("utf-8")) % size
        slot = next(((start + i) % size for i in range(size) if (start + i) % size not in taken), start)
        taken.add(slot)
        colors[(role, stage)] = _PALETTE[slot]
    return colors


def report_colors(report: Report) -> dict[tuple[str, str], str]:
    """:func:`stage_colors` of every stage of the report: the traces' and the timeline's, so a stage has one
    colour in the table, the timeline and the picture."""
    keys = {(s.role, s.stage) for s in report.stages}
    if report.timeline_spans is not None:
        for lane in report.timeline_spans.lanes:
            keys.update((role, stage) for kind, role, stage in lane.names if kind == "stage")
    return stage_colors(keys)


def shown_ms(stage: StageStats) -> float:
    """What a bar draws for a stage: its slowest rank by what the table judges (work where it judges by work),
    so an engine counts its execution, not the window that an engine and its frontend share."""
    return max(r.judged_ms for r in stage.ranks) if stage.judged_by == "work" and stage.ranks else stage.max_ms


def pipeline_order(report: Report) -> dict[tuple[str, str], int]:
    """Each (role, stage), by label keys, numbered by its first row in :attr:`Report.pipeline` (the order the
    stages ran in): one order for the series that span steps."""
    order: dict[tuple[str, str], int] = {}
    for stage in report.pipeline:
        order.setdefault((label_key(stage.role), label_key(stage.stage)), len(order))
    return order


def _order_key(order: dict[tuple[str, str], int], role: str, stage: str) -> tuple[int, str, str]:
    return (order.get((label_key(role), label_key(stage)), len(order)), role, stage)


def windows_label(windows: Iterable[tuple[int, int]], partial: bool = False) -> str:
    """`` [mb2-3]`` for the mini-batch windows a row's traces hold, as the table writes it; empty for none."""
    parts = [f"mb{a}" if a == b else f"mb{a}-{b}" for a, b in sorted(set(windows))]
    if partial:
        parts.append("partial")
    return f" [{','.join(parts)}]" if parts else ""


def _row_windows(stage: StageStats) -> str:
    return windows_label(stage.windows, any(r.partial for r in stage.ranks))


def _step_label(step: int | None) -> str:
    return "step -" if step is None else f"step {step}"


def _series_name(role: str, stage: str, roles: int) -> str:
    return stage if roles == 1 else f"{role}: {stage}"  # one role: naming it on every row says nothing


def _heatmap_rows(
    report: Report, judged: bool = False, order: dict[tuple[str, str], int] | None = None
) -> tuple[list[str], list[StageStats], list[str], list[list[float]]]:
    """Row labels, each row's stage (one per step, or past :data:`_MAX_HEATMAP_ROWS` the first of each role x
    stage), column labels (ranks) and ms (NaN where a rank has no trace): wall time, or with ``judged`` what
    the table judges stragglers by (work where the row has it). Rows in pipeline order within each step."""
    labels: dict[tuple[int, str], str] = {}
    for stage in report.stages:
        for r in stage.ranks:
            labels[(0, f"{r.rank:09d}") if r.rank is not None else (1, f"{r.replica or 0:09d}")] = r.label
    columns = [labels[k] for k in sorted(labels)]
    index = {label: i for i, label in enumerate(columns)}
    order = pipeline_order(report) if order is None else order
    ordered = report.pipeline
    roles = len(report.roles)
    rows: list[str] = []
    keys: list[StageStats] = []
    values: list[list[float]] = []
    if len(ordered) <= _MAX_HEATMAP_ROWS:
        for stage in ordered:
            row = [math.nan] * len(columns)
            for r in stage.ranks:
                row[index[r.label]] = r.judged_ms if judged else r.wall_ms
            name = _series_name(stage.role, stage.stage, roles)
            rows.append(f"{_step_label(stage.step)}  {name}{_row_windows(stage)}")
            keys.append(stage)
            values.append(row)
        return rows, keys, columns, values
    # Too many steps for a row each: the mean over steps per role x stage.
    sums: dict[tuple[str, str], tuple[list[StageStats], list[list[float]]]] = {}
    for stage in ordered:
        held, acc = sums.setdefault((stage.role, stage.stage), ([], [[] for _ in columns]))
        held.append(stage)
        for r in stage.ranks:
            acc[index[r.label]].append(r.judged_ms if judged else r.wall_ms)
    for (role, name), (held, acc) in sorted(sums.items(), key=lambda item: _order_key(order, *item[0])):
        windows = windows_label([w for s in held for w in s.windows], any(r.partial for s in held for r in s.ranks))
        rows.append(f"{_series_name(role, name, roles)}{windows} (mean of steps)")
        keys.append(held[0])
        values.append([statistics.fmean(v) if v else math.nan for v in acc])
    return rows, keys, columns, values


def _legend_below(ax: Any, handles: list[Any], labels: list[str], width_in: float, offset: float = -0.1) -> None:
    """A legend under ``ax``, in as many columns as the figure's width holds for the longest label, so it never
    runs past the figure's edge (constrained layout makes room below, never beside)."""
    labels = [label if len(label) <= _LEGEND_CHARS else label[: _LEGEND_CHARS - 1] + "…" for label in labels]
    column_in = max((len(label) for label in labels), default=1) * _CHAR_IN + 0.55  # text, swatch, gap
    ncol = max(1, min(len(labels), int((width_in - 0.8) // column_in)))
    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, offset), ncol=ncol, frameon=False)


_LEGEND_CHARS = 70
_CHAR_IN = 0.07  # a character at 8 pt, in inches, generously (DejaVu Sans averages ~0.06)


def _judged_words(stages: Iterable[StageStats]) -> tuple[bool, str]:
    """Whether some row is judged by work, and what work means for the rows shown (collectives, engines)."""
    listed = list(stages)
    waits = any(s.judged_by == "work" and not s.engine_side for s in listed)
    engines = any(s.engine_side for s in listed)
    parts = []
    if waits:
        parts.append("time outside CPU-side waits in collectives")
    if engines:
        parts.append("an engine's execution time, not its profiling window")
    return waits or engines, "; ".join(parts)


def _figure(report: Report) -> Any:
    from matplotlib.figure import Figure

    # The heatmap shows what the table's straggler is judged by, so the boxed rank is the one it names.
    judged, meaning = _judged_words(report.stages)
    order = pipeline_order(report)
    rows, keys, columns, values = _heatmap_rows(report, judged, order)
    colors = report_colors(report)
    gpu = [g for g in report.gpu if g["step"] is None]  # whole traces: one bar a rank
    height_a = 1.2 + 0.32 * max(len(rows), 1)
    heights = [height_a, 4.0, 3.6] if gpu else [height_a, 4.0]
    if report.gpu_idle:
        heights.append(3.8)
    view = timeline_view(report)
    if view is not None:
        heights.append(1.6 + 0.3 * len(view.lanes))
    width = max(10.0, 3.5 + 0.7 * max(len(columns), len(gpu)))
    fig = Figure(figsize=(width, sum(heights) + 0.4), dpi=110, layout="constrained")
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    fig.suptitle(f"instrument analyze: {report.directory}", fontsize=11)
    top = fig.add_subplot(grid[0])
    what = "work" if judged else "wall time"
    if len(columns) == 1:
        shown = [colors[(k.role, k.stage)] for k in keys]
        _draw_one_rank(top, rows, shown, columns[0], [row[0] for row in values], what, meaning)
    else:
        # a row per stage: boxed only where the table names a straggler (none below the floor)
        named = [s.straggler is not None for s in keys] if len(keys) == len(report.stages) else None
        _draw_heatmap(fig, top, rows, columns, values, what, meaning, named)
    _draw_breakdown(fig.add_subplot(grid[1]), report, colors, order, width)
    if gpu:
        _draw_gpu(fig.add_subplot(grid[2]), gpu)
    if report.gpu_idle:
        sub = grid[len(heights) - (2 if view is not None else 1)].subgridspec(1, 2, width_ratios=[1.0, 1.4])
        _draw_idle(fig.add_subplot(sub[0]), report.gpu_idle, report.gpu_kernels)
        _draw_kernels(fig.add_subplot(sub[1]), report.gpu_kernels)
    if view is not None:
        _draw_timeline(fig.add_subplot(grid[len(heights) - 1]), view, colors, width)
    return fig


def _rank_label(column: str) -> str:
    return f"rank {column}" if column.isdigit() else column


def _draw_one_rank(
    ax: Any, rows: list[str], colors: list[str], column: str, values: list[float], what: str, meaning: str
) -> None:
    """(a) for one rank: no straggler to find, so each stage's time as a bar in the stage's colour
    (a heatmap of one column would be one flat colour)."""
    widths = [0.0 if math.isnan(v) else v for v in values]
    positions = range(len(rows))
    ax.barh(positions, widths, color=colors, height=0.7)
    ax.set_yticks(positions, rows, fontsize=8)
    ax.invert_yaxis()  # first step at the top, as in the table's reading order
    right = max(widths, default=0.0) or 1.0
    for i, width in enumerate(widths):
        ax.text(width + right * 0.01, i, ms(width), va="center", fontsize=7)
    ax.set_xlim(0, right * 1.12)  # room for the last label
    ax.set_xlabel("ms", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    how = f"\nwork: {meaning}" if meaning else ""
    title = f"(a) stage {what}, ms: one rank ({_rank_label(column)}), so no straggler to compare{how}"
    ax.set_title(title, fontsize=10)


def _draw_heatmap(
    fig: Any,
    ax: Any,
    rows: list[str],
    columns: list[str],
    values: list[list[float]],
    what: str = "wall time",
    meaning: str = "",
    named: list[bool] | None = None,
) -> None:
    """(a) stage time per rank, coloured by time / median of the row's ranks; the straggler boxed (on the
    rows ``named`` allows)."""
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
                # the ends of the colour map are dark; a cell without a ratio (a median of 0) is blank
                dark = not math.isnan(ratios[i][j]) and not 0.2 <= norm(ratios[i][j]) <= 0.8
                ax.text(j, i, ms(value), ha="center", va="center", fontsize=7, color="white" if dark else "black")
        if len(finite) > 1 and (named is None or named[i]):
            slowest = row.index(max(finite))
            if ratios[i][slowest] >= 1.1:
                ax.add_patch(Rectangle((slowest - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.01)
    bar.set_label("time / median of ranks", fontsize=8)
    how = f"\nwork: {meaning}, as the table judges" if meaning else ""
    ax.set_title(f"(a) stage {what} per rank, ms (boxed: the straggler, >= 1.1x the median){how}", fontsize=10)


def _draw_breakdown(
    ax: Any, report: Report, colors: dict[tuple[str, str], str], order: dict[tuple[str, str], int], width_in: float
) -> None:
    """(b) per step, the stages' times stacked in pipeline order from the bottom (each stage's slowest rank, by
    work where the table judges by work: an engine's execution, never its window twice), each in its colour.
    An engine's execution is part of the step's generating stage: stacked only in a step where none was traced."""
    steps = sorted({s.step for s in report.stages}, key=lambda step: (step is None, step or 0))  # as the pipeline
    generating = {s.step for s in report.stages if not s.engine_side and label_key(s.stage) in _GENERATING}
    series: dict[tuple[str, str], dict[int | None, float]] = {}
    rows: dict[tuple[str, str], list[StageStats]] = defaultdict(list)
    for stage in report.stages:
        inside = stage.engine_side and stage.step in generating
        series.setdefault((stage.role, stage.stage), {})[stage.step] = 0.0 if inside else shown_ms(stage)
        rows[stage.role, stage.stage].append(stage)
    drawn = sorted((k for k in series if any(series[k].values())), key=lambda k: _order_key(order, *k))
    roles = len(report.roles)
    bottoms = [0.0] * len(steps)
    positions = list(range(len(steps)))
    handles, labels = [], []
    for key in drawn:
        heights = [series[key].get(step, 0.0) for step in steps]
        held = rows[key]
        windows = windows_label([w for s in held for w in s.windows], any(r.partial for s in held for r in s.ranks))
        bars = ax.bar(positions, heights, bottom=bottoms, color=colors[key], edgecolor="white", linewidth=0.5)
        handles.append(bars)
        labels.append(_series_name(*key, roles) + windows)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(positions, [_step_label(s) for s in steps])
    ax.set_ylabel("ms" if len(report.ranks) <= 1 else "ms (slowest rank of each stage)")
    engines = any(s.engine_side for s in report.stages)
    what = "stage time (engines: execution time)" if engines else "stage wall time"
    ax.set_title(f"(b) per-step breakdown: {what}, stacked in pipeline order from the bottom", fontsize=10)
    if drawn:
        # the legend reads as the stack does, the last stage (the top bar) first
        _legend_below(ax, handles[::-1], labels[::-1], width_in)
    ax.grid(axis="y", alpha=0.3)


def png_bytes(report: Report) -> bytes:
    """The picture as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure(report)
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def write_png(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the picture to ``path`` (:func:`~._destination.write_new_file`); needs matplotlib."""
    return write_new_file(path, png_bytes(report))


# (c): compute, exposed communication, the rest of the busy time and idle add up to the span exactly.
_GPU_PARTS = (
    ("compute", "#4c72b0"),
    ("communication not under compute", "#dd8452"),
    ("memory and other", "#8172b3"),
    ("idle", "#d0d0d0"),
)


def gpu_parts(row: dict[str, Any]) -> list[float]:
    """A ``gpu`` row cut into disjoint ms that stack to its span: compute; communication while no compute
    runs; the rest of the busy time (memory copies and sets, other kernels); idle."""
    compute = float(row["compute_us"])
    comm = float(row["communication_us"])
    overlap = comm * float(row["comm_comp_overlap_pct"] or 0.0) / 100.0
    exposed = max(0.0, comm - overlap)
    rest = max(0.0, float(row["non_compute_us"]) - exposed)  # non_compute = busy - compute >= exposed comm
    return [v / 1000.0 for v in (compute, exposed, rest, float(row["idle_us"]))]


def _draw_gpu(ax: Any, rows: list[dict[str, Any]]) -> None:
    """(c) GPU time per rank over the whole trace, stacked; the comm/compute overlap written on top."""
    labels = ["?" if g["rank"] is None else f"rank {g['rank']}" for g in rows]
    parts = [gpu_parts(g) for g in rows]
    positions = list(range(len(rows)))
    bottoms = [0.0] * len(rows)
    for k, (name, color) in enumerate(_GPU_PARTS):
        heights = [p[k] for p in parts]
        ax.bar(positions, heights, bottom=bottoms, label=name, color=color, edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    top = max(bottoms, default=0.0) or 1.0
    for i, g in enumerate(rows):
        overlap = g["comm_comp_overlap_pct"]
        note = "no comm" if overlap is None else f"overlap {overlap:.0f}%"
        ax.text(i, bottoms[i] + top * 0.01, note, ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.1)  # room for the overlap labels
    ax.set_xticks(positions, labels, fontsize=8)
    ax.set_ylabel("ms (GPU span)")
    ax.set_title("(c) GPU time per rank, whole trace (overlap: communication also running compute)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    _legend_below(ax, handles, labels, ax.get_figure().get_figwidth())
    ax.grid(axis="y", alpha=0.3)


_IDLE_PARTS = (
    ("host wait", "host_wait_us", "#c44e52"),
    ("kernel wait", "kernel_wait_us", "#dd8452"),
    ("other", "other_us", "#d0d0d0"),
)
_KIND_COLORS = {"compute": "#4c72b0", "communication": "#dd8452", "memory": "#8172b3", "other": "#937860"}
_PICTURE_KERNELS = 8


def _draw_idle(ax: Any, idle: Iterable[dict[str, Any]], kernels: Iterable[dict[str, Any]]) -> None:
    """(d) each rank's idle time per stream, summed over streams, stacked by cause; the launch delay on top."""
    rows = list(idle)
    delays = {k["rank"]: k["launch_delay_us"] for k in kernels}
    positions = list(range(len(rows)))
    bottoms = [0.0] * len(rows)
    for name, key, color in _IDLE_PARTS:
        heights = [float(r[key]) / 1000.0 for r in rows]
        ax.bar(positions, heights, bottom=bottoms, label=name, color=color, edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    top = max(bottoms, default=0.0) or 1.0
    for i, r in enumerate(rows):
        delay = delays.get(r["rank"], {}).get("median")
        note = "no launches" if delay is None else f"launch p50 {delay:,.0f} us"
        ax.text(i, bottoms[i] + top * 0.01, note, ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(positions, ["?" if r["rank"] is None else f"rank {r['rank']}" for r in rows], fontsize=8)
    ax.set_ylabel("ms (per stream, summed)")
    ax.set_title("(d) GPU idle time by cause (HTA's idle breakdown)", fontsize=10)
    # (d) takes the left part of its row (1 : 1.4 beside the kernels)
    handles, labels = ax.get_legend_handles_labels()
    _legend_below(ax, handles, labels, ax.get_figure().get_figwidth() / 2.4)
    ax.grid(axis="y", alpha=0.3)


def _draw_kernels(ax: Any, kernels: Iterable[dict[str, Any]]) -> None:
    """(e) the kernels of most time: each rank's top kernels, their totals added over the ranks."""
    from instrument.analyze.render._tables import short_kernel_name

    totals: dict[str, list[Any]] = {}
    for row in kernels:
        for k in row["top"]:
            held = totals.setdefault(k["name"], [k["type"], 0.0])
            held[1] += float(k["total_us"]) / 1000.0
    ranked = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:_PICTURE_KERNELS]
    positions = list(range(len(ranked)))
    ax.barh(positions, [v for _, (_, v) in ranked], color=[_KIND_COLORS[t] for _, (t, _) in ranked], height=0.7)
    ax.set_yticks(positions, [short_kernel_name(name, 40) for name, _ in ranked], fontsize=7)
    ax.invert_yaxis()  # the most time at the top
    ax.set_xlabel("ms (total over ranks)", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("(e) top kernels by time (colour: their type, as in (c))", fontsize=10)


_STEP_COLOR = "#e4e4e4"  # a lane's step span, as on the page: the grey left where no stage ran is idle time
_DEPTH_HEIGHTS = (0.72, 0.46, 0.26)  # a stage inside another is drawn inside it
_PICTURE_BARS = 60_000
_CHAR_EM = 0.65  # a character's width at most, in ems of its font (DejaVu Sans): too wide only thins labels more


def _label_steps(ax: Any, view: TimelineView, steps: list[tuple[int, int, int]], width_in: float) -> None:
    """The step labels above the lanes, thinned so that no two overlap (:func:`~._lanes.labelled_steps`) at the
    axes' least width: the figure's less the lane labels and the paddings, in points."""
    lanes_pt = _CHAR_EM * 8 * max((len(d.label) for d in view.lanes), default=0)
    plot_pt = max(width_in * 72 - lanes_pt - 40, 100.0)
    low, high = ax.dataLim.intervalx  # the bars drawn
    extent = (float(low), float(high)) if low <= high else (0.0, 1.0)
    x_range, labelled = labelled_steps(steps, extent, plot_pt, _CHAR_EM * 7, 4.0)
    ax.set_xlim(*x_range)
    for i in labelled:
        step, start, end = steps[i]
        ax.text((start + end) / 2e6, -0.7, f"step {step}", ha="center", va="bottom", fontsize=7, color="#555")


def _draw_timeline(ax: Any, view: TimelineView, colors: dict[tuple[str, str], str], width_in: float) -> None:
    """(f) the step timeline: a lane per process (or role bands), steps shaded, stages in their colours."""
    from matplotlib.patches import Patch

    kept, n_steps = steps_within(view, _PICTURE_BARS)
    steps = [s for s in view.steps if s[0] in kept]
    for i, (_, start, end) in enumerate(steps):
        shade = (0.27, 0.39, 0.67, 0.13 if i % 2 == 0 else 0.04)  # steps in turn, as on the page
        ax.axvspan(start / 1e6, end / 1e6, color=shade, zorder=0, linewidth=0)
    seen: dict[tuple[str, str], str] = {}
    first_start: dict[tuple[str, str], int] = {}
    for y, drawn in enumerate(view.lanes):
        step_bars: list[tuple[float, float]] = []
        stage_rows: list[tuple[str, str, int, int, int]] = []
        for kind, role, stage, step, start, end, thread in drawn.lane.rows():
            if step not in kept:
                continue
            if kind == "step":
                step_bars.append((start / 1e6, (end - start) / 1e6))
            elif kind == "stage":
                stage_rows.append((role, stage, start, end, thread))
                first_start[role, stage] = min(start, first_start.get((role, stage), start))
        ax.broken_barh(step_bars, (y - 0.41, 0.82), facecolors=_STEP_COLOR, zorder=1)
        depths = nesting_depths([(s, e, t) for _, _, s, e, t in stage_rows])
        groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        for (role, stage, start, end, _), depth in zip(stage_rows, depths, strict=True):
            groups.setdefault((role, stage, min(depth, len(_DEPTH_HEIGHTS) - 1)), []).append(
                (start / 1e6, (end - start) / 1e6)
            )
        for (role, stage, depth), runs in sorted(groups.items(), key=lambda g: g[0][2]):
            color = colors.get((role, stage), "#7f7f7f")
            seen.setdefault((role, stage), color)
            height = _DEPTH_HEIGHTS[depth]
            ax.broken_barh(runs, (y - height / 2, height), facecolors=color, zorder=2 + depth, linewidth=0)
    first = 0
    for role in view.roles:
        count = sum(1 for d in view.lanes if d.lane.role == role)
        if first and count:
            ax.axhline(first - 0.5, color="#999", linewidth=0.8, zorder=5)
        first += count
    ax.set_yticks(range(len(view.lanes)), [d.label for d in view.lanes], fontsize=8)
    _label_steps(ax, view, steps, width_in)
    ax.set_ylim(len(view.lanes) - 0.5, -1.0)  # first lane at the top, room for the step labels
    ax.set_xlabel("ms since the first span", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    title = f"(f) step timeline: {view.caption}"
    if len(steps) < n_steps:
        title += f"; steps {steps[0][0]}-{steps[-1][0]} of {n_steps}"
    ax.set_title(title, fontsize=10)
    roles = len({role for role, _ in seen})
    keys = sorted(seen, key=lambda k: (first_start.get(k, math.inf), k))  # as the lanes run them
    handles: list[Any] = [Patch(color=seen[k]) for k in keys] + [Patch(color=_STEP_COLOR)]
    labels = [stage if roles == 1 else f"{role}: {stage}" for role, stage in keys] + ["step (grey: idle)"]
    _legend_below(ax, handles, labels, width_in, offset=-0.3)
