"""The page's interactive step timeline (:func:`timeline_section`): one lane per process grouped by role (role
bands with their outlier ranks at scale, :mod:`._lanes`), steps shaded, a hover per span (stage, step, rank,
ms), zoom and pan.

Drawn by plotly.js, inlined whole (``include_plotlyjs=True``, ~4.8 MB): the page works offline and asks
nothing of the network. A plotted library rather than our own JavaScript, since hover, zoom, pan, a legend
that hides stages and an export button come with it; its SVG bars cost ~50 bytes each in the page, so the
bars drawn are bounded (:data:`MAX_BARS`, the first steps that fit) and role bands keep 4,096 ranks to a
few lanes. Without plotly the section says how to get it; the page is written all the same.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any

from instrument.analyze.model import Report
from instrument.analyze.render._lanes import (
    DrawnLane,
    TimelineView,
    labelled_steps,
    nesting_depths,
    steps_within,
    timeline_view,
)
from instrument.analyze.render._timeline import STEP_HEADERS, findings_lines, step_rows

__all__ = ["DIV_ID", "MAX_BARS", "MIN_WIDTH_PX", "cell", "timeline_figure", "timeline_section"]

DIV_ID = "instrument-timeline"
"""The id of the timeline's element in the page."""
MAX_BARS = 60_000
"""Stage bars drawn at most: an SVG of many more is slow to zoom in a browser."""
_SHADE, _SHADE_ODD = "rgba(70, 100, 170, 0.13)", "rgba(70, 100, 170, 0.04)"  # steps in turn
_STEP_COLOR = "#e4e4e4"  # a lane's step span: the grey left where it ran no stage is its idle time
_WIDTHS = (0.72, 0.46, 0.26)  # bar height by nesting depth: a stage inside another shows inside it
_LANE_PX = 30  # enough for plotly to print every lane's label
_LEGEND_PER_ROW = 5  # legend entries a row holds (at least, on a laptop-wide page)
MIN_WIDTH_PX = 900
"""The chart's least width: a narrower window scrolls the chart in its own box, so the step labels thinned for
this width never overlap (a wider window only spreads them)."""
_MARGIN_R = 20
# Upper bounds of a character's width in px, for plotly's fonts (Open Sans, else Verdana, Arial): a lane label
# (12 px) and a step label (10 px). Too wide only thins the labels more; too narrow would let them overlap.
_LANE_CHAR_PX, _STEP_CHAR_PX, _STEP_FONT = 7.5, 6.5, 10
_LABEL_GAP_PX = 8
_TITLE_CHARS = 110  # a title line's characters (13 px) that fit in MIN_WIDTH_PX


def timeline_figure(view: TimelineView, colors: dict[tuple[str, str], str], max_bars: int = MAX_BARS) -> dict[str, Any]:
    """The plotly figure (a plain dict: ``data`` and ``layout``), times in ms since the first span.

    A bar's ``x`` is its length and ``base`` its start; the hover reads both from ``customdata`` (plotly's
    own ``x`` there is the bar's end)."""
    kept, n_steps = steps_within(view, max_bars)
    roles = {role for drawn in view.lanes for (_, role, _) in drawn.lane.names}
    step_bars: dict[str, list[Any]] = {"y": [], "base": [], "x": [], "customdata": []}
    bars: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for drawn in view.lanes:
        _lane_bars(drawn, kept, step_bars, bars)
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "step (grey: idle)",
            "marker": {"color": _STEP_COLOR},
            "width": 0.82,  # the step shading shows between lanes
            "hovertemplate": "%{y}<br>step %{customdata[0]}: %{customdata[1]:,.3f} ms<extra></extra>",
            **step_bars,
        }
    ]
    # deeper stages drawn later, so a nested stage is never hidden under its parent
    for key, columns in sorted(bars.items(), key=lambda item: (min(item[1]["depth"]), item[0])):
        role, stage = key
        name = stage if len(roles) == 1 else f"{role}: {stage}"
        depth = columns.pop("depth")
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "marker": {"color": colors.get(key, "#7f7f7f"), "line": {"width": 0}},
                "width": [_WIDTHS[min(d, len(_WIDTHS) - 1)] for d in depth],
                "hovertemplate": (
                    f"<b>{html.escape(name)}</b><br>%{{y}}<br>step %{{customdata[0]}}: %{{customdata[2]:,.3f}} ms"
                    "<br>from %{customdata[1]:,.3f} ms<extra></extra>"
                ),
                **columns,
            }
        )
    labels = [drawn.label for drawn in view.lanes]
    drawn_steps = [s for s in view.steps if s[0] in kept]
    title = view.caption
    if len(drawn_steps) < n_steps:
        title += f"; steps {drawn_steps[0][0]}-{drawn_steps[-1][0]} of {n_steps} drawn (the first {max_bars:,} bars)"
    lines = textwrap.wrap(title, _TITLE_CHARS) or [""]  # plotly never wraps a title: a long one would be cut
    top = 46 + 17 * len(lines)  # the title's lines, then the step labels
    # the plot's least width: the chart's, less the lane labels' margin (plotly's automargin, at least 80 px)
    margin_l = max(80.0, _LANE_CHAR_PX * max(map(len, labels), default=0) + 12)
    plot_px = max(MIN_WIDTH_PX - _MARGIN_R - margin_l, 120.0)  # lane labels past ~100 characters: fewer step labels
    x_range, annotations = _step_labels(drawn_steps, _extent(data), plot_px)
    bottom = 70 + 22 * -(-len(data) // _LEGEND_PER_ROW)  # the axis title, then the legend's rows
    layout = {
        "title": {
            "text": "<br>".join(html.escape(line) for line in lines),
            "font": {"size": 13},
            "x": 0.01,
            "xanchor": "left",
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 12},
        },
        "barmode": "overlay",
        "height": top + max(120, _LANE_PX * len(labels)) + bottom,  # the lanes keep their room whatever the legend
        "hovermode": "closest",
        "xaxis": {
            "title": {"text": "ms since the first span"},
            "zeroline": False,
            "showgrid": True,
            "range": x_range,  # set, not autoranged: the step labels are thinned for it
        },
        "yaxis": {
            "type": "category",
            "categoryorder": "array",
            "categoryarray": labels,
            "autorange": "reversed",
            "automargin": True,
            "showgrid": False,
        },
        "shapes": _shading(view, drawn_steps),
        "annotations": annotations,
        # under the axis title whatever the plot's height: placed in the figure's frame, not the plot's
        "legend": {"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "font": {"size": 11}},
        "margin": {"t": top, "r": _MARGIN_R, "b": bottom},
        "plot_bgcolor": "white",
    }
    return {"data": data, "layout": layout}


def _lane_bars(
    drawn: DrawnLane,
    kept: set[int],
    step_bars: dict[str, list[Any]],
    bars: dict[tuple[str, str], dict[str, list[Any]]],
) -> None:
    """Append one lane's step and stage spans (windows are left to the merged trace) to the traces' columns."""
    label = drawn.label
    stage_rows: list[tuple[str, str, int, int, int, int]] = []
    for kind, role, stage, step, start, end, thread in drawn.lane.rows():
        if step not in kept:
            continue
        if kind == "step":
            length = round((end - start) / 1e6, 3)
            step_bars["y"].append(label)
            step_bars["base"].append(round(start / 1e6, 3))
            step_bars["x"].append(length)
            step_bars["customdata"].append([step, length])
        elif kind == "stage":
            stage_rows.append((role, stage, step, start, end, thread))
    depths = nesting_depths([(s, e, t) for _, _, _, s, e, t in stage_rows])
    for (role, stage, step, start, end, _), depth in zip(stage_rows, depths, strict=True):
        columns = bars.setdefault((role, stage), {"y": [], "base": [], "x": [], "customdata": [], "depth": []})
        begin, length = round(start / 1e6, 3), round((end - start) / 1e6, 3)
        columns["y"].append(label)
        columns["base"].append(begin)
        columns["x"].append(length)
        columns["customdata"].append([step, begin, length])
        columns["depth"].append(depth)


def _extent(data: list[dict[str, Any]]) -> tuple[float, float]:
    """The first start and the last end of the bars, in ms."""
    starts = [base for trace in data for base in trace["base"]]
    ends = [base + length for trace in data for base, length in zip(trace["base"], trace["x"], strict=True)]
    return (min(starts), max(ends)) if starts else (0.0, 1.0)


def _step_labels(
    steps: list[tuple[int, int, int]], extent: tuple[float, float], plot_px: float
) -> tuple[list[float], list[dict[str, Any]]]:
    """The time axis's range and the step labels above the plot: as many as fit in ``plot_px`` without two
    overlapping (:func:`~._lanes.labelled_steps`), each saying its step's time on hover."""
    (x0, x1), kept = labelled_steps(steps, extent, plot_px, _STEP_CHAR_PX, _LABEL_GAP_PX)
    annotations = []
    for i in kept:
        step, start, end = steps[i]
        annotations.append(
            {
                "x": (start + end) / 2e6,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "text": f"step {step}",
                "hovertext": f"step {step}: {(end - start) / 1e6:,.3f} ms, from {start / 1e6:,.3f} ms",
                "showarrow": False,
                "font": {"size": _STEP_FONT, "color": "#555"},
            }
        )
    return [round(x0, 3), round(x1, 3)], annotations


def _shading(view: TimelineView, steps: list[tuple[int, int, int]]) -> list[Any]:
    """Every other step shaded, role bands tinted in turn and a line between roles."""
    shapes: list[dict[str, Any]] = []
    for i, (step, start, end) in enumerate(steps):
        x0, x1 = start / 1e6, end / 1e6
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": x0,
                "x1": x1,
                "y0": 0,
                "y1": 1,
                "fillcolor": _SHADE if i % 2 == 0 else _SHADE_ODD,
                "line": {"width": 0},
                "layer": "below",
                "name": f"step {step}",
            }
        )
    first = 0
    for j, role in enumerate(view.roles):
        count = sum(1 for drawn in view.lanes if drawn.lane.role == role)
        if not count:
            continue
        last = first + count - 1
        if j % 2 == 1:  # a role band: the lanes of every other role tinted
            shapes.append(
                {
                    "type": "rect",
                    "xref": "paper",
                    "yref": "y",
                    "x0": 0,
                    "x1": 1,
                    "y0": first - 0.5,
                    "y1": last + 0.5,
                    "fillcolor": "#f3efe6",
                    "opacity": 0.6,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        if first:
            shapes.append(
                {
                    "type": "line",
                    "xref": "paper",
                    "yref": "y",
                    "x0": 0,
                    "x1": 1,
                    "y0": first - 0.5,
                    "y1": first - 0.5,
                    "line": {"width": 1, "color": "#999"},
                }
            )
        first = last + 1
    return shapes


_CONFIG = {
    "scrollZoom": True,  # the wheel zooms the time axis; drag zooms a box, shift-drag pans
    "displaylogo": False,  # plotly's logo links out: nothing on the page should
    "showSendToCloud": False,  # its "Share chart..." button uploads the data to Plotly's cloud
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    "toImageButtonOptions": {"format": "png", "filename": "instrument-timeline"},
}


_NUMBER = re.compile(r"[-+]?[\d,.]+ ?%?|-")
_LONG_CELL = 24  # characters: a longer cell of words may wrap (a critical path, the idle by role)


def cell(text: str) -> str:
    """One ``<td>``: a number right-aligned, a long cell of words free to wrap, a short one kept on its line."""
    css = ' class="n"' if _NUMBER.fullmatch(text) else ' class="w"' if len(text) > _LONG_CELL else ""
    return f"<td{css}>{html.escape(text)}</td>"


def _table(headers: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>\n'


def timeline_section(report: Report, colors: dict[tuple[str, str], str]) -> str:
    """The page's step timeline: the findings, the per-step table and the interactive chart; or nothing."""
    esc = html.escape
    if report.timeline is None:
        return f'<p class="note">{esc(report.timeline_note)}</p>\n' if report.timeline_note else ""
    findings = "".join(f"<li>{esc(line.partition('. ')[2] or line)}</li>" for line in findings_lines(report))
    out = [f"<h2>Findings</h2>\n<ol>{findings}</ol>\n", "<h2>Step timeline</h2>\n"]
    view = timeline_view(report)
    if view is not None:
        out.append(_chart(report, view, colors))
    out.append(_table(STEP_HEADERS, step_rows(report)))
    return "".join(out)


def _chart(report: Report, view: TimelineView, colors: dict[tuple[str, str], str]) -> str:
    """The chart, or a note on why it is not drawn (plotly missing: the rest of the page stands)."""
    esc = html.escape
    try:
        import plotly.io  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return "<p class=\"note\">The interactive timeline needs plotly: pip install 'instrument-rl[analyze]'.</p>\n"
    figure = timeline_figure(view, colors)
    chart: str = plotly.io.to_html(
        figure,
        config=_CONFIG,
        include_plotlyjs=True,  # inline: the page opens offline
        full_html=False,
        div_id=DIV_ID,
        validate=False,  # a plain dict we built; validating 60,000 bars takes seconds
        default_height=f"{figure['layout']['height']}px",
    )
    notes = ["drag: zoom a box · shift-drag or the pan button: pan · wheel: zoom · double-click: all"]
    if report.timeline_spans is not None and report.timeline_spans.note:
        notes.append(report.timeline_spans.note)
    return f'<div class="timeline">{chart}</div>\n' + "".join(f'<p class="note">{esc(n)}</p>' for n in notes) + "\n"
