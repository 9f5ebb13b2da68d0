"""On a CUDA GPU: real allocator history, snapshots per stage and window, and a snapshot at a real OOM.

Marked ``gpu`` (``make test-gpu``); without CUDA each test is skipped with the reason. The
snapshots read back here are files this test's own run wrote, so plain ``pickle.load`` is safe.
Assertions are about what the files hold, never about time.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
from instrument.analyze import analyze  # noqa: E402
from instrument.naming import parse_trace_name  # noqa: E402
from instrument.run._state import STATE  # noqa: E402

_NO_CUDA = (
    f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
    f"built for CUDA {torch.version.cuda or 'none: a CPU build'})"
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=_NO_CUDA)]


@pytest.fixture(autouse=True)
def _history_off() -> Any:
    yield
    STATE.on_oom = None
    torch.cuda.memory._record_memory_history(enabled=None)


def _load(path: Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        return pickle.load(handle)  # type: ignore[no-any-return]  # written by this test's run


def _allocations(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]


def _allocate_in_this_file() -> torch.Tensor:
    return torch.empty(3 << 20, dtype=torch.uint8, device="cuda")


def test_each_profiled_stage_saves_its_own_allocation_history(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), tool="torch_memory", steps=(2,), memory={"stack_depth": 8})
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    kept = []

    @ins.profiled_stage("update_actor")
    def update() -> None:
        kept.append(_allocate_in_this_file())

    for step in (1, 2, 3):
        with ins.profile_step(step):
            update()
    ins.finish()
    (snap,) = tmp_path.glob("*.pickle")
    name = parse_trace_name(snap.name)
    assert name is not None and (name.stage, name.step) == ("update-actor", 2)
    allocs = _allocations(_load(snap))
    assert len(allocs) == 1  # only its own stage: history cleared at the start, off after
    assert allocs[0]["size"] >= 3 << 20
    assert 0 < len(allocs[0]["frames"]) <= 8
    assert any(f["filename"].endswith("test_memory_gpu.py") for f in allocs[0]["frames"])
    report = analyze(tmp_path)
    (listed,) = report.memory
    assert listed.peak_allocated is not None and listed.peak_allocated >= 3 << 20


def test_a_scheduled_stage_saves_each_window(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path), tool="torch+torch_memory", steps=(1,), schedule=ins.Schedule(active=1, repeat=3)
    )
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    kept = []

    @ins.profiled_stage("update_actor", scheduled=True)
    def update() -> None:
        for i in range(3):
            with ins.profile_window(mini_batch=i):
                kept.append(_allocate_in_this_file())

    with ins.profile_step(1):
        update()
    ins.finish()
    snaps = sorted(tmp_path.glob("*.pickle"), key=lambda p: parse_trace_name(p.name).window)  # type: ignore[arg-type,return-value,union-attr]
    assert [parse_trace_name(p.name).window for p in snaps] == [(0, 0), (1, 1), (2, 2)]  # type: ignore[union-attr]
    assert all(len(_allocations(_load(p))) >= 1 for p in snaps)
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 3


def test_a_real_oom_leaves_a_snapshot_and_propagates_unchanged(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), tool="none", memory={"on_oom": True})
    ins.configure(cfg, role="actor", rank=0, world_size=1)

    @ins.profiled_stage("update_actor")
    def update() -> torch.Tensor:
        return torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: no GPU has it

    with pytest.raises(torch.OutOfMemoryError) as caught:
        update()
    assert caught.value.__context__ is None
    ins.finish()
    (snap,) = tmp_path.glob("*.pickle")
    assert parse_trace_name(snap.name).stage == "oom-update-actor"  # type: ignore[union-attr]
    actions = {e["action"] for trace in _load(snap)["device_traces"] for e in trace}
    assert "oom" in actions  # the history was recorded since configure()
    assert analyze(tmp_path).memory[0].kind == "oom snapshot"
