"""The report at a glance: the terminal table fits 80, 100 and 160 columns with every number whole on one
line, stages in the order they ran, rollout engines judged by their work, one spelling of a stage's name,
and a step's time that counts an engine's and its frontend's windows once.

Traces are built with known durations (:func:`tests.analyze.test_analyze.sdk_trace`, timeline files with
:func:`tests.analyze.analyzers.test_compare.write_timeline`) beside real vLLM engine and frontend traces
(``tests/data/vllm``) and real GPU traces (``tests/data/hta``); no clock is read.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from instrument.analyze import Report, analyze, render_text
from instrument.analyze.analyzers._stats import step_totals
from instrument.analyze.render import _tables as tables
from instrument.analyze.render._text import DROPPED_FIRST, fit, shorten
from instrument.analyze.render._timeline import step_rows
from instrument.analyze.render._words import ms
from instrument.manifest import Manifest
from tests.analyze.analyzers.test_compare import write_timeline
from tests.analyze.test_analyze import BASE_US, known_run, sdk_trace

DATA = Path(__file__).parents[2] / "data"
BUSY = DATA / "vllm" / "busy"
ENGINE = "rank0.1796061723530724090.pt.trace.json.gz"
FRONTEND = "vm_26059.async_llm.1796061723451645091.pt.trace.json.gz"
BUSY_WORK_MS = 126.524  # tests/analyze/traces/test_engines.py: the engine's execution time in its 246.6 ms window
MS_NS = 1_000_000
WIDTHS = (80, 100, 160)
NUMBER = re.compile(r"^[\d,]+(\.\d+)?%?$")


def _with_engine(directory: Path, step: int = 1) -> Path:
    """The real busy vLLM engine and frontend traces of one replica, under the names relocation gives them."""
    shutil.copyfile(BUSY / ENGINE, directory / f"rollout_engine_step{step}_rank0-of-1_replica0_{ENGINE}")
    shutil.copyfile(BUSY / FRONTEND, directory / f"rollout_frontend_step{step}_replica0_{FRONTEND}")
    return directory


def _known_timeline(directory: Path, world: int = 3, steps: int = 2) -> None:
    """Timeline files for :func:`known_run`: per step generate_sequences, compute_log_prob, update_actor."""
    for rank in range(world):
        spans: list[tuple[Any, ...]] = []
        for step in range(1, steps + 1):
            t = step * 10_000 * MS_NS
            for stage, start_ms, length_ms in (
                ("generate_sequences", 0, 90 if rank == 2 else 15),
                ("compute_log_prob", 200, 50),
                ("update_actor", 300, 10),
            ):
                spans.append(("stage", "actor", stage, step, t + start_ms * MS_NS, t + (start_ms + length_ms) * MS_NS))
            spans.append(("step", "actor", "", step, t, t + 400 * MS_NS))
        write_timeline(directory, "actor", rank, world, spans)


@pytest.fixture(scope="module")
def with_engine(tmp_path_factory: pytest.TempPathFactory) -> Report:
    directory = known_run(tmp_path_factory.mktemp("engine") / "p")
    _known_timeline(directory)
    report = analyze(_with_engine(directory), jobs=1)
    assert report.ok, report.skipped
    return report


@pytest.fixture(scope="module")
def real_gpu() -> Report:
    return analyze(DATA / "hta" / "trace_filter", jobs=1)


def _stage_table(text: str, report: Report) -> tuple[list[str], list[str]]:
    """The stage table's header lines and body lines (one per row) as rendered."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith(f"instrument analyze: {report.directory}"))
    rule = next(i for i in range(top + 1, len(lines)) if set(lines[i]) <= set("━╇┡┩─ "))
    body = []
    for line in lines[rule + 1 :]:
        if line.startswith("└") or re.match(r"\d[\d,]* trace files?,", line):
            break
        body.append(line)
    return lines[top + 1 : rule], body


# --------------------------------------------------------------------------- the width of the terminal


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["with_engine", "real_gpu"])
def test_every_number_is_whole_on_its_row_line(width: int, which: str, request: pytest.FixtureRequest) -> None:
    report: Report = request.getfixturevalue(which)
    text = render_text(report, width=width)
    assert max(map(len, text.splitlines())) <= width  # nothing for the terminal to wrap
    columns = tables.headers(report)
    rows = tables.table_rows(report, report.pipeline)
    layout = fit(columns, rows, width, shortened=("role", "stage"), droppable=DROPPED_FIRST)
    _, body = _stage_table(text, report)
    assert len(body) == len(rows)  # one line a row: nothing wrapped onto a second
    shown = 0
    for line, row in zip(body, rows, strict=True):
        cells = line.split()
        for i in layout.shown:
            if NUMBER.match(row[i]) and columns[i] != "step":
                assert row[i] in cells, (columns[i], row[i], line)  # whole, between spaces
                shown += 1
    assert shown >= 2 * len(rows)  # median ms and max ms at least
    left_out = [h for h in DROPPED_FIRST if h in columns and h not in layout.columns]
    if left_out:
        assert f"left out for {width} columns: {', '.join(left_out)}" in " ".join(text.split())
    if width == 160:
        assert not left_out  # a wide terminal shows every column the report has
    words = text.split()
    for step, wall, *_ in step_rows(report):  # the per-step table above: its numbers whole too
        assert wall in words and step.split()[0] in words  # a traced step: "3 traced"


def test_at_160_columns_no_label_is_cut(with_engine: Report) -> None:
    text = render_text(with_engine, width=160)
    assert "\u2026" not in text
    assert "update_actor [mb1-2]" in text and "generate_sequences" in text


def test_a_column_of_dashes_is_left_out(with_engine: Report, tmp_path: Path) -> None:
    columns = tables.headers(with_engine)
    assert "gpu ms" not in columns  # CPU-only traces: every row "-"
    for i, header in enumerate(columns):
        assert any(row[i] != "-" for row in tables.table_rows(with_engine)), header
    one = analyze(known_run(tmp_path / "one", world=1, steps=1), jobs=1)
    assert {"slowest", "max/med", "lost ms", "gpu ms"}.isdisjoint(tables.headers(one))
    shown, _ = _stage_table(render_text(one, width=160), one)
    assert "slowest" not in " ".join(shown)


def test_labels_are_cut_with_an_ellipsis_keeping_the_window() -> None:
    assert shorten("update_actor [mb2-3]", 16) == "update_\u2026 [mb2-3]"
    assert shorten("actor_rollout_ref", 8) == "actor_r\u2026"
    assert shorten("engine", 8) == "engine"
    assert len(shorten("a_very_long_stage_name [mb10-20,partial]", 12)) == 12


def test_headers_break_between_words_never_inside_one() -> None:
    layout = fit(("median ms", "max/med", "mini-batch ms"), [("1,381.6", "1.66", "7.85")], 30)
    assert layout.headers()[0].split("\n") == ["median ms"]  # room enough: one line
    narrow = fit(
        ("step", "role", "median ms", "max/med", "mini-batch ms"), [("2", "actor", "1,381.6", "1.66", "7.85")], 34
    )
    assert narrow.width <= 34
    for header in narrow.headers():
        assert all(
            part in ("step", "role", "median", "ms", "max/", "med", "mini-", "batch", "mini-batch")
            for part in header.split("\n")
        ), header


# --------------------------------------------------------------------------- the order stages ran in


def test_stages_are_in_the_order_they_ran(tmp_path: Path) -> None:
    # ran: prepare (6 ms), then train (60 ms; rank 2 90 ms: the straggler), then collect (20 ms): neither
    # alphabetical (collect, prepare, train) nor by time lost (train, collect, prepare)
    plan = (("prepare", 0, 6.0), ("train", 10, 60.0), ("collect", 100, 20.0))
    manifest = Manifest(tmp_path)
    try:
        for rank in range(3):
            t0 = BASE_US + rank * 7_000_000.0
            spans: list[tuple[Any, ...]] = []
            for stage, start_ms, length_ms in plan:
                length = 90.0 if stage == "train" and rank == 2 else length_ms
                ts = t0 + start_ms * 1000.0
                event = {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": stage,
                    "pid": 1,
                    "tid": 7,
                    "ts": ts,
                    "dur": length * 1000.0,
                }
                sdk_trace(tmp_path, [event], stage=stage, step=1, rank=rank, manifest=manifest)
                spans.append(("stage", "actor", stage, 1, start_ms * MS_NS, round((start_ms + length) * MS_NS)))
            spans.append(("step", "actor", "", 1, 0, 200 * MS_NS))
            write_timeline(tmp_path, "actor", rank, 3, spans)
    finally:
        manifest.close()
    report = analyze(tmp_path, jobs=1)
    assert [s.stage for s in report.stages] == ["train", "collect", "prepare"]  # --json: time lost first
    assert [s.stage for s in report.pipeline] == ["prepare", "train", "collect"]
    _, body = _stage_table(render_text(report, width=160), report)
    assert [line.split("│")[3].strip() for line in body] == ["prepare", "train", "collect"]


def test_engine_rows_follow_the_generating_stage(with_engine: Report) -> None:
    # the order comes from the step timeline (built from traces: every step traced)
    assert [row[0] for row in step_rows(with_engine)] == ["1 traced", "2 traced"]
    order = [(s.step, s.stage) for s in with_engine.pipeline]
    assert order == [
        (1, "generate_sequences"),
        (1, "engine"),
        (1, "frontend"),
        (1, "compute_log_prob"),
        (1, "update_actor"),
        (2, "generate_sequences"),
        (2, "compute_log_prob"),
        (2, "update_actor"),
    ]


# --------------------------------------------------------------------------- engines judged by their work


def test_the_engine_row_shows_its_work_as_json_judges_it(with_engine: Report) -> None:
    [engine] = [s for s in with_engine.stages if s.stage == "engine"]
    data = next(d for d in with_engine.to_dict()["stages"] if d["stage"] == "engine")
    assert data["straggler_by"] == "work" and data["median_work_ms"] == pytest.approx(BUSY_WORK_MS, abs=0.01)
    row = dict(zip(tables.headers(with_engine), tables.table_rows(with_engine, [engine])[0], strict=True))
    assert row["work med ms"] == row["work max ms"] == ms(BUSY_WORK_MS) == "126.5"
    assert row["median ms"] == "246.6"  # the profiling window, which judges nothing
    text = " ".join(render_text(with_engine, width=160).split())
    assert "an engine's execution time (not its profiling window)" in text


def test_a_step_counts_engine_and_frontend_windows_once(with_engine: Report) -> None:
    groups = {i: list(s.ranks) for i, s in enumerate(with_engine.stages)}
    # known_run's medians: generate_sequences 15, compute_log_prob 50, update_actor's two mini-batches 8
    assert step_totals(groups) == {1: pytest.approx(73.0), 2: pytest.approx(73.0)}
    engine_only = {i: ranks for i, ranks in groups.items() if with_engine.stages[i].engine_side}
    totals = step_totals(engine_only)  # no generating stage traced: the engine's time, once
    assert totals == {1: pytest.approx(max(s.median_ms for s in with_engine.stages if s.engine_side))}
