"""A real local Ray cluster: worker groups driven by ProfileController, exactly-once finish hook."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import instrument as ins  # noqa: E402
from instrument.analyze import analyze  # noqa: E402
from instrument.analyze.traces._timelines import align, find_timelines  # noqa: E402
from instrument.integrations.ray import CONTROLLER_ROLE, ProfileController, ProfiledWorker, nsight_runtime_env  # noqa: E402
from instrument.naming import parse_trace_name  # noqa: E402
from instrument.run._clock import HOST_ENV  # noqa: E402
from tests.conftest import without_timeline  # noqa: E402

pytestmark = pytest.mark.slow

HANG_GUARD_S = 300.0  # waits on workers give up after this: a hang guard, never a speed check


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
    )
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class ActorWorker(ProfiledWorker):
    """A verl-like actor worker: configures itself with its place in the group."""

    def __init__(
        self, cfg: ins.ProfilerConfig, rank: int, world_size: int, role: str = "actor", host: str | None = None
    ) -> None:
        import torch

        if host is not None:  # a stand-in for a second host (one machine has one clock)
            os.environ[HOST_ENV] = host
        self.torch = torch
        self.starts = 0
        ins.configure(cfg, role=role, rank=rank, world_size=world_size)

    def start_profile(self, step: int) -> bool:
        self.starts += 1
        return super().start_profile(step)

    def start_count(self) -> int:
        return self.starts

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, n: int, fail_at: int = -1, die_at: int = -1) -> int:
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                self.torch.randn(16, 16) @ self.torch.randn(16, 16)
                if i == fail_at:
                    raise RuntimeError("user code failed")
                if i == die_at:
                    os._exit(1)
        return n


def _hook(tmp_path: Path, ranks: tuple[int, ...]) -> ins.FinishHook:
    marker = f"{tmp_path}/hook-rank$INSTRUMENT_PROFILE_RANK"
    return ins.FinishHook(cmd=f'echo "$INSTRUMENT_PROFILE_PID" >> "{marker}"', ranks=ranks, timeout_s=30)


@pytest.mark.parametrize("timeline", [True, False], ids=["timeline", "no-timeline"])
def test_worker_group_profiles_chosen_steps_and_ranks_and_finishes_once(
    ray_cluster: None, tmp_path: Path, timeline: bool
) -> None:
    save = tmp_path / "profile"
    cfg = ins.ProfilerConfig(
        save_path=str(save),
        contents=("cpu",),
        steps=(1, 3),
        ranks=(0, 2),
        schedule=ins.Schedule(active=2),
        finish_hook=_hook(tmp_path, (0, 3)),
        timeline=timeline,
    )
    actors = [ActorWorker.remote(cfg, rank, 4) for rank in range(4)]  # type: ignore[attr-defined]
    ctl = ProfileController(cfg, groups={"actor_rollout_ref": actors, "ref": actors})  # colocated: driven once
    assert len(ctl.workers) == 4
    started = time.monotonic()
    for step in (1, 2, 3):
        with ctl.step(step, last=(step == 3)):
            assert ray.get([a.update_actor.remote(3) for a in actors]) == [3] * 4
    files = ctl.finish()
    assert ctl.finish() == files  # idempotent
    elapsed = time.monotonic() - started
    assert ctl.failures == []
    # The step timeline needs every step's boundaries on the workers; without it only profiled steps are driven.
    assert ray.get([a.start_count.remote() for a in actors]) == ([3, 3, 3, 3] if timeline else [2, 2, 2, 2])
    # One step timeline per worker, and the controller's own.
    assert len(files) - len(without_timeline(files)) == (5 if timeline else 0)
    files = without_timeline(files)
    names = [parse_trace_name(f) for f in files]
    assert sorted((n.step, n.rank, n.window) for n in names if n) == [
        (1, 0, (0, 1)),
        (1, 2, (0, 1)),
        (3, 0, (0, 1)),
        (3, 2, (0, 1)),
    ]
    assert sorted(p.name for p in save.glob("*.pt.trace.json.gz")) == sorted(Path(f).name for f in files)
    assert len({Path(f).name for f in files}) == len(files)
    markers = sorted(p.name for p in tmp_path.glob("hook-rank*"))
    assert markers == ["hook-rank0", "hook-rank3"]
    for marker in markers:
        assert len((tmp_path / marker).read_text().split()) == 1  # once each
    print(f"ray: 4 workers x 3 steps in {elapsed:.1f} s")


def test_a_failing_and_a_dying_worker_leave_the_others_intact(ray_cluster: None, tmp_path: Path) -> None:
    save = tmp_path / "profile"
    cfg = ins.ProfilerConfig(
        save_path=str(save),
        contents=("cpu",),
        steps=(1,),
        all_ranks=True,
        schedule=ins.Schedule(active=4),
        finish_hook=_hook(tmp_path, (0,)),
    )
    actors = [ActorWorker.remote(cfg, rank, 3) for rank in range(3)]  # type: ignore[attr-defined]
    # Up before they are driven: on a loaded machine starting three workers can outlast any control
    # timeout (a hang guard only; the test is about who failed and how).
    assert ray.get([a.start_count.remote() for a in actors], timeout=HANG_GUARD_S) == [0, 0, 0]
    ctl = ProfileController(cfg, groups={"actor": actors}, timeout_s=HANG_GUARD_S)
    with ctl.step(1, last=True):
        refs = [
            actors[0].update_actor.remote(3),
            actors[1].update_actor.remote(3, fail_at=1),  # the user's exception, mid-window
            actors[2].update_actor.remote(3, die_at=1),  # the process dies mid-window
        ]
        outcomes = []
        for ref in refs:
            try:
                outcomes.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                outcomes.append(type(exc).__name__)
    files = without_timeline(ctl.finish())
    assert outcomes[0] == 3
    assert outcomes[1] == "RayTaskError(RuntimeError)"
    assert "ActorDiedError" in outcomes[2] or "RayActorError" in outcomes[2]
    assert [(f.group, f.index, f.call) for f in ctl.failures] == [("actor", 2, "stop_profile")]
    # The controller learnt of the death from Ray, not by waiting out its control timeout.
    assert "GetTimeoutError" not in ctl.failures[0].error, ctl.failures[0].error
    names = sorted((n.rank, n.window, n.partial) for n in map(parse_trace_name, files) if n)
    assert names == [(0, (0, 2), True), (1, (0, 1), True)]
    assert (tmp_path / "hook-rank0").is_file()


def test_the_hook_runs_in_the_finish_group_after_every_worker_saved(ray_cluster: None, tmp_path: Path) -> None:
    save = tmp_path / "profile"
    listing = f"{tmp_path}/hook-$INSTRUMENT_PROFILE_ROLE-rank$INSTRUMENT_PROFILE_RANK"
    cfg = ins.ProfilerConfig(
        save_path=str(save),
        contents=("cpu",),
        steps=(1,),
        all_ranks=True,
        finish_hook=ins.FinishHook(cmd=f'ls "$INSTRUMENT_PROFILE_SAVE_PATH" > "{listing}"', ranks=(0,)),
    )
    actors = [ActorWorker.remote(cfg, rank, 2) for rank in range(2)]  # type: ignore[attr-defined]
    critics = [ActorWorker.remote(cfg, rank, 2, role="critic") for rank in range(2)]  # type: ignore[attr-defined]  # ranks 0..1 again
    ctl = ProfileController(cfg, groups={"actor": actors, "critic": critics})
    with ctl.step(1):  # steps=(1,): the last configured step ends the run's profiling
        ray.get([w.update_actor.remote(200) for w in [*actors, *critics]])  # big traces: exports take a while
    files = without_timeline(ctl.finish())
    assert sorted(p.name for p in tmp_path.glob("hook-*")) == ["hook-actor-rank0"]  # not the critic's rank 0
    listed = [p for p in (tmp_path / "hook-actor-rank0").read_text().split() if p.endswith(".gz")]
    assert sorted(listed) == sorted(Path(f).name for f in files)
    assert len(files) == 4
    with pytest.raises(ValueError, match="'finish_groups' must name groups among"):
        ProfileController(cfg, groups={"actor": actors}, finish_groups=["critic"])


def test_nsight_runtime_env() -> None:
    continuous = ins.ProfilerConfig(steps=(1, 3), discrete=False)
    assert nsight_runtime_env(continuous)["nsight"]["capture-range-end"] == "repeat-shutdown:2"
    env = ProfileController.nsight_runtime_env(ins.ProfilerConfig(steps=(1, 3)))
    assert env["nsight"]["capture-range"] == "cudaProfilerApi"
    assert env["nsight"]["capture-range-end"] == "stop"
    assert (
        nsight_runtime_env(ins.ProfilerConfig(), capture_ranges=6)["nsight"]["capture-range-end"] == "repeat-shutdown:6"
    )
    with pytest.raises(ValueError, match="'capture_ranges' must be >= 1: 0"):
        nsight_runtime_env(ins.ProfilerConfig(), capture_ranges=0)


def test_controller_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="'groups' must name at least one worker group"):
        ProfileController(ins.ProfilerConfig(), groups={})
    with pytest.raises(TypeError, match="'config' must be a ProfilerConfig"):
        ProfileController({}, groups={"a": []})  # type: ignore[arg-type]


@ray.remote(num_cpus=0)
class SleepyWorker(ProfiledWorker):
    """A worker whose stage takes as long as it is told: known durations, not a race with the clock."""

    def __init__(self, cfg: ins.ProfilerConfig, rank: int, world_size: int) -> None:
        ins.configure(cfg, role="actor", rank=rank, world_size=world_size)

    @ins.profiled_stage("generate_sequences")
    def generate(self, seconds: float) -> None:
        time.sleep(seconds)


def test_a_slow_step_trigger_fires_on_a_ray_worker(ray_cluster: None, tmp_path: Path) -> None:
    """The controller drives every step when triggers are on, so a worker sees its own slow step."""
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path), contents=("cpu",), steps=(100,), trigger=ins.SlowStep(factor=2.0, window=2, steps=1)
    )
    worker = SleepyWorker.remote(cfg, 0, 1)  # type: ignore[attr-defined]
    ctl = ProfileController(cfg, groups={"actor_rollout_ref": [worker]})
    durations = {1: 0.0, 2: 0.0, 3: 3.0, 4: 0.0}  # step 3 is far slower than the median of steps 1-2
    for step, seconds in durations.items():
        with ctl.step(step, last=(step == 4)):
            ray.get(worker.generate.remote(seconds))
    ctl.finish()
    assert ctl.failures == []
    names = [parse_trace_name(p.name) for p in tmp_path.glob("*.pt.trace.json.gz")]
    assert [(n.step, n.triggered) for n in names if n is not None] == [(4, True)]


GENEROUS_NS = 2_000_000_000  # an uncertainty beyond 2 s would be no estimate worth having


def test_a_worker_on_another_host_gets_its_clock_and_the_controller_records_its_steps(
    ray_cluster: None, tmp_path: Path
) -> None:
    save = tmp_path / "profile"
    cfg = ins.ProfilerConfig(save_path=str(save), tool="none")
    actors = [ActorWorker.remote(cfg, rank, 3, host="pretend-host-b" if rank == 2 else None) for rank in range(3)]  # type: ignore[attr-defined]
    ctl = ProfileController(cfg, groups={"actor": actors})
    for step in (1, 2):
        with ctl.step(step):
            ray.get([a.update_actor.remote(2) for a in actors], timeout=HANG_GUARD_S)
    ctl.finish()
    assert ctl.failures == [] and ctl.clock_failures == 0

    timelines, skipped = find_timelines(save)
    assert skipped == []
    by_place = {(t.role, t.rank): t for t in timelines}
    assert sorted(by_place) == [("actor", 0), ("actor", 1), ("actor", 2), (CONTROLLER_ROLE, 0)]
    controller = by_place[(CONTROLLER_ROLE, 0)]
    assert [(s.kind, s.step) for s in controller.spans] == [("step", 1), ("step", 2)]
    for rank in (1, 2):  # the controller's step holds the workers' steps (one clock here: no uncertainty)
        worker = {s.step: s for s in by_place[("actor", rank)].spans if s.kind == "step"}
        assert all(c.start_ns <= worker[c.step].start_ns <= worker[c.step].end_ns <= c.end_ns for c in controller.spans)
    pretend = by_place[("actor", 2)]
    assert pretend.host == "pretend-host-b"
    assert len(pretend.clocks) == 2  # at the first step and at the finish
    estimate = pretend.clock
    assert estimate is not None and "Ray controller" in estimate.source
    # One clock in truth: zero within the estimate's own uncertainty.
    assert abs(estimate.offset_ns) <= estimate.uncertainty_ns < GENEROUS_NS, estimate
    for place in (("actor", 0), ("actor", 1), (CONTROLLER_ROLE, 0)):  # the reference's host
        assert {(c.offset_ns, c.uncertainty_ns) for c in by_place[place].clocks} == {(0, 0)}, place
    print(f"ray: the pretend host's clock {estimate.offset_ns / 1e6:+.3f} ms +- {estimate.uncertainty_ns / 1e6:.3f} ms")

    clock = analyze(save, jobs=1).to_dict()["timeline"]["clock"]
    assert clock["aligned"] is True
    assert clock["max_uncertainty_ms"] == pytest.approx(estimate.uncertainty_ns / 1e6, abs=1e-3)
    assert align([replace(t, clocks=()) for t in timelines]).aligned is False  # without it: unaligned


def test_a_driver_that_configured_itself_keeps_one_timeline_and_gets_the_clock(
    ray_cluster: None, tmp_path: Path
) -> None:
    save = tmp_path / "profile"
    cfg = ins.ProfilerConfig(save_path=str(save), tool="none")
    ins.configure(cfg, role="trainer", rank=0, world_size=1)  # the driver's own run: no second timeline
    actors = [ActorWorker.remote(cfg, rank, 2) for rank in range(2)]  # type: ignore[attr-defined]
    ctl = ProfileController(cfg, groups={"actor": actors})
    for step in (1, 2):
        with ins.profile_step(step), ctl.step(step):
            ray.get([a.update_actor.remote(1) for a in actors], timeout=HANG_GUARD_S)
    ctl.finish()
    ins.finish()
    assert ctl.manifest_path is None and ctl.clock_failures == 0
    timelines, _ = find_timelines(save)
    assert sorted((t.role, t.rank) for t in timelines) == [("actor", 0), ("actor", 1), ("trainer", 0)]
    driver = next(t for t in timelines if t.role == "trainer")
    assert [(s.kind, s.step) for s in driver.spans] == [("step", 1), ("step", 2)]
    assert {(c.offset_ns, c.uncertainty_ns) for c in driver.clocks} == {(0, 0)}  # the reference's host
