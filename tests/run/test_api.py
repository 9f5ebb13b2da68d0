"""The public entry points: decorator forms, the disabled path, configure's checks, rank detection."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import instrument as ins
from instrument.naming import TIMELINE_SUFFIX
from instrument.run._process import detect_rank_and_world
from instrument.run._state import STATE
from tests.conftest import event_names, load_trace, without_timeline


@ins.profiled_stage("module_level")
def module_level(x: int, *, scale: int = 2) -> int:
    """Doubles x."""
    return x * scale


class Worker:
    """Every kind of callable a worker class holds."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @ins.profiled_stage("method")
    def method(self, x: int) -> int:
        self.calls.append("method")
        return x + 1

    @ins.profiled_stage("static")
    @staticmethod
    def static(x: int) -> int:
        return x + 2

    @staticmethod
    @ins.profiled_stage("static_inner")
    def static_inner(x: int) -> int:
        return x + 3

    @ins.profiled_stage("class")
    @classmethod
    def klass(cls, x: int) -> str:
        return f"{cls.__name__}{x}"

    @ins.profiled_stage("generate", scheduled=False)
    async def generate(self, n: int) -> int:
        await asyncio.sleep(0.01)
        return n


def test_decorated_callables_keep_behaviour_name_doc_and_signature() -> None:
    assert module_level(3) == 6
    assert module_level.__name__ == "module_level"
    assert module_level.__doc__ == "Doubles x."
    assert str(inspect.signature(module_level)) == "(x: 'int', *, scale: 'int' = 2) -> 'int'"
    worker = Worker()
    assert worker.method(1) == 2
    assert Worker.static(1) == 3
    assert worker.static(1) == 3
    assert Worker.static_inner(1) == 4
    assert Worker.klass(1) == "Worker1"
    assert worker.klass(2) == "Worker2"
    assert inspect.iscoroutinefunction(Worker.generate)
    assert asyncio.run(worker.generate(5)) == 5


def test_decorated_functions_and_workers_survive_pickle() -> None:
    assert pickle.loads(pickle.dumps(module_level))(4) == 8
    worker = pickle.loads(pickle.dumps(Worker()))
    assert worker.method(1) == 2
    assert pickle.loads(pickle.dumps(Worker.method))(worker, 2) == 3
    stage = pickle.loads(pickle.dumps(ins.profiled_stage("gen", scheduled=True)))
    assert (stage.name, stage.scheduled) == ("gen", True)
    assert pickle.loads(pickle.dumps(STATE)) is STATE  # by-value pickles of closures reach the live state


def test_a_worker_class_pickled_by_value_records_in_the_receiving_process(tmp_path: Path) -> None:
    cloudpickle = pytest.importorskip("cloudpickle")  # what Ray uses for classes it cannot import

    class Local:  # defined in a function: not importable, so pickled by value, closures included
        @ins.profiled_stage("local_stage")
        def run(self) -> int:
            return 1

    payload = tmp_path / "worker.pkl"
    payload.write_bytes(cloudpickle.dumps(Local))
    script = (
        "import pickle, sys, instrument as ins\n"
        f"Local = pickle.loads(open({str(payload)!r}, 'rb').read())\n"
        f"ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=('cpu',), steps=(1,)),"
        " role='actor', rank=0, world_size=1)\n"
        "with ins.profile_step(1):\n"
        "    Local().run()\n"
        "print(ins.finish())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "local-stage" in done.stdout


def test_bare_decorator_shows_the_right_spelling() -> None:
    with pytest.raises(TypeError, match=r'write @profiled_stage\("update_actor"\), not @profiled_stage'):

        @ins.profiled_stage  # type: ignore[arg-type]
        def update() -> None: ...


@pytest.mark.parametrize("name", ["", "   ", "...", 3])
def test_bad_stage_names_fail_at_decoration(name: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        ins.profiled_stage(name)  # type: ignore[arg-type]


def test_scheduled_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="'scheduled' must be true or false: 1"):
        ins.profiled_stage("x", scheduled=1)  # type: ignore[arg-type]


def test_everything_is_a_no_op_before_configure_and_after_finish(tmp_path: Path) -> None:
    assert ins.finish() == []
    with ins.profile_step(1, last=True), ins.profiled_stage("x"), ins.profile_window(mini_batch=0):
        assert module_level(1) == 2
    assert not STATE.recording
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",)), role="actor", world_size=1, rank=0)
    assert ins.finish() == ins.finish() == []  # idempotent; nothing profiled
    with ins.profile_step(1):
        assert not STATE.recording  # a finished run profiles nothing more


def test_configure_checks_ranks_and_role(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), ranks=(0, 9))
    with pytest.raises(ValueError, match=r"'ranks' selects rank 9, outside the world of 8 ranks"):
        ins.configure(cfg, role="actor", rank=0, world_size=8)
    with pytest.raises(ValueError, match=r"'rank' selects rank 4, outside the world of 4 ranks"):
        ins.configure(ins.ProfilerConfig(), role="actor", rank=4, world_size=4)
    hook = ins.ProfilerConfig(finish_hook=ins.FinishHook("true", ranks=(5,)))
    with pytest.raises(ValueError, match=r"'finish_hook.ranks' selects rank 5"):
        ins.configure(hook, role="actor", rank=0, world_size=2)
    with pytest.raises(ValueError, match="'role' must be a non-empty string"):
        ins.configure(ins.ProfilerConfig(), role="", rank=0, world_size=1)
    with pytest.raises(TypeError, match="'config' must be a ProfilerConfig"):
        ins.configure({"steps": [1]}, role="actor")  # type: ignore[arg-type]


def test_profile_step_checks_its_step() -> None:
    with pytest.raises(TypeError, match="'step' must be an int"):
        ins.profile_step(1.0)  # type: ignore[arg-type]
    ins.profile_step(-1)  # a number below 1 is named once when the step opens (tests/run/test_misuse.py)


def test_configure_again_after_finish_starts_a_new_run(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,))
    for _ in range(2):
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            module_level(1)
        assert len(without_timeline(ins.finish())) == 1
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 2


def test_async_stage_range_covers_the_awaited_work(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), discrete=False)
    ins.configure(cfg, role="rollout", rank=0, world_size=1)
    worker = Worker()

    async def both() -> list[int]:
        return list(await asyncio.gather(worker.generate(1), worker.generate(2)))

    with ins.profile_step(1):
        coroutine = worker.generate(3)  # created, not awaited: no range yet
        assert asyncio.run(both()) == [1, 2]
        assert asyncio.run(coroutine) == 3
    (trace,) = without_timeline(ins.finish())
    ranges = [e for e in load_trace(trace)["traceEvents"] if e.get("name") == "generate"]
    assert len(ranges) == 3
    assert all(e["dur"] >= 9_000 for e in ranges), json.dumps(ranges)  # µs: covers the 10 ms sleep


def test_with_and_decorator_forms_record_the_same_ranges(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), discrete=False)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    with ins.profile_step(1):
        with ins.profiled_stage("gen"), ins.profile_window(mini_batch=7):
            pass
        Worker().method(1)
        Worker.static(1)
    (trace,) = without_timeline(ins.finish())
    assert {"gen", "mini_batch7", "method", "static"} <= event_names(trace)


def test_forward_only_stage_never_advances_the_schedule(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), schedule=ins.Schedule(active=2))

    @ins.profiled_stage("compute_values")
    def forward(n: int) -> None:
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                pass

    ins.configure(cfg, role="critic", rank=0, world_size=1)
    with ins.profile_step(1):
        forward(5)
    (trace,) = without_timeline(ins.finish())
    assert "_mb" not in Path(trace).name  # the whole stage, one trace, ranges only
    assert {f"mini_batch{i}" for i in range(5)} <= event_names(trace)


def test_rank_detection_from_torchrun_environment() -> None:
    code = "from instrument.run._process import detect_rank_and_world as d; print(d())"
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "8"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(3, 8, 'RANK/WORLD_SIZE')"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(0, 1, 'default')"


def test_rank_detection_from_torch_distributed(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert detect_rank_and_world() == (0, 1, "torch.distributed")
    finally:
        dist.destroy_process_group()


def test_disabled_path_leaves_no_state_behind(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(2,), ranks=(1,), timeline=False)
    ins.configure(cfg, role="actor", rank=0, world_size=2)
    with ins.profile_step(2, last=True):
        assert not STATE.recording
        assert module_level(2) == 4
        assert ins.profile_window(mini_batch=0) is ins.profile_window(mini_batch=1)  # the shared idle manager
    assert ins.finish() == []
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_an_unprofiled_rank_writes_its_step_timeline_alone_by_default(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(2,), ranks=(1,))
    run = ins.configure(cfg, role="actor", rank=0, world_size=2)
    with ins.profile_step(2, last=True):
        assert not STATE.recording
        assert module_level(2) == 4
        with ins.profile_window(mini_batch=0):
            pass
    (timeline,) = ins.finish()
    assert timeline.endswith(TIMELINE_SUFFIX)
    assert {p.name for p in tmp_path.iterdir()} == {Path(timeline).name, run.manifest_path.name}


def test_a_stage_may_carry_another_role_than_its_process(tmp_path: Path) -> None:
    """A fused single-process trainer keeps verl's roles apart: the critic's stages are the critic's."""
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,)), role="actor", rank=0)

    @ins.profiled_stage("update_critic", role="critic")
    def update_critic() -> None:
        pass

    with ins.profile_step(1):
        update_critic()
        with ins.profiled_stage("compute_values", role="critic"):
            pass
        with ins.profiled_stage("update_actor"):
            pass
    names = sorted(Path(p).name.split("_step")[0] for p in without_timeline(ins.finish()))
    assert names == ["actor_update-actor", "critic_compute-values", "critic_update-critic"]
    assert repr(ins.profiled_stage("x", role="critic")) == "profiled_stage('x', scheduled=False, role='critic')"
    with pytest.raises(ValueError, match="'role' must not contain"):
        ins.profiled_stage("x", role='a"b')
