"""The report at a glance: the picture and the page.

The picture: bars in the order the stages ran, an engine counted by its work (its frontend's window is the same
seconds, never stacked again), ``[mbA-B]`` windows where the table shows them, legends inside the figure naming
only what is drawn. The page: the run's facts, each trace file linked relative to the page, the top ops per
stage, the memory table and the skipped files, checked in real headless Chromium (offline, no console error).

Traces are built with known durations (:func:`tests.analyze.test_analyze.known_run`, no clock is read) or are the
committed real vLLM traces of ``tests/data/vllm``.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from instrument import cli, naming
from instrument.analyze import Report, analyze, write_html, write_png
from instrument.analyze.render import _png as picture
from tests.analyze.render.browser import needs_chromium, probe
from tests.analyze.test_analyze import known_run, sdk_trace

VLLM_BUSY = Path(__file__).parents[2] / "data" / "vllm" / "busy"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The known run on two hosts, plus a memory timeline and a damaged trace."""
    directory = known_run(tmp_path_factory.mktemp("pictures") / "profile", hosts=("node-a", "node-b"))
    base = naming.trace_basename(role="actor", stage="update_actor", step=2, rank=0, world_size=3, window=(1, 2))
    (directory / f"{base}.memory-timeline.html").write_text("<html></html>")
    broken = naming.trace_basename(role="actor", stage="compute_log_prob", step=9, rank=0, world_size=3)
    (directory / f"{broken}.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-6])
    return directory


@pytest.fixture(scope="module")
def report(run: Path) -> Report:
    return analyze(run, jobs=1, details=True)


@pytest.fixture(scope="module")
def engine() -> Report:
    return analyze(VLLM_BUSY, jobs=1)


def _drawn(report: Report) -> Any:
    fig = picture._figure(report)
    fig.draw_without_rendering()  # the layout done, as when written: every extent final
    return fig


def _legend_labels(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


# --------------------------------------------------------------------------- the picture


def test_rows_and_stacks_run_in_pipeline_order_with_their_windows(report: Report) -> None:
    fig = _drawn(report)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ran = ["generate_sequences", "compute_log_prob", "update_actor [mb1-2]"]  # not alphabetical
    assert rows == [f"step {step}  {stage}" for step in (1, 2) for stage in ran]
    breakdown = next(ax for ax in fig.axes if ax.get_title().startswith("(b)"))
    assert _legend_labels(breakdown) == ran[::-1]  # read as the stack: the last stage, on top, first
    bottoms = [bar.get_y() for bar in breakdown.containers[0]]
    assert bottoms == [0.0, 0.0]  # the first stage that ran stands at the bottom of each step


def test_an_engine_counts_its_work_and_its_frontend_window_is_not_stacked_again(engine: Report) -> None:
    (work,) = [s for s in engine.stages if s.stage == "engine"]
    (frontend,) = [s for s in engine.stages if s.stage == "frontend"]
    assert work.max_ms > 240 and frontend.max_ms > 240  # both profiled the same ~245 ms window
    fig = _drawn(engine)
    breakdown = next(ax for ax in fig.axes if ax.get_title().startswith("(b)"))
    heights = [bar.get_height() for container in breakdown.containers for bar in container]
    assert heights == [pytest.approx(work.ranks[0].judged_ms)]  # 126.5 ms of execution, once
    assert _legend_labels(breakdown) == ["engine"]  # the frontend did no work: not drawn, not in the legend
    assert "execution time" in breakdown.get_title()
    heatmap = fig.axes[0]
    assert "stage work per rank" in heatmap.get_title() and "engine's execution time" in heatmap.get_title()
    assert "collectives" not in heatmap.get_title()  # no collective waited in: not explained
    cells = [t.get_text() for t in heatmap.texts]
    assert "126.5" in cells and "246.6" not in cells


def test_an_engine_inside_a_traced_generating_stage_is_not_stacked_on_it(engine: Report) -> None:
    (work,) = [s for s in engine.stages if s.stage == "engine"]
    generating = dataclasses.replace(work, stage="generate_sequences", role="rollout")  # the stage it served
    both = dataclasses.replace(engine, stages=(*engine.stages, generating))
    breakdown = next(ax for ax in _drawn(both).axes if ax.get_title().startswith("(b)"))
    heights = [bar.get_height() for container in breakdown.containers for bar in container]
    assert sum(heights) == pytest.approx(work.ranks[0].judged_ms)  # the generating stage's, not twice that
    assert _legend_labels(breakdown) == ["generate_sequences"]  # the engine, inside it, is not a bar of its own


def test_a_run_without_engines_says_nothing_of_them(report: Report) -> None:
    fig = _drawn(report)
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "engine" not in titles and "work" not in titles
    assert "(b) per-step breakdown: stage wall time" in titles


def test_legends_stay_inside_the_figure_with_long_names(tmp_path: Path) -> None:
    directory = known_run(tmp_path / "profile", world=2, steps=1)
    t0 = 9_000_000_000.0
    for i in range(6):  # six stages of two long-named roles: 60-character legend entries
        role = ("actor_rollout_ref_colocated", "critic_value_head_worker")[i % 2]
        stage = f"compute_a_rather_long_stage_number_{i}"
        span = {"ph": "X", "cat": "cpu_op", "name": stage, "pid": 1, "tid": 7, "ts": t0 + i * 1e5, "dur": 5e3}
        sdk_trace(directory, [span], stage=stage, step=1, rank=0, world=2, role=role)
    report = analyze(directory, jobs=1)
    fig = _drawn(report)
    edge = fig.bbox
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    for legend in legends:
        box = legend.get_window_extent()
        assert edge.x0 - 1 <= box.x0 and box.x1 <= edge.x1 + 1 and edge.y0 - 1 <= box.y0, (box, edge)
    labels = _legend_labels(next(ax for ax in fig.axes if ax.get_title().startswith("(b)")))
    assert len(labels) == 9 and any(label.startswith("critic_value_head_worker: compute_a_rather") for label in labels)
    write_png(report, tmp_path / "long.png")  # looked at: the legend wraps into columns under (b)


# --------------------------------------------------------------------------- the page


def test_the_run_facts_come_from_the_manifest_and_the_names(report: Report) -> None:
    run = report.run
    assert run is not None
    assert run.hosts == ("node-a", "node-b")
    assert run.tools == ("torch",) and run.manifests == 1
    assert run.roles == (("actor", 3, (0, 1, 2)),)
    assert run.steps == (1, 2) and run.windows == ((1, 2),) and run.modes == ("discrete",)
    assert run.first_ns == 1_764_000_000_000_001_000 and run.last_ns == 1_764_000_000_000_002_002


def test_the_top_ops_are_self_time_from_the_slowest_rank(report: Report) -> None:
    by_stage = {s.stage: s for s in report.stage_ops}
    assert list(by_stage) == ["generate_sequences", "compute_log_prob", "update_actor"]  # as they ran
    generate = by_stage["generate_sequences"]
    assert (generate.step, generate.rank) == (2, "2")  # the straggler, in the last step
    # aten::mm 1 ms holds aten::addmm 0.5 ms: each has 0.5 ms of its own
    assert [(name, round(spent, 6), calls) for name, spent, calls in generate.ops] == [
        ("aten::addmm", 0.5, 1),
        ("aten::mm", 0.5, 1),
    ]


def test_the_page_links_every_trace_relative_to_itself(report: Report, run: Path, tmp_path: Path) -> None:
    (tmp_path / "pages").mkdir()  # beside the analysed folder, not in it
    page = write_html(report, tmp_path / "pages" / "analysis.html")
    text = page.read_text(encoding="utf-8")
    hrefs = re.findall(r'<a href="([^"]+)" title=', text)  # the page's own links (plotly's code has others)
    targets = {(page.parent / unquote(h)).resolve() for h in hrefs if not h.startswith("http")}
    read = {Path(f).resolve() for s in report.stages for r in s.ranks for f in r.files}
    memory = {Path(m.path).resolve() for m in report.memory}
    assert read | memory <= targets and all(t.is_file() for t in targets)
    assert all(not h.startswith("/") for h in hrefs if not h.startswith("http"))  # relative: the folder can move
    for words in ("<h2>Run</h2>", "node-a, node-b", "3 ranks traced (0-2) of world size 3", "mb1-2"):
        assert words in text
    assert "<h2>Top ops per stage</h2>" in text and "<code>aten::addmm</code>" in text
    assert "<h2>Memory files</h2>" in text and ".memory-timeline.html</a>" in text
    assert "<h2>Skipped files (1)</h2>" in text and "step9" in text


_PROBE = """<script>
window.addEventListener('load', function () {
  var out = {
    errors: window.__probeErrors,
    resources: performance.getEntriesByType('resource').map(function (e) { return e.name; }),
    links: Array.from(document.querySelectorAll('a[href]')).map(function (a) { return a.href; }),
    sections: Array.from(document.querySelectorAll('h2')).map(function (h) { return h.textContent; }),
    image: document.querySelector('img').naturalWidth
  };
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.slow
@needs_chromium
def test_the_page_works_offline_in_headless_chromium(report: Report, tmp_path: Path) -> None:
    page = write_html(report, tmp_path / "analysis.html")
    seen = probe(page, _PROBE, tmp_path)
    assert seen.seen["errors"] == [] and seen.seen["resources"] == []  # no console error, no request
    assert seen.console == [], seen.console
    assert seen.seen["image"] > 0  # the picture decodes
    assert {"Run", "Stages", "Top ops per stage", "Memory files", "Skipped files (1)"} <= set(seen.seen["sections"])
    files = [Path(unquote(urlparse(link).path)) for link in seen.seen["links"] if link.startswith("file:")]
    read = {Path(f) for s in report.stages for r in s.ranks for f in r.files}
    assert read <= set(files) and all(f.is_file() for f in files)  # the browser resolves them to the traces


def test_the_command_writes_the_page_with_its_details(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "analysis.html"
    assert cli.main(["analyze", str(run), "--no-png", "--quiet", "--html", str(page)]) == 1  # one file skipped
    capsys.readouterr()
    text = page.read_text(encoding="utf-8")
    assert "<h2>Run</h2>" in text and "<h2>Top ops per stage</h2>" in text and "Trace files (18)" in text
