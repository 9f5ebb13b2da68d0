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
from typing import Any

from instrument.analyze.model import Report
from instrument.analyze.render._lanes import DrawnLane, TimelineView, nesting_depths, steps_within, timeline_view
from instrument.analyze.render._timeline import STEP_HEADERS, findings_lines, step_rows

__all__ = ["DIV_ID", "MAX_BARS", "timeline_figure", "timeline_section"]

DIV_ID = "instrument-timeline"
"""The id of the timeline's element in the page."""
MAX_BARS = 60_000
"""Stage bars drawn at most: an SVG of many more is slow to zoom in a browser."""
_SHADE, _SHADE_ODD = "rgba(70, 100, 170, 0.13)", "rgba(70, 100, 170, 0.04)"  # steps in turn
_STEP_COLOR = "#e4e4e4"  # a lane's step span: the grey left where it ran no stage is its idle time
_WIDTHS = (0.72, 0.46, 0.26)  # bar height by nesting depth: a stage inside another shows inside it
_LANE_PX = 30  # enough for plotly to print every lane's label
_LEGEND_PER_ROW = 5  # legend entries a row holds (at least, on a laptop-wide page)
_STEP_LABELS = 24  # steps labelled above the plot at most (every k-th past that)


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
    shapes, annotations = _shading(view, kept)
    drawn_steps = [s for s in view.steps if s[0] in kept]
    title = view.caption
    if len(drawn_steps) < n_steps:
        title += f"; steps {drawn_steps[0][0]}-{drawn_steps[-1][0]} of {n_steps} drawn (the first {max_bars:,} bars)"
    bottom = 70 + 22 * -(-len(data) // _LEGEND_PER_ROW)  # the axis title, then the legend's rows
    layout = {
        "title": {"text": html.escape(title), "font": {"size": 13}, "x": 0.01, "xanchor": "left"},
        "barmode": "overlay",
        "height": 70 + max(120, _LANE_PX * len(labels)) + bottom,  # the lanes keep their room whatever the legend
        "hovermode": "closest",
        "xaxis": {"title": {"text": "ms since the first span"}, "zeroline": False, "showgrid": True},
        "yaxis": {
            "type": "category",
            "categoryorder": "array",
            "categoryarray": labels,
            "autorange": "reversed",
            "automargin": True,
            "showgrid": False,
        },
        "shapes": shapes,
        "annotations": annotations,
        # under the axis title whatever the plot's height: placed in the figure's frame, not the plot's
        "legend": {"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "font": {"size": 11}},
        "margin": {"t": 70, "r": 20, "b": bottom},
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


def _shading(view: TimelineView, kept: set[int]) -> tuple[list[Any], list[Any]]:
    """Every other step shaded (a label above), role bands tinted in turn and a line between roles."""
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    steps = [s for s in view.steps if s[0] in kept]
    every = max(1, -(-len(steps) // _STEP_LABELS))
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
        if i % every == 0:
            annotations.append(
                {
                    "x": (x0 + x1) / 2,
                    "y": 1,
                    "xref": "x",
                    "yref": "paper",
                    "yanchor": "bottom",
                    "text": f"step {step}",
                    "showarrow": False,
                    "font": {"size": 10, "color": "#555"},
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
    return shapes, annotations


_CONFIG = {
    "scrollZoom": True,  # the wheel zooms the time axis; drag zooms a box, shift-drag pans
    "displaylogo": False,  # plotly's logo links out: nothing on the page should
    "showSendToCloud": False,  # its "Share chart..." button uploads the data to Plotly's cloud
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    "toImageButtonOptions": {"format": "png", "filename": "instrument-timeline"},
}


def _table(headers: tuple[str, ...], rows: list[list[str]]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n"


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
