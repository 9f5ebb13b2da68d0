"""``instrument analyze`` lists memory snapshots and timelines beside the traces, reading pickles safely.

The snapshots are written by the real recorder through the documented ``torch.cuda.memory``
stand-in of tests/recorders/test_memory.py (no GPU here); the analysis, the files and the rendering are real.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
from instrument import cli  # noqa: E402
from instrument.analyze import analyze, render_text, write_html  # noqa: E402
from instrument.analyze.render._tables import memory_rows  # noqa: E402
from instrument.analyze.traces import _snapshots  # noqa: E402
from instrument.naming import trace_basename  # noqa: E402
from instrument.recorders import memory  # noqa: E402
from instrument.run._state import STATE  # noqa: E402
from tests.recorders.test_memory import StandInCuda  # noqa: E402


@pytest.fixture
def save(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A save_path with one stage snapshot (rank 0, step 1), an OOM snapshot (step 2) and a trace."""
    monkeypatch.setattr(memory, "CUDA", StandInCuda(entries=4))
    monkeypatch.setattr(memory, "_oom_history", None)
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path), tool="torch+torch_memory", contents=("cpu",), steps=(1,), memory={"on_oom": True}
    )
    ins.configure(cfg, role="actor", rank=0, world_size=1)

    @ins.profiled_stage("update_actor")
    def update(fail: bool) -> None:
        torch.ones(4).sum()
        if fail:
            raise torch.OutOfMemoryError("CUDA out of memory")

    with ins.profile_step(1):
        update(False)
    with pytest.raises(torch.OutOfMemoryError), ins.profile_step(2):
        update(True)
    ins.finish()
    STATE.on_oom = None
    return tmp_path


def test_snapshots_are_listed_with_size_and_peak(save: Path) -> None:
    report = analyze(save)
    kinds = sorted((m.kind, m.stage, m.step) for m in report.memory)
    # the name as written in @profiled_stage (the manifest's), as the trace table spells it; not the file name's form
    assert kinds == [("oom snapshot", "update_actor", 2), ("snapshot", "update_actor", 1)]
    for found in report.memory:
        assert found.bytes == Path(found.path).stat().st_size
        # stand-in: 512 B per block allocated at the end (2 blocks, allocated_size 1024), 4 allocs of 512 B
        assert found.peak_allocated == 1024
    assert report.files == 1  # the torch trace; snapshots are not read as traces
    data = json.loads(report.to_json())
    assert {m["kind"] for m in data["memory"]} == {"snapshot", "oom snapshot"}


def test_the_table_says_how_to_open_them(save: Path) -> None:
    text = render_text(analyze(save), width=200)
    assert "Memory files" in text
    assert "https://pytorch.org/memory_viz" in text
    assert "oom snapshot" in text


def test_the_cli_prints_them_and_filters_apply(save: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["analyze", str(save), "--steps", "2", "--quiet"]) in (0, None)
    out = capsys.readouterr().out
    assert "oom snapshot" in out and "memory_viz" in out
    assert [m.step for m in analyze(save, steps=[1]).memory] == [1]
    assert analyze(save, ranks=[3]).memory == ()
    assert analyze(save, stages=["generate"]).memory == ()


def test_html_report_lists_them(save: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("matplotlib")
    page = write_html(analyze(save), tmp_path_factory.mktemp("out") / "report.html").read_text()
    assert "<h2>Memory files</h2>" in page and "memory_viz" in page


def test_a_large_snapshot_is_listed_but_not_read(save: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_snapshots, "READ_MAX_BYTES", 10)
    assert {m.note for m in analyze(save).memory} == {"not read: over 0 MiB"}
    assert {m.peak_allocated for m in analyze(save).memory} == {None}


def test_past_the_read_budget_snapshots_are_listed_without_a_peak(save: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At thousands of ranks reading every snapshot would take long: a budget bounds the bytes read for peaks."""
    first, second = sorted(analyze(save).memory, key=lambda m: Path(m.path).name)
    monkeypatch.setattr(_snapshots, "READ_BUDGET_BYTES", max(first.bytes, second.bytes))
    peaks = [m.peak_allocated for m in sorted(analyze(save).memory, key=lambda m: Path(m.path).name)]
    assert peaks == [1024, None]  # the first fits the budget, the second no longer does


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    name = trace_basename(role="actor", stage="update", step=1, rank=0, world_size=1) + ".pickle"
    (tmp_path / name).write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Touch(marker)]]}))
    (found,) = _snapshots.find_memory_files(tmp_path)
    assert not marker.exists()
    assert found.peak_allocated is None
    assert found.note.startswith("not a readable snapshot: UnpicklingError: refused pathlib")


def test_timelines_and_foreign_names_are_told_apart(tmp_path: Path) -> None:
    base = trace_basename(role="actor", stage="update", step=3, rank=0, world_size=2, window=(0, 1))
    (tmp_path / f"{base}.memory-timeline.html").write_text("<html></html>")
    (tmp_path / "notes.pickle").write_bytes(b"x")  # not an SDK name: not listed
    (timeline,) = _snapshots.find_memory_files(tmp_path)
    assert (timeline.kind, timeline.window, timeline.peak_allocated) == ("timeline", (0, 1), None)
    assert memory_rows([timeline])[0][5] == "mb0-1"


_events = st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 30)), max_size=40)


@given(st.integers(0, 1 << 40), _events)
def test_peak_allocated_replays_the_history(start: int, events: list[tuple[bool, int]]) -> None:
    allocated, peak, trace = start, start, []
    for is_alloc, wanted in events:
        size = wanted if is_alloc else min(wanted, allocated)
        allocated += size if is_alloc else -size
        peak = max(peak, allocated)
        trace.append({"action": "alloc" if is_alloc else "free_completed", "size": size})
        trace.append({"action": "free_requested", "size": size})  # not a change yet
    snapshot = {"segments": [{"allocated_size": allocated}], "device_traces": [trace]}
    assert _snapshots.peak_allocated(snapshot) == peak
    restored = _snapshots._PlainUnpickler(io.BytesIO(pickle.dumps(snapshot))).load()
    assert restored == snapshot  # plain values pass the restricted unpickler unchanged
