"""Every form of the Chrome trace format: the object and the bare array (closed or not), complete events and
``B`` / ``E`` pairs, instant, counter and flow events passed over; a file with no stage or step says why; no
step is ``null`` and ``ProfilerStep#0`` is step 0. Traces are built here with exact ``ts`` / ``dur``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from instrument import cli
from instrument.analyze import Report, analyze, render_text
from instrument.analyze.render import _tables as tables
from instrument.analyze.traces import _reader, _stream

T0 = 1_764_000_000_000.0


def _x(name: str, ts: float, dur: float, cat: str | None = "cpu_op", tid: int = 1) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "name": name, "pid": 3, "tid": tid, "ts": T0 + ts, "dur": dur}
    if cat is not None:
        ev["cat"] = cat
    return ev


def _events() -> list[dict[str, Any]]:
    """Two steps of one stage with an op inside: the numbers every form below must give."""
    out = []
    for step in (1, 2):
        t = step * 200_000.0
        out += [
            _x(f"ProfilerStep#{step}", t, 150_000.0, cat="user_annotation"),
            _x("train", t + 10, 50_000.0 * step, cat="user_annotation"),
            _x("aten::mm", t + 20, 30_000.0),
        ]
    return out


def _numbers(report: Report) -> list[tuple[Any, ...]]:
    assert report.ok, report.skipped
    return [(s.step, s.stage, s.median_ms, s.cpu_ms, s.events) for s in sorted(report.stages, key=lambda s: s.step)]


EXPECTED = [(1, "train", 50.0, 30.0, 2.0), (2, "train", 100.0, 30.0, 2.0)]


# --------------------------------------------------------------------------- the array form


@pytest.fixture(params=["stream", "ijson", "whole"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each of the three ways a file is read: the standard library's stream, ijson, decoded whole."""
    if request.param == "ijson":

        def unfollowed(stream: Any) -> Any:
            raise _stream.UnfollowedError("left to ijson")
            yield  # pragma: no cover - a generator, as the real one

        monkeypatch.setattr(_stream, "events", unfollowed)
    elif request.param == "whole":
        monkeypatch.setattr(_reader, "_loads", lambda: json.loads)
    return str(request.param)


@pytest.mark.parametrize(
    "ending",
    ["]", "]\n", "", "\n", ",", ",\n  "],
    ids=["closed", "closed-newline", "open", "open-newline", "trailing-comma", "trailing-comma-space"],
)
def test_the_array_form_closed_or_not(tmp_path: Path, reader: str, ending: str) -> None:
    text = "[\n" + ",\n".join(json.dumps(e) for e in _events()) + ending
    (tmp_path / "rank-0.json").write_text(text, encoding="utf-8")
    assert _numbers(analyze(tmp_path, jobs=1)) == EXPECTED, reader


def test_an_array_cut_inside_an_event_is_still_an_error(tmp_path: Path, reader: str) -> None:
    text = "[" + ",".join(json.dumps(e) for e in _events()) + ', {"ph": "X", "na'
    (tmp_path / "rank-0.json").write_text(text, encoding="utf-8")
    report = analyze(tmp_path, jobs=1)
    assert [s.reason.startswith("not JSON") for s in report.skipped] == [True], reader


def test_the_stream_reads_both_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(_stream, "PIECE", 3)  # pieces cut everywhere
    events = _events()
    for text in ("[" + json.dumps(events)[1:-1] + "]", json.dumps(events)[:-1], json.dumps(events)[:-1] + ",  "):
        assert list(_stream.events(io.BytesIO(text.encode()))) == events
    assert list(_stream.events(io.BytesIO(b"[ ]"))) == list(_stream.events(io.BytesIO(b"["))) == []
    with pytest.raises(_stream.UnfollowedError):
        list(_stream.events(io.BytesIO(b"[1] x")))


# --------------------------------------------------------------------------- B / E pairs and other phases


def _as_begin_end(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same ranges as B / E pairs, in time order (an E ends the latest open B of its thread)."""
    marks = []
    for i, e in enumerate(events):
        begin = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
        end = {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}
        marks += [(e["ts"], 1, -e["dur"], i, begin), (e["ts"] + e["dur"], 0, e["dur"], i, end)]
    return [m[-1] for m in sorted(marks, key=lambda m: m[:4])]


def test_begin_end_pairs_are_ranges(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text(json.dumps({"traceEvents": _as_begin_end(_events())}))
    assert _numbers(analyze(tmp_path, jobs=1)) == EXPECTED


def test_pairs_are_matched_per_thread_and_strays_are_passed_over(tmp_path: Path) -> None:
    begin = {"ph": "B", "name": "train", "cat": "user_annotation", "pid": 3, "ts": T0}
    events = [
        {"ph": "E", "pid": 3, "tid": 1, "ts": T0},  # an end with no beginning
        begin | {"tid": 1},
        begin | {"tid": 2, "name": "aten::mm", "cat": "cpu_op", "ts": T0 + 5, "args": {"a": 1}},
        {"ph": "E", "pid": 3, "tid": 1, "ts": T0 + 8_000},  # ends train (tid 1), not the op on tid 2
        {"ph": "E", "pid": 3, "tid": 2, "ts": T0 + 6_005, "args": {"b": 2}},
        begin | {"tid": 1, "name": "never_closed", "ts": T0 + 9_000},
        {"ph": "i", "name": "marker", "pid": 3, "tid": 1, "ts": T0 + 1, "s": "t"},
        {"ph": "C", "name": "memory", "pid": 3, "ts": T0 + 2, "args": {"bytes": 10}},
        {"ph": "s", "id": 1, "pid": 3, "tid": 1, "ts": T0 + 3, "cat": "ac2g", "name": "ac2g"},
        {"ph": "M", "name": "thread_name", "pid": 3, "tid": 1, "args": {"name": "main"}},
        {"ph": "n", "name": "async", "pid": 3, "tid": 1, "ts": "not a number"},
    ]
    (tmp_path / "rank-0.json").write_text(json.dumps({"traceEvents": events}))
    report = analyze(tmp_path, jobs=1)
    assert report.ok and report.notes == ()
    [stage] = report.stages
    [rank] = stage.ranks
    assert (stage.stage, rank.wall_ms, rank.cpu_ms, rank.events) == ("train", 8.0, 6.0, 2)


def test_instant_and_counter_events_change_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    noisy = tmp_path / "noisy"
    plain.mkdir()
    noisy.mkdir()
    others = [
        {"ph": "i", "name": "i", "pid": 3, "tid": 1, "ts": T0 + 150_000, "s": "g"},
        {"ph": "I", "name": "i", "pid": 3, "tid": 1, "ts": T0 + 150_001},
        {"ph": "C", "name": "c", "pid": 3, "ts": T0 + 150_002, "args": {"v": 1}},
        {"ph": "f", "id": 2, "pid": 3, "tid": 1, "ts": T0 + 150_003, "bp": "e"},
        {"ph": "R", "name": "mark", "pid": 3, "tid": 1, "ts": T0},
        {"ph": "X"},  # a complete event with nothing in it: counted, measured as nothing
    ]
    (plain / "rank-0.json").write_text(json.dumps({"traceEvents": _events()}))
    (noisy / "rank-0.json").write_text(json.dumps({"traceEvents": _events() + others}))
    assert [n[:4] for n in _numbers(analyze(noisy, jobs=1))] == [n[:4] for n in _numbers(analyze(plain, jobs=1))]


# --------------------------------------------------------------------------- no stage, no step, step 0


def test_a_file_with_no_stage_or_step_says_why_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generic = [{"ph": "X", "name": f"work{i}", "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0} for i in range(4)]
    (tmp_path / "generic.json").write_text(json.dumps({"traceEvents": generic}))
    (tmp_path / "instants.json").write_text(json.dumps([{"ph": "i", "name": "tick", "ts": 1, "pid": 1, "tid": 1}]))
    assert cli.main(["analyze", str(tmp_path), "--no-png", "--json"]) == 0  # read: not an error
    out, err = capsys.readouterr()
    lines = sorted(err.strip().splitlines())
    assert lines == [
        f"instrument analyze: note: {tmp_path / 'generic.json'}: its events have no category (cat): read as one"
        " range, first event to last",
        f"instrument analyze: note: {tmp_path / 'instants.json'}: no duration events (complete X events or B/E"
        " pairs): nothing to measure",
    ]
    data = json.loads(out)
    assert [n["path"] for n in data["notes"]] == [str(tmp_path / "generic.json"), str(tmp_path / "instants.json")]
    [row] = data["stages"]  # the instants give no row, not a 0.00 ms one
    assert (row["step"], row["stage"], row["max_ms"], row["per_rank"][0]["basis"]) == (None, "trace", 0.035, "span")


def test_an_sdk_trace_without_its_stage_range_says_so(tmp_path: Path) -> None:
    from tests.analyze.test_analyze import sdk_trace

    sdk_trace(tmp_path, [_x("aten::mm", 0, 50.0)], stage="update_actor", step=1, rank=0)
    report = analyze(tmp_path, jobs=1)
    [note] = report.notes
    assert (
        note.reason
        == "no range named 'update_actor' (the stage) and no mini_batch ranges: read as one range, first event to last"
    )


def test_step_0_is_a_step_and_no_step_is_null(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [
        _x("ProfilerStep#0", 0, 10_000.0, cat="user_annotation"),
        _x("train", 10, 8_000.0, cat="user_annotation"),
        _x("ProfilerStep#1", 10_000, 10_000.0, cat="user_annotation"),
        _x("train", 10_010, 9_000.0, cat="user_annotation"),
    ]
    (tmp_path / "rank-0.json").write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "plain.json").write_text(json.dumps({"traceEvents": [_x("aten::mm", 0, 20.0)]}))
    report = analyze(tmp_path, jobs=1)
    assert sorted((s.step is None, s.step or 0, s.stage) for s in report.stages) == [
        (False, 0, "train"),
        (False, 1, "train"),
        (True, 0, "trace"),
    ]
    assert report.steps == (0, 1)
    assert [s.stage for s in analyze(tmp_path, steps=[0], jobs=1).stages] == ["train"]
    by_step = {r[0]: r for r in tables.table_rows(report)}
    assert set(by_step) == {"0", "1", "-"}
    assert cli.main(["analyze", str(tmp_path), "--json", "--no-png", "--steps", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(s["step"], s["stage"]) for s in data["stages"]] == [(0, "train")] and data["steps"] == [0]
    assert cli.main(["analyze", str(tmp_path), "--json", "--no-png"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted((s["step"] is None, s["step"]) for s in data["stages"]) == [(False, 0), (False, 1), (True, None)]
    assert "step -" not in render_text(report)  # the table's "-" is its step column, not a label
