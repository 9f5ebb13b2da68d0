"""The page fits its window: no sideways scroll of the page at 1,000 and 1,400 px (a table wider than the window
scrolls in its own box, long cells wrap, the chart keeps its least width in a box of its own), and the timeline's
step labels never overlap at any number of steps (thinned to what fits, every step's time on hover).

The label thinning is a pure function with property tests; the pages are checked in real headless Chromium
(:mod:`tests.analyze.render.browser`) for the demo's run (``examples/ppo_demo.py``, as ``make demo`` runs it),
synthetic timelines of 20 and 200 steps (a long first step among short ones, as a traced step is) and of 64
ranks (role bands), the traces of :func:`~tests.analyze.test_analyze.known_run` (the run's facts, ops, memory,
skipped files) and the committed vLLM traces (the work columns).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument.analyze import analyze, write_html
from instrument.analyze.render._lanes import thin_labels, timeline_view
from instrument.analyze.render._png import _figure as _png_figure
from instrument.analyze.render._timeline_html import cell, timeline_figure
from tests.analyze.render.browser import needs_chromium, probe
from tests.analyze.render.pages import many_ranks, many_steps
from tests.analyze.test_analyze import known_run

ROOT = Path(__file__).resolve().parents[3]
VLLM_BUSY = ROOT / "tests" / "data" / "vllm" / "busy"
HANG_GUARD_S = 300  # against a hung demo only: the assertions are about the page


# --------------------------------------------------------------------------- thinning the labels

_labels = st.lists(st.tuples(st.integers(0, 10_000), st.floats(-1e4, 1e4), st.floats(0, 300)), min_size=0, max_size=60)


def _extents(centers: list[float], widths: list[float], i: int) -> tuple[float, float]:
    return centers[i] - widths[i] / 2, centers[i] + widths[i] / 2


@given(_labels, st.floats(0, 20))
def test_kept_labels_never_overlap_and_every_one_left_out_would(
    labels: list[tuple[int, float, float]], gap: float
) -> None:
    steps, centers, widths = [s for s, _, _ in labels], [c for _, c, _ in labels], [w for _, _, w in labels]
    kept = thin_labels(steps, centers, widths, gap)
    assert kept == sorted(set(kept)) and all(0 <= i < len(labels) for i in kept)
    if labels:
        assert kept[0] == 0  # the first step is always labelled
    boxes = sorted(_extents(centers, widths, i) for i in kept)
    assert all(a[1] + gap <= b[0] for a, b in itertools.pairwise(boxes))  # never two overlapping
    for i in set(range(len(labels))) - set(kept):  # and none left out that would fit
        left, right = _extents(centers, widths, i)
        assert any(not (b[1] + gap <= left or right + gap <= b[0]) for b in boxes), i


def test_evenly_spread_steps_get_evenly_spread_round_labels() -> None:
    steps = list(range(1, 21))
    kept = thin_labels(steps, [30.0 * i for i in range(20)], [50.0] * 20, 8)  # a label takes 2 steps' room
    assert [steps[i] for i in kept] == [1, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # every 2nd (2 overlaps 1)
    kept = thin_labels(steps, [15.0 * i for i in range(20)], [50.0] * 20, 8)  # 4 steps' room
    assert [steps[i] for i in kept] == [1, 5, 10, 15, 20]
    assert thin_labels(steps, [100.0 * i for i in range(20)], [50.0] * 20, 8) == list(range(20))  # room for all
    # a long first step (400 px), then 19 short ones of 10 px: the long one labelled, the short every 10th and
    # step 2 (there is room where they begin)
    centers = [200.0] + [400 + 10 * i + 5 for i in range(19)]
    assert [steps[i] for i in thin_labels(steps, centers, [50.0] * 20, 8)] == [1, 2, 10, 20]


def _figure_labels(directory: Path) -> tuple[dict[str, Any], list[int]]:
    report = analyze(directory, jobs=1)
    view = timeline_view(report)
    assert view is not None
    figure = timeline_figure(view, {})
    return figure, [step for step, _, _ in view.steps]


def test_the_figure_labels_the_steps_that_fit_and_hovers_every_step(tmp_path: Path) -> None:
    figure, steps = _figure_labels(many_steps(tmp_path, steps=200))
    layout = figure["layout"]
    labelled = [a["text"] for a in layout["annotations"]]
    assert labelled == [f"step {s}" for s in (1, 25, 50, 75, 100, 125, 150, 175, 200)]  # the long step 1, then round
    assert all(a["hovertext"].startswith(a["text"] + ": ") for a in layout["annotations"])
    low, high = layout["xaxis"]["range"]
    for trace in figure["data"]:
        assert all(low <= base and base + x <= high for base, x in zip(trace["base"], trace["x"], strict=True))
    [step_bars] = [t for t in figure["data"] if t["name"].startswith("step")]
    assert {row[0] for row in step_bars["customdata"]} == set(steps)  # every step, labelled or not, on hover


def test_cells_numbers_right_long_words_wrap() -> None:
    assert cell("1,234.5") == '<td class="n">1,234.5</td>' and cell("-") == '<td class="n">-</td>'
    assert cell("93%") == '<td class="n">93%</td>' and cell("12") == '<td class="n">12</td>'
    assert cell("actor r3 update_actor 12.0 ms → rollout <x>").startswith('<td class="w">')
    assert cell("update_actor") == "<td>update_actor</td>" and "&lt;x&gt;" in cell("a long cell of words <x>")


# --------------------------------------------------------------------------- in a real browser

# Once plotly has drawn: the page's scroll width against its client width, each step label's box and the pairs
# that overlap, the tables outside a scrolling box, and what overflows the page (to say what, should it fail).
_PROBE = r"""<script>
window.addEventListener('load', function () {
  var tries = 0;
  function finish(out) {
    out.errors = window.__probeErrors;
    out.resources = performance.getEntriesByType('resource').map(function (e) { return e.name; });
    var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function look() {
    var gd = document.getElementById('instrument-timeline');
    var chart = !!document.querySelector('.timeline');
    if (chart && !(gd && gd._fullLayout && gd.querySelector('g.barlayer'))) {
      if (tries++ < 200) { setTimeout(look, 50); return; }
      finish({drawn: false}); return;
    }
    var page = document.scrollingElement;
    var out = {drawn: chart, scroll_width: page.scrollWidth, client_width: page.clientWidth};
    var labels = gd ? Array.from(gd.querySelectorAll('g.annotation')).filter(function (a) {
      return /^step /.test(a.textContent); }) : [];
    var boxes = labels.map(function (a) {
      var r = a.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
    out.labels = labels.map(function (a) { return a.textContent; });
    out.overlaps = [];
    for (var i = 0; i < boxes.length; i++) for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i], b = boxes[j];
      if (a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]) out.overlaps.push([out.labels[i], out.labels[j]]);
    }
    out.unboxed = Array.from(document.querySelectorAll('table')).filter(function (t) {
      return !t.parentElement.classList.contains('table'); }).length;
    out.wide = Array.from(document.querySelectorAll('body *')).filter(function (e) {
      return e.getBoundingClientRect().right > page.clientWidth && !e.closest('div.table, div.timeline'); })
      .slice(0, 5).map(function (e) { return e.tagName + '.' + e.className; });
    finish(out);
  }
  look();
});
</script>"""

WIDTHS = (1000, 1400)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pages: the demo's run, 20 and 200 steps, 64 ranks, the known run's details, the vLLM traces."""
    root = tmp_path_factory.mktemp("pages")
    demo = root / "demo" / "profile"
    demo_args = ["--config", "examples/demo.yaml", "--num-steps", "4", f"save_path={demo}"]  # as make demo runs it
    subprocess.run(
        [sys.executable, "examples/ppo_demo.py", *demo_args],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=HANG_GUARD_S,
    )
    runs = {
        "demo": demo,
        "steps20": many_steps(_new(root / "steps20"), steps=20),
        "steps200": many_steps(_new(root / "steps200"), steps=200),
        "ranks64": many_ranks(_new(root / "ranks64")),
        "details": known_run(root / "details" / "profile", hosts=("node-a", "node-b")),
        "vllm": VLLM_BUSY,
    }
    return {name: write_html(analyze(run, jobs=1, details=True), root / f"{name}.html") for name, run in runs.items()}


def _new(directory: Path) -> Path:
    directory.mkdir(parents=True)
    return directory


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["demo", "steps20", "steps200", "ranks64", "details", "vllm"])
def test_the_page_fits_its_window_and_its_step_labels_never_overlap(
    pages: dict[str, Path], name: str, width: int, tmp_path: Path
) -> None:
    probed = probe(pages[name], _PROBE, tmp_path, window=f"{width},1600")
    seen = probed.seen
    assert seen["errors"] == [] and seen["resources"] == [] and probed.console == [], (seen, probed.console)
    assert seen["client_width"] >= width - 20  # the window asked for (less a scrollbar)
    assert seen["scroll_width"] <= seen["client_width"], seen["wide"]  # no sideways scroll of the page
    assert seen["unboxed"] == 0  # every table in a box of its own that scrolls
    assert seen["overlaps"] == [], seen
    if name not in ("details", "vllm"):  # these two are traces without a timeline file: a chart only if derived
        assert seen["drawn"] and seen["labels"][0] == "step 1" and len(seen["labels"]) >= 2, seen


# --------------------------------------------------------------------------- the picture's step labels


@pytest.mark.parametrize(("steps", "first_ms"), [(3, 8_000), (20, 8_000), (200, 8_000), (16, 30_000)])
def test_the_pictures_step_labels_never_overlap(steps: int, first_ms: int, tmp_path: Path) -> None:
    report = analyze(many_steps(tmp_path, steps=steps, first_ms=first_ms), jobs=1)
    figure = _png_figure(report)
    figure.draw_without_rendering()  # the constrained layout done: every extent final
    [panel] = [ax for ax in figure.axes if ax.get_title().startswith("(f) step timeline")]
    texts = [t for t in panel.texts if t.get_text().startswith("step ")]
    boxes = sorted((box.x0, box.x1) for box in (t.get_window_extent() for t in texts))
    assert texts and texts[0].get_text() == "step 1" and len(texts) >= min(steps, 3)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(boxes)), boxes  # never two overlapping
    plot = panel.get_window_extent()
    assert plot.x0 <= boxes[0][0] and boxes[-1][1] <= plot.x1  # inside the panel
