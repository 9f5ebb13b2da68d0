"""The step timeline drawn: the report's spans per process, the page's interactive chart (in real headless Chromium),
the picture's panel, role bands at scale, and ``--merged-trace`` for Perfetto.

Every timeline file is written with ``instrument.timeline``'s encoders, with exact durations on a made-up clock:
no clock is read and nothing sleeps. The Chromium test runs the page on Chromium's virtual time.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from instrument import cli
from instrument.analyze import analyze, write_html, write_png
from instrument.analyze.model import Report
from instrument.analyze.render._lanes import timeline_view
from instrument.analyze.render._merged import merged_trace_bytes
from instrument.analyze.render._png import _figure
from instrument.analyze.render._timeline_html import DIV_ID, timeline_figure
from instrument.timeline import encode_clock, encode_header, encode_name, encode_span, encode_thread
from tests.analyze.render.browser import needs_chromium, probe

MS = 1_000_000
BASE = 7_000 * MS  # the made-up clock's reading at step 1
STEPS = 3
SpanSpec = tuple[str, str, str, int, int, int, int]  # kind, role, stage, step, start ns, end ns, thread


def write_timeline(
    directory: Path,
    role: str,
    rank: int,
    spans: list[SpanSpec],
    *,
    host: str = "node1",
    world: int = 4,
    clock: tuple[int, int] | None = None,
) -> Path:
    """One process's timeline file, as the run writes it."""
    data = encode_header(role=role, rank=rank, world_size=world, host=host, pid=100 + rank, mono_ns=0, wall_ns=0)
    if clock is not None:
        data += encode_clock(clock[0], clock[1], "test")
    names: dict[tuple[str, str, str], int] = {}
    threads: dict[int, int] = {}
    for kind, span_role, stage, step, start, end, thread in spans:
        if (kind, span_role, stage) not in names:
            names[kind, span_role, stage] = len(names)
            data += encode_name(names[kind, span_role, stage], kind, span_role, stage)
        if thread not in threads:
            threads[thread] = len(threads)
            data += encode_thread(threads[thread], 1000 + thread)
        data += encode_span(names[kind, span_role, stage], threads[thread], step, start, end)
    path = directory / f"{role}_timeline_step0_rank{rank}-of-{world}_{host}_pid{100 + rank}_1.timeline.bin"
    path.write_bytes(data)
    return path


def known_spans(rank: int) -> tuple[str, list[SpanSpec]]:
    """Ranks 0-1 actors, 2-3 rollout; per step rank 2 generates 100 ms, rank 3 500 ms, then the actors update
    100 ms; rank 0's update holds a nested ``forward`` and a mini-batch window."""
    role = "actor" if rank < 2 else "rollout"
    spans: list[SpanSpec] = []
    for step in range(1, STEPS + 1):
        t = BASE + (step - 1) * 1_000 * MS
        spans.append(("step", role, "", step, t, t + 700 * MS, 0))
        if role == "rollout":
            spans.append(("stage", role, "generate_sequences", step, t, t + (500 if rank == 3 else 100) * MS, 0))
        else:
            spans.append(("stage", role, "update_actor", step, t + 510 * MS, t + 610 * MS, 0))
            if rank == 0:
                spans.append(("stage", role, "forward", step, t + 520 * MS, t + 560 * MS, 0))
                spans.append(("window", role, "mb0", step, t + 515 * MS, t + 600 * MS, 0))
    return role, spans


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("timeline") / "profile"
    directory.mkdir()
    for rank in range(4):
        role, spans = known_spans(rank)
        write_timeline(directory, role, rank, spans)
    return directory


@pytest.fixture(scope="module")
def report(run_dir: Path) -> Report:
    return analyze(run_dir, jobs=1)


def _lane_rows(report: Report) -> dict[str, list[Any]]:
    assert report.timeline_spans is not None
    return {lane.label: list(lane.rows()) for lane in report.timeline_spans.lanes}


# --------------------------------------------------------------------------- the report's spans


def test_the_report_keeps_every_span_per_process_on_one_axis(report: Report) -> None:
    spans = report.timeline_spans
    assert spans is not None and spans.aligned and spans.note is None
    assert [lane.label for lane in spans.lanes] == ["actor rank 0", "actor rank 1", "rollout rank 2", "rollout rank 3"]
    rows = _lane_rows(report)
    for rank in range(4):
        role, written = known_spans(rank)
        kept = [(k, r, s, step, start - BASE, end - BASE, 0) for k, r, s, step, start, end, _ in written]
        assert sorted(rows[f"{role} rank {rank}"]) == sorted(kept)  # ns since the first span, exactly
    assert "timeline_spans" not in report.to_dict()  # never in --json


def test_filters_keep_the_spans_the_analysis_keeps(run_dir: Path) -> None:
    filtered = analyze(run_dir, jobs=1, ranks=[0, 3], steps=[2])
    assert filtered.timeline_spans is not None
    rows = _lane_rows(filtered)
    assert set(rows) == {"actor rank 0", "rollout rank 3"}
    assert {row[3] for lane in rows.values() for row in lane} == {2}


def test_hosts_without_a_clock_estimate_are_drawn_starting_together(tmp_path: Path) -> None:
    for rank, host, shift in ((0, "node1", 0), (1, "node2", 86_400_000 * MS)):  # node2's clock a day ahead
        starts = [BASE + shift + s * 1_000 * MS + rank * 30 * MS for s in (1, 2)]
        spans: list[SpanSpec] = [
            ("step", "actor", "", s, t, t + 300 * MS, 0) for s, t in zip((1, 2), starts, strict=True)
        ]
        write_timeline(tmp_path, "actor", rank, spans, host=host)
    report = analyze(tmp_path, jobs=1)
    drawn = report.timeline_spans
    assert drawn is not None and not drawn.aligned and drawn.note and "not aligned" in drawn.note
    first = {lane.host: min(lane.start_ns) for lane in drawn.lanes}
    assert first == {"node1": 0, "node2": 0}  # each host's first step starts with the reference host's
    data = json.loads(merged_trace_bytes(report, compress=False))
    assert data["otherData"]["aligned"] is False


def test_a_host_with_a_clock_estimate_is_put_on_the_reference_clock(tmp_path: Path) -> None:
    offset = 5_000 * MS  # node2's clock minus node1's
    for rank, host, shift in ((0, "node1", 0), (1, "node2", offset)):
        write_timeline(
            tmp_path,
            "actor",
            rank,
            [("step", "actor", "", 1, BASE + shift + rank * 10 * MS, BASE + shift + 300 * MS, 0)],
            host=host,
            clock=None if rank == 0 else (offset, 1_000),
        )
    spans = analyze(tmp_path, jobs=1).timeline_spans
    assert spans is not None and spans.aligned
    assert [lane.start_ns[0] for lane in spans.lanes] == [0, 10 * MS]


# --------------------------------------------------------------------------- the merged trace


def _merged(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="ascii") as text:
        data: dict[str, Any] = json.load(text)
    return data


def test_merged_trace_has_a_process_per_rank_and_the_timelines_times(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged.json.gz"
    rc = cli.main(["analyze", str(run_dir), "--no-png", "--quiet", "--merged-trace", str(out)])
    assert rc == 0
    assert f"trace    {out}" in capsys.readouterr().out
    events = _merged(out)["traceEvents"]
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in events if e["ph"] == "M"}
    names = {pid: args["name"] for (name, pid, _), args in meta.items() if name == "process_name"}
    assert sorted(names.values()) == ["actor rank 0", "actor rank 1", "rollout rank 2", "rollout rank 3"]
    order = sorted(names, key=lambda pid: meta["process_sort_index", pid, 0]["sort_index"])
    assert [names[pid] for pid in order] == ["actor rank 0", "actor rank 1", "rollout rank 2", "rollout rank 3"]
    pid_of = {name: pid for pid, name in names.items()}
    spans = [e for e in events if e["ph"] == "X"]
    for rank in range(4):
        role, written = known_spans(rank)
        pid = pid_of[f"{role} rank {rank}"]
        got = sorted((e["cat"], e["args"]["step"], e["ts"], e["dur"]) for e in spans if e["pid"] == pid)
        want = sorted(
            (kind, step, (start - BASE) / 1000, (end - start) / 1000) for kind, _, _, step, start, end, _ in written
        )
        assert got == want  # µs on the aligned axis, from the first span (ns / 1000, as written)
        steps_tid = {e["tid"] for e in spans if e["pid"] == pid and e["cat"] == "step"}
        assert steps_tid == {0} and meta["thread_name", pid, 0]["name"] == "steps"  # steps: their own track
        assert all(e["tid"] != 0 for e in spans if e["pid"] == pid and e["cat"] != "step")
    forward = next(e for e in spans if e["name"] == "forward")
    assert forward["args"] == {"step": 1, "rank": 0, "role": "actor"}


def test_merged_trace_tracks_nest_even_when_a_thread_interleaves(tmp_path: Path) -> None:
    # two coroutines on one thread: a [0, 100] and b [50, 150] overlap without nesting
    spans: list[SpanSpec] = [
        ("step", "rollout", "", 1, BASE, BASE + 200 * MS, 0),
        ("stage", "rollout", "a", 1, BASE, BASE + 100 * MS, 0),
        ("stage", "rollout", "b", 1, BASE + 50 * MS, BASE + 150 * MS, 0),
        ("stage", "rollout", "c", 1, BASE + 60 * MS, BASE + 70 * MS, 0),
        ("stage", "rollout", "d", 1, BASE + 10 * MS, BASE + 20 * MS, 1),
    ]
    write_timeline(tmp_path, "rollout", 0, spans, world=1)
    data = json.loads(merged_trace_bytes(analyze(tmp_path, jobs=1), compress=False))
    x = [e for e in data["traceEvents"] if e["ph"] == "X"]
    tid = {e["name"]: e["tid"] for e in x}
    assert tid["a"] != tid["b"] and tid["d"] not in {tid["a"], tid["b"], 0}
    by_tid: dict[int, list[tuple[float, float]]] = {}
    for e in x:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for runs in by_tid.values():  # every pair on a track nests or is disjoint
        for s1, e1 in runs:
            for s2, e2 in runs:
                assert e1 <= s2 or e2 <= s1 or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)


def test_merged_trace_is_plain_json_without_gz_and_never_written_through_a_symlink(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "merged.json"
    assert cli.main(["analyze", str(run_dir), "--no-png", "--quiet", "--merged-trace", str(plain)]) == 0
    assert json.loads(plain.read_text())["traceEvents"]
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    link = tmp_path / "link.json.gz"
    link.symlink_to(target)
    assert cli.main(["analyze", str(run_dir), "--no-png", "--quiet", "--merged-trace", str(link)]) == 2
    assert "symlink" in capsys.readouterr().err
    assert target.read_text() == "keep" and link.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_merged_trace_without_a_timeline_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json.gz"
    assert cli.main(["analyze", str(tmp_path), "--no-png", "--quiet", "--merged-trace", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no step timeline" in err  # an empty folder: nothing to analyse at all (issue 27), said first
    assert not out.exists()


def test_help_tells_of_the_merged_trace_and_the_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["analyze", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--merged-trace OUT.json.gz" in text and "Perfetto" in text and "interactive step timeline" in text


# --------------------------------------------------------------------------- the page and the picture


def test_the_page_holds_the_findings_and_the_chart_inline(report: Report, tmp_path: Path) -> None:
    page = write_html(report, tmp_path / "a.html").read_text(encoding="utf-8")
    assert f'id="{DIV_ID}"' in page and "Plotly.newPlot" in page
    assert not re.search(r"<(script|link|img)\b[^>]*\b(src|href)=[\"']?(https?:)?//", page)  # nothing fetched
    assert "<h2>Findings</h2>" in page and "rank 3" in page
    figure = timeline_figure(timeline_view(report), {})  # type: ignore[arg-type]
    lanes = figure["layout"]["yaxis"]["categoryarray"]
    assert lanes == ["actor rank 0", "actor rank 1", "rollout rank 2", "rollout rank 3"]
    steps = [s for s in figure["layout"]["shapes"] if s.get("name", "").startswith("step ")]
    assert [s["name"] for s in steps] == ["step 1", "step 2", "step 3"]
    generate = next(t for t in figure["data"] if t["name"] == "rollout: generate_sequences")
    assert sorted(zip(generate["y"], generate["x"], strict=True))[-1] == ("rollout rank 3", 500.0)


def test_the_page_is_written_without_plotly_and_says_what_is_missing(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    monkeypatch.setitem(sys.modules, "plotly.io", None)
    page = write_html(report, tmp_path / "a.html").read_text(encoding="utf-8")
    assert "needs plotly" in page and "Plotly.newPlot" not in page and "<h2>Findings</h2>" in page


def test_importing_the_package_loads_no_plotting_library() -> None:
    code = (
        "import sys, instrument.analyze; print(sorted(m for m in ('plotly', 'matplotlib', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_picture_has_a_timeline_panel(report: Report, tmp_path: Path) -> None:
    figure = _figure(report)
    [panel] = [ax for ax in figure.axes if ax.get_title().startswith("(f) step timeline")]
    assert [t.get_text() for t in panel.get_yticklabels()] == [
        "actor rank 0",
        "actor rank 1",
        "rollout rank 2",
        "rollout rank 3",
    ]
    assert write_png(report, tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- at scale: role bands


def test_many_ranks_are_drawn_as_role_bands_with_their_outliers(tmp_path: Path) -> None:
    world = 64  # ranks 0-31 actors, 32-63 rollout; rollout rank 40 generates 3x as long on every step
    for rank in range(world):
        role = "actor" if rank < 32 else "rollout"
        spans: list[SpanSpec] = []
        for step in (1, 2, 3):
            t = BASE + step * 2_000 * MS
            spans.append(("step", role, "", step, t, t + 1_500 * MS, 0))
            if role == "rollout":
                length = (300 if rank == 40 else 100 + rank % 7) * MS
                spans.append(("stage", role, "generate_sequences", step, t, t + length, 0))
            else:
                spans.append(("stage", role, "update_actor", step, t + 1_000 * MS, t + (1_100 + rank % 5) * MS, 0))
        write_timeline(tmp_path, role, rank, spans, world=world)
    report = analyze(tmp_path, jobs=1)
    assert report.timeline is not None
    assert any(f.kind == "straggler" and f.rank == 40 for f in report.timeline.findings)
    view = timeline_view(report)
    assert view is not None and view.banded and view.ranks == {"actor": 32, "rollout": 32}
    labels = [d.label for d in view.lanes]
    assert len(labels) <= 12
    assert labels[0].startswith("actor rank ") and labels[0].endswith("(median of 32)")
    assert "rollout rank 40 (straggler)" in labels
    assert sum(label.endswith("(busiest)") for label in labels if label.startswith("rollout")) == 3
    assert len(merged_trace_bytes(report, compress=False).decode().split('"process_name"')) == world + 1


# --------------------------------------------------------------------------- in a real browser


# What the page drew, read from its DOM once plotly has drawn; then a hover on rank 3's step-2 generation and a zoom.
_PROBE = r"""<script>
window.addEventListener('load', function () {
  var tries = 0;
  function texts(root, css) {
    return Array.from(root.querySelectorAll(css)).map(function (t) { return t.textContent; });
  }
  function finish(out) {
    out.resources = performance.getEntriesByType('resource').map(function (e) { return e.name; });
    out.external = Array.from(document.querySelectorAll('[src],[href]'))
      .map(function (e) { return e.getAttribute('src') || e.getAttribute('href'); })
      .filter(function (u) { return /^\s*(https?:)?\/\//i.test(u); });
    out.errors = window.__probeErrors;
    var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function look() {
    var gd = document.getElementById('instrument-timeline');
    if (!(gd && gd._fullLayout && gd.querySelector('g.barlayer'))) {
      if (tries++ < 200) { setTimeout(look, 50); return; }
      finish({drawn: false}); return;
    }
    var out = {drawn: true};
    out.lanes = texts(gd, 'g.ytick text');
    out.bars = gd.querySelectorAll('g.barlayer g.point path').length;
    out.shapes = gd.querySelectorAll('g.shapelayer path').length;
    out.annotations = texts(gd, 'g.annotation text');
    out.legend = texts(gd, 'g.legend text.legendtext');
    out.modebar = Array.from(gd.querySelectorAll('.modebar-btn'))
      .map(function (b) { return b.getAttribute('data-title'); });
    var curve = gd.data.findIndex(function (t) { return t.name === 'rollout: generate_sequences'; });
    var point = gd.data[curve].y.findIndex(function (y, i) {
      return y === 'rollout rank 3' && gd.data[curve].customdata[i][0] === 2; });
    Plotly.Fx.hover(gd, [{curveNumber: curve, pointNumber: point}]);
    out.hover = texts(gd, 'g.hoverlayer').join(' ');
    Plotly.relayout(gd, {'xaxis.range': [1000, 1200]}).then(function () {
      out.zoomed = gd._fullLayout.xaxis.range;
      out.ticks = texts(gd, 'g.xtick text');
      finish(out);
    });
  }
  look();
});
</script>"""


@pytest.mark.slow
@needs_chromium
def test_the_page_draws_the_timeline_in_headless_chromium(report: Report, tmp_path: Path) -> None:
    probed = probe(write_html(report, tmp_path / "analysis.html"), _PROBE, tmp_path, window="1400,1200")
    seen = probed.seen
    assert seen["drawn"], seen
    assert sorted(seen["lanes"]) == ["actor rank 0", "actor rank 1", "rollout rank 2", "rollout rank 3"]
    assert seen["bars"] == 4 * STEPS + 2 * STEPS + 2 * STEPS + STEPS  # steps, generation, updates, rank 0's forward
    assert seen["shapes"] >= STEPS and seen["annotations"] == [f"step {s}" for s in range(1, STEPS + 1)]
    assert {"rollout: generate_sequences", "actor: update_actor", "actor: forward"} <= set(seen["legend"])
    hover = " ".join(seen["hover"].split())
    assert "generate_sequences" in hover and "rollout rank 3" in hover and "step 2: 500.000 ms" in hover, hover
    assert seen["zoomed"] == [1000, 1200] and "1100" in "".join(seen["ticks"]).replace(",", "")
    assert {"Zoom", "Pan", "Reset axes"} <= set(seen["modebar"]) and "Share chart..." not in seen["modebar"]
    assert seen["resources"] == [] and seen["external"] == []  # no network request, no external source
    assert seen["errors"] == []
    assert probed.console == [], probed.console
