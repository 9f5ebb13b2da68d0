"""The memory recorder (tool ``torch_memory``): which stages and windows get a snapshot, and how it is saved.

There is no GPU here, so most tests swap ``instrument.recorders.memory.CUDA`` -- the only object
through which the recorder reaches ``torch.cuda.memory`` -- for :class:`StandInCuda`, a documented
stand-in that logs the history calls and hands out a synthetic snapshot shaped like torch's
(segments, blocks, frames, device_traces). Everything else is real: the session, torch.profiler
beside it, the files, names and manifest. ``test_without_cuda_*`` use the real ``torch.cuda``
(unavailable here); tests/recorders/test_memory_gpu.py runs the real thing on a GPU.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
import instrument.testing  # noqa: E402
from instrument._warnings import WarnOnce  # noqa: E402
from instrument.naming import parse_trace_name, trace_basename  # noqa: E402
from instrument.recorders import _snapshot_files, memory  # noqa: E402
from instrument.run._state import STATE  # noqa: E402
from tests.conftest import without_timeline  # noqa: E402


class StandInCuda:
    """Stands in for ``torch.cuda.memory`` where there is no GPU (see the module docstring).

    ``calls``: ``("record", options_or_None, clear)`` and ``("snapshot",)``; ``frames`` frames per
    block and trace entry; ``entries`` trace entries; ``fail`` makes ``snapshot`` raise.
    """

    def __init__(self, *, frames: int = 50, entries: int = 3, blocks: int = 2, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.frames, self.entries, self.blocks, self.fail = frames, entries, blocks, fail

    def available(self) -> bool:
        return True

    def record(self, options: Any, *, clear: bool) -> None:
        self.calls.append(("record", options, clear))

    def snapshot(self) -> dict[str, Any]:
        self.calls.append(("snapshot",))
        if self.fail:
            raise RuntimeError("stand-in snapshot failure")

        def frames() -> list[dict[str, Any]]:  # distinct objects, as in torch's (pickle memoizes shared ones)
            return [{"filename": "train.py", "line": i, "name": f"f{i}"} for i in range(self.frames)]

        blocks = [
            {"size": 512, "address": a, "state": "active_allocated", "frames": frames()} for a in range(self.blocks)
        ]
        segment = {"address": 0, "total_size": 2 << 20, "allocated_size": 1024, "blocks": blocks}
        entries = [{"action": "alloc", "addr": a, "size": 512, "frames": frames()} for a in range(self.entries)]
        return {"segments": [segment], "device_traces": [entries]}

    @property
    def history(self) -> list[tuple[Any, ...]]:
        """The record calls, options shown as their max_entries (None: off)."""
        return [("on" if c[1] is not None else "off", c[2]) for c in self.calls if c[0] == "record"]


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInCuda]:
    stand_in = StandInCuda()
    monkeypatch.setattr(memory, "CUDA", stand_in)
    monkeypatch.setattr(memory, "_oom_history", None)
    yield stand_in
    STATE.on_oom = None


@pytest.fixture(autouse=True)
def _fresh_warning(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(memory, "NO_CUDA", WarnOnce(memory.logger))
    yield
    STATE.on_oom = None


def _snapshots(save: Path) -> list[Path]:
    return sorted(save.glob("*.pickle"), key=lambda p: p.name)


def _manifest(save: Path) -> list[dict[str, Any]]:
    """The manifest's lines, less the step timeline's."""
    (path,) = save.glob("instrument-manifest-*.jsonl")
    return without_timeline(json.loads(line) for line in path.read_text().splitlines())


def _run(save: Path, n: int = 1, **config: Any) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(save), **config), role="actor", rank=0, world_size=1)

    @ins.profiled_stage("update_actor")
    def update() -> None:
        pass

    for step in range(1, n + 1):
        with ins.profile_step(step):
            update()
    ins.finish()


def test_a_profiled_stage_gets_one_snapshot_named_and_listed_like_a_trace(cuda: StandInCuda, tmp_path: Path) -> None:
    options = ins.MemorySnapshots(max_entries=500, stack_depth=4, context="alloc", stacks="all")
    _run(tmp_path, n=2, tool="torch_memory", steps=(2,), memory=options)
    (snap,) = _snapshots(tmp_path)
    name = parse_trace_name(snap.name)
    assert name is not None
    assert (name.role, name.stage, name.step, name.rank, name.world_size, name.window) == (
        "actor",
        "update-actor",
        2,
        0,
        1,
        None,
    )
    (record,) = _manifest(tmp_path)
    assert record["path"] == snap.name
    assert (record["tool"], record["stage"], record["bytes"]) == ("torch_memory", "update_actor", snap.stat().st_size)
    # History on for the stage (this config, earlier history cleared), one snapshot, then off.
    assert cuda.calls == [("record", options, True), ("snapshot",), ("record", None, False)]
    with open(snap, "rb") as handle:
        saved = pickle.load(handle)  # our own file, written by this test: safe to unpickle
    assert all(len(b["frames"]) == 4 for b in saved["segments"][0]["blocks"])
    assert all(len(e["frames"]) == 4 for e in saved["device_traces"][0])
    assert saved["device_traces"][0][0]["frames"][0]["line"] == 0  # the innermost frames are kept
    assert not list(tmp_path.glob(".instrument-tmp-*"))  # nothing left behind


def test_default_options_when_the_config_has_no_memory_section(cuda: StandInCuda, tmp_path: Path) -> None:
    _run(tmp_path, tool="torch_memory")
    assert cuda.calls[0] == ("record", ins.MemorySnapshots(), True)
    assert len(_snapshots(tmp_path)) == 1


def test_unprofiled_steps_and_ranks_record_nothing(cuda: StandInCuda, tmp_path: Path) -> None:
    _run(tmp_path, n=3, tool="torch_memory", steps=(5,))
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), tool="torch_memory", ranks=(1,))
    ins.configure(cfg, role="a", rank=0, world_size=2)
    with ins.profile_step(1), ins.profiled_stage("gen"):
        pass
    ins.finish()
    assert cuda.calls == []
    assert _snapshots(tmp_path) == []


def _scheduled_run(save: Path, schedule: ins.Schedule, mini_batches: int, **config: Any) -> None:
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(1,), schedule=schedule, **config)
    ins.configure(cfg, role="actor", rank=0, world_size=1)

    @ins.profiled_stage("update_actor", scheduled=True)
    def update() -> None:
        for i in range(mini_batches):
            with ins.profile_window(mini_batch=i):
                pass

    with ins.profile_step(1):
        update()
    ins.finish()


def test_a_scheduled_stage_gets_one_snapshot_per_recorded_window(cuda: StandInCuda, tmp_path: Path) -> None:
    _scheduled_run(tmp_path, ins.Schedule(wait=1, active=2, repeat=2), 7, tool="torch_memory")
    windows = [parse_trace_name(p.name).window for p in _snapshots(tmp_path)]  # type: ignore[union-attr]
    assert sorted(windows) == [(1, 2), (4, 5)]  # type: ignore[type-var]
    assert sorted(tuple(r["window"]) for r in _manifest(tmp_path)) == [(1, 2), (4, 5)]
    # History only around the recorded mini-batches, cleared at each window's start.
    assert cuda.history == [("on", True), ("off", False), ("on", True), ("off", False)]


def test_a_loop_ending_inside_a_window_saves_it_as_partial(cuda: StandInCuda, tmp_path: Path) -> None:
    _scheduled_run(tmp_path, ins.Schedule(active=3), 2, tool="torch_memory")
    (snap,) = _snapshots(tmp_path)
    name = parse_trace_name(snap.name)
    assert name is not None and (name.window, name.partial) == ((0, 1), True)


def test_a_loop_ending_where_a_window_begins_saves_nothing(cuda: StandInCuda, tmp_path: Path) -> None:
    _scheduled_run(tmp_path, ins.Schedule(wait=2, active=1), 2, tool="torch_memory")
    assert _snapshots(tmp_path) == []
    # Recording began for mini-batch 2, which never ran: no snapshot, history off again.
    assert cuda.history == [("on", True), ("off", False)]
    assert ("snapshot",) not in cuda.calls


def test_continuous_mode_saves_one_snapshot_per_step(cuda: StandInCuda, tmp_path: Path) -> None:
    _run(tmp_path, n=2, tool="torch_memory", discrete=False)
    stages = [(n.stage, n.step) for n in map(parse_trace_name, (p.name for p in _snapshots(tmp_path))) if n]
    assert sorted(stages) == [("continuous", 1), ("continuous", 2)]


def test_beside_torch_profiler_each_stage_gets_a_trace_and_a_snapshot(cuda: StandInCuda, tmp_path: Path) -> None:
    _run(tmp_path, tool="torch+torch_memory", contents=("cpu",))
    assert len(_snapshots(tmp_path)) == 1
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 1
    assert sorted(r["tool"] for r in _manifest(tmp_path)) == ["torch", "torch_memory"]


def test_beside_nvtx_the_snapshots_are_saved(cuda: StandInCuda, tmp_path: Path) -> None:
    pytest.importorskip("nvtx")
    _run(tmp_path, tool="nvtx+torch_memory")
    assert [r["tool"] for r in _manifest(tmp_path)] == ["torch_memory"]


def test_without_cuda_one_warning_and_nothing_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert not torch.cuda.is_available()
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, n=3, tool="torch_memory")
        _scheduled_run(tmp_path, ins.Schedule(active=2), 3, tool="torch_memory")
    warnings = [r.getMessage() for r in caplog.records if "CUDA" in r.getMessage()]
    assert warnings == [
        "instrument: memory recording (tool 'torch_memory') needs CUDA, which is not available here; "
        "no memory snapshot is saved"
    ]
    assert _snapshots(tmp_path) == []


def test_a_snapshot_over_max_bytes_loses_its_history_first(
    cuda: StandInCuda, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cuda.entries = 20_000  # a history of several MiB; the segments alone are small
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, tool="torch_memory", memory={"max_bytes": 1 << 20, "stack_depth": 64})
    (snap,) = _snapshots(tmp_path)
    assert snap.stat().st_size <= 1 << 20
    with open(snap, "rb") as handle:
        saved = pickle.load(handle)  # our own file: safe
    assert saved["device_traces"] == [[]] and saved["segments"][0]["blocks"]
    assert any("without its event history" in r.getMessage() for r in caplog.records)


def test_a_snapshot_too_large_even_without_history_is_not_saved(
    cuda: StandInCuda, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cuda.blocks, cuda.frames = 20_000, 64
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, tool="torch_memory", memory={"max_bytes": 1 << 20, "stack_depth": 64})
    assert _snapshots(tmp_path) == []
    assert not list(tmp_path.glob(".instrument-tmp-*/*"))  # the cut-off attempt was removed
    assert any("larger than memory.max_bytes" in r.getMessage() for r in caplog.records)
    assert cuda.history[-1] == ("off", False)  # history still turned off


def test_a_failing_snapshot_is_reported_and_the_trace_beside_it_still_saved(
    cuda: StandInCuda, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cuda.fail = True
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, n=2, tool="torch+torch_memory", contents=("cpu",))
    assert _snapshots(tmp_path) == []
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 2
    assert [r.getMessage() for r in caplog.records if "memory snapshot" in r.getMessage()] == [
        "instrument: could not save a memory snapshot (role actor, rank 0): RuntimeError: stand-in snapshot "
        "failure; training continues"
    ]
    assert cuda.history[-1] == ("off", False)
    assert ins.current_run() is not None


def test_a_name_taken_meanwhile_is_never_overwritten(
    cuda: StandInCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Every name the writer picks exists already (another process took it): reported, nothing overwritten.
    taken = tmp_path / "x.pickle"
    taken.write_bytes(b"mine")
    monkeypatch.setattr(_snapshot_files.naming, "trace_basename", lambda **fields: "x")
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, tool="torch_memory")
    assert [p.name for p in _snapshots(tmp_path)] == ["x.pickle"] and taken.read_bytes() == b"mine"
    assert any("no free name for a .pickle file" in r.getMessage() for r in caplog.records)


def test_snapshots_are_on_disk_once_exports_are_waited_for(cuda: StandInCuda, tmp_path: Path) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), tool="torch_memory"), role="actor", rank=0, world_size=1)
    for step in (1, 2, 3):
        with ins.profile_step(step), ins.profiled_stage("gen"):
            pass
    instrument.testing.wait_for_exports()  # what the finish hook waits for: written in the background
    assert len(_snapshots(tmp_path)) == 3


def test_a_snapshot_that_cannot_be_written_is_reported_and_the_next_one_saved(
    cuda: StandInCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    taken = iter([{"segments": [{"blocks": [], "hook": lambda: None}]}])  # a lambda cannot be pickled
    real = cuda.snapshot
    monkeypatch.setattr(cuda, "snapshot", lambda: next(taken, None) or real())
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _run(tmp_path, n=2, tool="torch_memory")
    assert len(_snapshots(tmp_path)) == 1  # the writer thread lived on
    assert any("could not write a memory snapshot" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob(".instrument-tmp-*/*"))


# ---------------------------------------------------------------------- pure parts


_frames = st.lists(st.integers(0, 99).map(lambda i: {"filename": "f.py", "line": i, "name": "n"}), max_size=20)


@given(st.lists(_frames, max_size=5), st.lists(_frames, max_size=5), st.integers(1, 25))
def test_cut_stacks_keeps_the_innermost_frames(blocks: list[Any], entries: list[Any], depth: int) -> None:
    snapshot = {
        "segments": [{"blocks": [{"frames": list(f)} for f in blocks]}],
        "device_traces": [[{"frames": list(f)} for f in entries]],
    }
    cut = _snapshot_files.cut_stacks(snapshot, depth)
    assert [b["frames"] for b in cut["segments"][0]["blocks"]] == [f[:depth] for f in blocks]
    assert [e["frames"] for e in cut["device_traces"][0]] == [f[:depth] for f in entries]


@given(
    role=st.sampled_from(["actor", "critic", "actor_rollout_ref"]),
    stage=st.sampled_from(["update_actor", "oom-update_actor", "gen"]),
    step=st.integers(0, 10**6),
    world=st.integers(1, 4096),
    window=st.none() | st.tuples(st.integers(0, 50), st.integers(0, 50)).map(lambda w: (min(w), max(w))),
)
def test_snapshot_names_parse_back(role: str, stage: str, step: int, world: int, window: Any) -> None:
    base = trace_basename(role=role, stage=stage, step=step, rank=world - 1, world_size=world, window=window)
    parsed = parse_trace_name(base + _snapshot_files.SNAPSHOT_SUFFIX)
    assert parsed is not None and parsed.basename() == base
