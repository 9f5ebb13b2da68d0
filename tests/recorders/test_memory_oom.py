"""``memory.on_oom``: a snapshot when a CUDA out-of-memory error leaves a ``profiled_stage``, on any step.

No GPU here: the error is torch's own ``torch.OutOfMemoryError`` raised by the test (a failure shape
the CPU cannot produce), and ``instrument.recorders.memory.CUDA`` is the documented stand-in of
tests/recorders/test_memory.py. tests/recorders/test_memory_gpu.py runs a real OOM on a GPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
from instrument._warnings import WarnOnce  # noqa: E402
from instrument.naming import parse_trace_name  # noqa: E402
from instrument.recorders import memory  # noqa: E402
from instrument.run._state import STATE  # noqa: E402
from tests.recorders.test_memory import StandInCuda  # noqa: E402


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInCuda]:
    stand_in = StandInCuda()
    monkeypatch.setattr(memory, "CUDA", stand_in)
    monkeypatch.setattr(memory, "_oom_history", None)
    monkeypatch.setattr(memory, "NO_CUDA", WarnOnce(memory.logger))
    yield stand_in
    STATE.on_oom = None


def _configure(save: Path, **memory_options: Any) -> None:
    options = {"on_oom": True, **memory_options}
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(99,), memory=options)  # step 99 never comes
    ins.configure(cfg, role="actor", rank=0, world_size=1)


def _oom() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _caught(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except BaseException as exc:  # the test inspects whatever comes out
        return exc
    raise AssertionError("nothing was raised")


def _frames(exc: BaseException) -> list[tuple[str, str | None]]:
    return [(frame.name, frame.line) for frame in traceback.extract_tb(exc.__traceback__)]


def _oom_snapshots(save: Path) -> list[Path]:
    return sorted(save.glob("*.pickle"))


def test_an_oom_on_an_unprofiled_step_is_snapshotted_and_passes_through_unchanged(
    cuda: StandInCuda, tmp_path: Path
) -> None:
    raised: list[BaseException] = []

    @ins.profiled_stage("update_actor")
    def update() -> None:
        error = torch.OutOfMemoryError("CUDA out of memory")
        raised.append(error)
        raise error

    _configure(tmp_path)
    with ins.profile_step(3):
        caught = _caught(update)
    assert caught is raised[0]  # the same object
    # History on from configure() (no clearing, bounded by max_entries), then one snapshot.
    assert cuda.calls == [("record", ins.MemorySnapshots(on_oom=True), False), ("snapshot",)]
    (snap,) = _oom_snapshots(tmp_path)
    name = parse_trace_name(snap.name)
    assert name is not None and (name.role, name.stage, name.step) == ("actor", "oom-update-actor", 3)
    (manifest,) = tmp_path.glob("instrument-manifest-*.jsonl")
    (record,) = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert (record["stage"], record["tool"], record["path"]) == ("oom-update_actor", "torch_memory", snap.name)


def test_the_traceback_is_the_one_without_on_oom(cuda: StandInCuda, tmp_path: Path) -> None:
    @ins.profiled_stage("update_actor")
    def update() -> None:
        _oom()

    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path / "off")), role="actor", rank=0, world_size=1)
    without = _frames(_caught(update))
    _configure(tmp_path)
    with_snapshot = _frames(_caught(update))
    assert with_snapshot == without
    assert with_snapshot[-1] == (
        "_oom",
        'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")',
    )
    assert len(_oom_snapshots(tmp_path)) == 1


def test_nested_stages_save_one_snapshot_per_error_and_the_run_is_bounded(cuda: StandInCuda, tmp_path: Path) -> None:
    @ins.profiled_stage("outer")
    def outer() -> None:
        with ins.profiled_stage("middle"):
            inner()

    @ins.profiled_stage("inner")
    def inner() -> None:
        _oom()

    _configure(tmp_path, oom_max_snapshots=2)
    for _ in range(3):
        _caught(outer)
    stages = sorted(parse_trace_name(p.name).stage for p in _oom_snapshots(tmp_path))  # type: ignore[union-attr]
    assert stages == ["oom-inner", "oom-inner"]  # where it happened; two errors, then the bound
    assert cuda.calls.count(("snapshot",)) == 2


def test_with_blocks_and_coroutines_save_it_too(cuda: StandInCuda, tmp_path: Path) -> None:
    @ins.profiled_stage("generate")
    async def generate() -> None:
        await asyncio.sleep(0)
        _oom()

    def in_block() -> None:
        with ins.profiled_stage("compute_log_prob"):
            _oom()

    _configure(tmp_path, oom_max_snapshots=5)
    assert isinstance(_caught(in_block), torch.OutOfMemoryError)
    assert isinstance(_caught(lambda: asyncio.run(generate())), torch.OutOfMemoryError)
    stages = sorted(parse_trace_name(p.name).stage for p in _oom_snapshots(tmp_path))  # type: ignore[union-attr]
    assert stages == ["oom-compute-log-prob", "oom-generate"]


def test_other_errors_take_no_snapshot(cuda: StandInCuda, tmp_path: Path) -> None:
    @ins.profiled_stage("update_actor")
    def update(error: BaseException) -> None:
        raise error

    _configure(tmp_path)
    for error in (RuntimeError("CUDA error: an illegal memory access"), ValueError("x"), KeyboardInterrupt()):
        assert _caught(lambda e=error: update(e)) is error  # type: ignore[misc]
    assert ("snapshot",) not in cuda.calls
    assert _oom_snapshots(tmp_path) == []


def test_a_failing_dump_is_reported_and_the_oom_still_propagates(
    cuda: StandInCuda, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cuda.fail = True
    _configure(tmp_path)
    # In a step (unprofiled): a stage outside any step would be named, a warning of its own.
    with caplog.at_level(logging.WARNING, logger="instrument"), ins.profile_step(1):
        caught = _caught(ins.profiled_stage("update_actor")(_oom))
    assert isinstance(caught, torch.OutOfMemoryError) and caught.__context__ is None
    assert [r.getMessage() for r in caplog.records] == [
        "instrument: could not save a memory snapshot at an out-of-memory error (role actor, rank 0): "
        "RuntimeError: stand-in snapshot failure; training continues"
    ]


def test_on_a_profiled_step_the_stage_snapshot_and_the_oom_snapshot_are_both_kept(
    cuda: StandInCuda, tmp_path: Path
) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), tool="torch_memory", steps=(1,), memory={"on_oom": True})
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    with ins.profile_step(1):
        _caught(ins.profiled_stage("update_actor")(_oom))
    ins.finish()
    stages = sorted(parse_trace_name(p.name).stage for p in _oom_snapshots(tmp_path))  # type: ignore[union-attr]
    assert stages == ["oom-update-actor", "update-actor"]
    # The stage's recording ends by going back to the run-long history; finish() ends that.
    assert cuda.history == [("on", False), ("on", True), ("on", False), ("off", False)]


def test_only_oom_snapshots_with_tool_none(cuda: StandInCuda, tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), tool="none", memory={"on_oom": True})
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    _caught(ins.profiled_stage("update_actor")(_oom))
    assert len(_oom_snapshots(tmp_path)) == 1


def test_nothing_after_finish_and_nothing_when_off(cuda: StandInCuda, tmp_path: Path) -> None:
    _configure(tmp_path)
    ins.finish()
    assert STATE.on_oom is None and cuda.history[-1] == ("off", False)  # the run-long history ended with it
    _caught(ins.profiled_stage("update_actor")(_oom))
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    assert STATE.on_oom is None
    assert cuda.history[-1] == ("off", False)  # the new run records no history
    _caught(ins.profiled_stage("update_actor")(_oom))
    assert _oom_snapshots(tmp_path) == []


def test_without_cuda_one_warning_and_the_oom_propagates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert not torch.cuda.is_available()
    with caplog.at_level(logging.WARNING, logger="instrument"):
        _configure(tmp_path)
        for step in (1, 2):
            with ins.profile_step(step):  # unprofiled: the OOM hook works on any step
                assert isinstance(_caught(ins.profiled_stage("update_actor")(_oom)), torch.OutOfMemoryError)
    assert [r.getMessage() for r in caplog.records] == [
        "instrument: memory.on_oom needs CUDA, which is not available here; no memory snapshot is saved"
    ]
    assert _oom_snapshots(tmp_path) == []
