"""The recorder seam: the registry, the session's calls as ``instrument.testing.capture`` sees them, a new recorder.

These run without torch: the session's decisions are checked through what it asks a recorder to do.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
import instrument.testing
from instrument import _tools
from instrument.recorders import (
    Publish,
    Report,
    TraceSpec,
    register_recorder,
)
from instrument.testing import RecorderCall as Call
from tests.conftest import without_timeline


def _update(n: int) -> None:
    with ins.profiled_stage("update_actor", scheduled=True):
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                pass


def test_capture_sees_what_the_session_asks_of_its_recorder(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(2,), schedule=ins.Schedule(active=2))
    with instrument.testing.capture() as calls:
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        for step in (1, 2):
            with ins.profile_step(step), ins.profiled_stage("compute_log_prob"):
                _update(3)
    assert calls == [
        Call("step", role="actor", step=2),
        Call("start", "compute_log_prob"),
        Call("range", "compute_log_prob"),
        Call("range", "update_actor"),  # nested: a range in the open trace
        *[c for i in range(3) for c in (Call("range", f"mini_batch{i}"), Call("close_range", f"mini_batch{i}"))],
        Call("close_range", "update_actor"),
        Call("close_range", "compute_log_prob"),
        Call("stop", "compute_log_prob"),
    ]
    start = calls[1].spec  # the whole spec of a start, outside ==
    assert start is not None and (start.role, start.step, start.rank, start.triggered) == ("actor", 2, 0, False)


def test_a_scheduled_stage_advances_its_own_schedule(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,), schedule=ins.Schedule(active=2))
    with instrument.testing.capture() as calls:
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            _update(4)
    assert calls[1] == Call("start", "update_actor", schedule=ins.Schedule(active=2))
    assert calls.count(Call("window_step")) == 4
    assert calls[-1] == Call("stop", "update_actor")


def test_unprofiled_steps_and_ranks_ask_nothing(tmp_path: Path) -> None:
    with instrument.testing.capture() as calls:
        ins.configure(
            ins.ProfilerConfig(save_path=str(tmp_path), steps=(5,), ranks=(1,)), role="a", rank=0, world_size=2
        )
        for step in range(1, 7):
            with ins.profile_step(step):
                _update(2)
    assert calls == []


def test_threads_share_one_trace_and_it_stops_when_the_last_leaves(tmp_path: Path) -> None:
    entered, release = threading.Barrier(3), threading.Event()

    @ins.profiled_stage("generate_sequences")
    def generate() -> None:
        entered.wait(30)
        release.wait(30)

    with instrument.testing.capture() as calls:
        ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,)), role="rollout", rank=0, world_size=1)
        with ins.profile_step(1):
            threads = [threading.Thread(target=generate) for _ in range(2)]
            for t in threads:
                t.start()
            entered.wait(30)  # both inside: one owns the trace, the other is a range in it
            release.set()
            for t in threads:
                t.join()
    assert [c for c in calls if c.kind in ("start", "stop")] == [
        Call("start", "generate_sequences"),
        Call("stop", "generate_sequences"),
    ]
    assert calls[-1] == Call("stop", "generate_sequences")  # after both ranges closed
    assert calls.count(Call("close_range", "generate_sequences")) == 2


def test_async_tasks_have_their_own_stage_stacks(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,), schedule=ins.Schedule(active=2))

    @ins.profiled_stage("update_actor", scheduled=True)
    async def update() -> None:
        for i in range(2):
            with ins.profile_window(mini_batch=i):
                await asyncio.sleep(0)

    @ins.profiled_stage("compute_values")
    async def values() -> None:
        for i in range(2):
            with ins.profile_window(mini_batch=i):  # a forward-only stage: its windows never step a schedule
                await asyncio.sleep(0)

    async def both() -> None:
        await asyncio.gather(update(), values())

    with instrument.testing.capture() as calls:
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            asyncio.run(both())
    assert calls.count(Call("window_step")) == 2  # only update_actor's own windows


def test_capture_alongside_keeps_the_configured_recorder(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with instrument.testing.capture(alongside=True) as calls:
        ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,)), role="a", rank=0)
        with ins.profile_step(1), ins.profiled_stage("compute_log_prob"):
            pass
        files = without_timeline(ins.finish())
    assert Call("start", "compute_log_prob") in calls
    assert len(files) == 1 and files[0].endswith(".pt.trace.json.gz")


@pytest.mark.parametrize(
    ("tool", "target", "error"),
    [("none", "m:C", ValueError), ("a-b", "m:C", ValueError), ("x", "no_colon", ValueError), ("x", 3, TypeError)],
)
def test_register_recorder_checks_its_arguments(
    tool: str, target: Any, error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tools, "_REGISTRY", dict(_tools._REGISTRY))
    with pytest.raises(error):
        register_recorder(tool, target)


def test_configure_returns_a_read_only_description(tmp_path: Path) -> None:
    run = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(2,)), role="critic", rank=1, world_size=4)
    assert isinstance(run, ins.RunInfo) and ins.current_run() is not None
    assert (run.role, run.rank, run.world_size, run.tool) == ("critic", 1, 4, "torch")
    assert run.profiles(2) is False  # rank 1 is not selected (ranks default to (0,))
    with pytest.raises(AttributeError):
        run.rank = 0  # type: ignore[misc]
    assert "Session" not in ins.__all__


class _Probe(instrument.testing.RecordingRecorder):
    """Records into a shared list, under its own tool name, with the options it was built with."""

    events: list[str]

    def __init__(self, publish: Publish, report: Report, options: object = None) -> None:
        super().__init__(publish, report, [])
        self.events.append(f"built {self.tool} with {options}")

    def start(self, spec: TraceSpec) -> None:
        super().start(spec)
        self.events.append(f"start {self.tool}")

    def stop(self) -> None:
        if self.tracing:
            self.events.append(f"stop {self.tool}")
        super().stop()


@pytest.mark.parametrize("tool", ["tracer+snapshots", "snapshots+tracer"])
def test_an_outermost_recorder_wraps_the_others_and_gets_its_options(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tools, "_REGISTRY", dict(_tools._REGISTRY))
    events: list[str] = []
    tracer = type("Tracer", (_Probe,), {"tool": "tracer", "events": events})
    snapshots = type("Snapshots", (_Probe,), {"tool": "snapshots", "events": events})
    register_recorder("tracer", tracer)
    register_recorder("snapshots", snapshots, options="memory", outermost=True)  # as torch_memory is
    memory = ins.MemorySnapshots(max_entries=7)
    ins.configure(ins.ProfilerConfig(tool=tool, save_path=str(tmp_path), steps=(1,), memory=memory), role="a", rank=0)
    with ins.profile_step(1), ins.profiled_stage("update_actor"):
        pass
    assert events == [
        f"built snapshots with {memory}",  # ProfilerConfig.memory, the field its registration names
        "built tracer with None",
        "start snapshots",
        "start tracer",
        "stop tracer",
        "stop snapshots",
    ]
