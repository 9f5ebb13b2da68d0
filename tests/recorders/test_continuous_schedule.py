"""Continuous mode with a schedule, as verl 0.9.1 (a configuration in verl's keys): real torch.profiler traces.

verl runs one profiler per process from the step's start to its stop and advances it once per update
mini-batch: the step's trace keeps the scheduled windows (here named ``_mb{a}-{b}``) and drops what lies
outside them, the log-prob and rollout stages before a later window included; a stop inside a window saves
it as partial, a stop during warmup saves nothing. instrument's own keys keep the whole step.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import instrument as ins
import instrument.testing
from instrument.config import ProfilerConfig
from instrument.naming import parse_trace_name
from instrument.plan import plan_run
from instrument.testing import RecorderCall
from tests.conftest import load_trace, without_timeline

ACTOR = "actor_rollout_ref.actor.profiler"


def _verl(save: Path, **schedule: int) -> ProfilerConfig:
    """The actor's view of verl keys: continuous (verl's default), CPU only, steps 1-2, ``schedule`` as given."""
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        f"global_profiler.save_path={save}",
        f"{ACTOR}.enable=True",
        f"{ACTOR}.tool_config.torch.contents=[cpu]",
        *(f"{ACTOR}.tool_config.torch.schedule.{name}={value}" for name, value in schedule.items()),
    ]
    cfg = ProfilerConfig.from_overrides(overrides, role="actor")
    assert (cfg.dialect, cfg.discrete) == ("verl", False)
    return cfg


def _work() -> None:
    torch.ones(8).sum()


@ins.profiled_stage("generate_sequences")
def generate() -> None:
    _work()


@ins.profiled_stage("compute_log_prob")
def log_prob(windows: int = 0) -> None:
    for i in range(windows):  # a forward-only stage's windows never advance the schedule
        with ins.profile_window(mini_batch=100 + i):
            _work()


@ins.profiled_stage("update_actor", scheduled=True)
def update(mini_batches: int, first: int = 0) -> None:
    for i in range(first, first + mini_batches):
        with ins.profile_window(mini_batch=i):
            _work()


@ins.profiled_stage("after_update")
def after() -> None:
    _work()


def _step(
    cfg: ProfilerConfig, body: Any, steps: int = 1
) -> dict[tuple[int, tuple[int, int] | None, bool], Counter[str]]:
    """Run ``body`` in each step; every trace by (step, window, partial) -> its user annotations, counted."""
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in range(1, steps + 1):
        with ins.profile_step(step):
            body()
    out = {}
    for path in without_timeline(ins.finish()):
        name = parse_trace_name(Path(path).name)
        assert name is not None and name.stage == "continuous", path
        events = load_trace(path)["traceEvents"]
        assert not any(str(e.get("name")).startswith("ProfilerStep#") for e in events)
        out[(name.step, name.window, name.partial)] = Counter(
            str(e["name"]) for e in events if e.get("cat") == "user_annotation"
        )
    return out


def _rollout_and_update(mini_batches: int) -> Any:
    def body() -> None:
        generate()
        log_prob()
        update(mini_batches)
        after()

    return body


def test_a_window_from_the_start_keeps_the_earlier_stages_and_drops_the_rest(tmp_path: Path) -> None:
    traces = _step(_verl(tmp_path, active=2), _rollout_and_update(4))
    # skip_first/wait/warmup 0: log-prob and rollout kept in full, then the first active mini-batches; the update
    # stage's range as verl keeps it, cut where the window ends
    assert traces == {
        (1, (0, 1), False): Counter(
            ["generate_sequences", "compute_log_prob", "update_actor", "mini_batch0", "mini_batch1"]
        )
    }


def test_a_later_window_drops_the_stages_before_it(tmp_path: Path) -> None:
    """The seed's caveat: skipping ahead also drops the log-prob and rollout stages before the window."""
    traces = _step(_verl(tmp_path, skip_first=1, warmup=1, active=2), _rollout_and_update(6))
    assert traces == {(1, (2, 3), False): Counter(["mini_batch2", "mini_batch3"])}


def test_repeat_saves_each_window_of_the_step(tmp_path: Path) -> None:
    traces = _step(_verl(tmp_path, wait=1, active=2, repeat=2), _rollout_and_update(7))
    assert traces == {
        (1, (1, 2), False): Counter(["mini_batch1", "mini_batch2"]),
        (1, (4, 5), False): Counter(["mini_batch4", "mini_batch5"]),
    }


def test_verls_repeat_0_keeps_one_window_per_step(tmp_path: Path) -> None:
    traces = _step(_verl(tmp_path, active=1, repeat=0), _rollout_and_update(3), steps=2)
    # repeat 0 is one window in verl's continuous mode, and the schedule starts again at every step
    assert set(traces) == {(1, (0, 0), False), (2, (0, 0), False)}


def test_a_step_that_ends_inside_its_window_saves_it_as_partial(tmp_path: Path) -> None:
    traces = _step(_verl(tmp_path, active=4), _rollout_and_update(2))
    # stop() turns the RECORD into RECORD_AND_SAVE: everything up to the step's end, the later stage too
    assert traces == {
        (1, (0, 1), True): Counter(
            ["generate_sequences", "compute_log_prob", "update_actor", "mini_batch0", "mini_batch1", "after_update"]
        )
    }


def test_a_step_that_ends_in_warmup_saves_nothing_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    traces = _step(_verl(tmp_path, warmup=3, active=2), _rollout_and_update(2), steps=2)
    assert traces == {}
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "recorded no window" in r.getMessage()]
    assert len(warned) == 1


def test_a_loop_ending_where_a_window_begins_writes_no_empty_window(tmp_path: Path) -> None:
    """verl would save the tail as a window holding no mini-batch; instrument writes windows that hold one."""
    traces = _step(_verl(tmp_path, active=2, repeat=2), _rollout_and_update(2))
    assert traces == {
        (1, (0, 1), False): Counter(
            ["generate_sequences", "compute_log_prob", "update_actor", "mini_batch0", "mini_batch1"]
        )
    }


def test_a_step_without_scheduled_stages_is_kept_whole_when_recording_from_the_start(tmp_path: Path) -> None:
    """A ref-like process (no update loop) with the schedule at RECORD: its whole step, as verl saves it."""
    assert _step(_verl(tmp_path, active=2), lambda: log_prob(2)) == {
        (1, None, False): Counter(["compute_log_prob", "mini_batch100", "mini_batch101"])
    }
    assert _step(_verl(tmp_path / "warm", warmup=1, active=2), lambda: log_prob(2)) == {}


def test_forward_only_windows_never_advance_the_schedule(tmp_path: Path) -> None:
    def body() -> None:
        log_prob(3)
        update(3)

    traces = _step(_verl(tmp_path, active=2), body)
    assert traces == {
        (1, (0, 1), False): Counter(
            [
                "compute_log_prob",
                "mini_batch100",
                "mini_batch101",
                "mini_batch102",
                "update_actor",
                "mini_batch0",
                "mini_batch1",
            ]
        )
    }


def test_every_scheduled_stage_of_the_step_advances_one_schedule(tmp_path: Path) -> None:
    """One profiler per process, as verl: a stage called twice, or a second update stage, counts on."""

    def body() -> None:
        update(1)
        update(1, first=1)  # a second call of the same stage in the step: counted, not a fast-path range
        update(2, first=2)

    traces = _step(_verl(tmp_path, skip_first=1, active=2), body)
    # the two calls that began inside the window keep their range (the first began while it was skipped)
    assert traces == {(1, (1, 2), False): Counter(["update_actor", "update_actor", "mini_batch1", "mini_batch2"])}


def test_instruments_own_keys_keep_the_whole_step(tmp_path: Path) -> None:
    cfg = ProfilerConfig(
        save_path=str(tmp_path), steps=(1,), discrete=False, contents=("cpu",), schedule=ins.Schedule(active=2)
    )
    traces = _step(cfg, _rollout_and_update(4))
    assert traces == {
        (1, None, False): Counter(
            ["generate_sequences", "compute_log_prob", "update_actor", "after_update"]
            + [f"mini_batch{i}" for i in range(4)]
        )
    }


def test_without_a_schedule_a_verl_step_is_whole(tmp_path: Path) -> None:
    traces = _step(_verl(tmp_path), _rollout_and_update(2))
    assert traces == {
        (1, None, False): Counter(
            ["generate_sequences", "compute_log_prob", "update_actor", "mini_batch0", "mini_batch1", "after_update"]
        )
    }


def test_the_recorder_is_given_the_schedule_and_one_step_per_scheduled_mini_batch(tmp_path: Path) -> None:
    cfg = _verl(tmp_path, warmup=1, active=2)
    with instrument.testing.capture() as calls:
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            log_prob(2)
            update(3)
    assert [c for c in calls if c.kind == "start"] == [RecorderCall("start", "continuous", schedule=cfg.schedule)]
    assert sum(c.kind == "window_step" for c in calls) == 3
    assert RecorderCall("range", "compute_log_prob") in calls


@pytest.mark.parametrize(
    ("schedule", "mini_batches"),
    [
        ({"active": 2}, 4),
        ({"skip_first": 1, "warmup": 1, "active": 2}, 6),
        ({"wait": 1, "active": 2, "repeat": 2}, 7),
        ({"active": 4}, 2),  # partial
        ({"warmup": 3, "active": 2}, 2),  # nothing
        ({"active": 2, "repeat": 2}, 2),  # no empty window
    ],
)
def test_instrument_plan_names_the_traces_the_step_writes(
    tmp_path: Path, schedule: dict[str, int], mini_batches: int
) -> None:
    cfg = _verl(tmp_path, **schedule)
    planned = plan_run(cfg, num_steps=1, world_size=1, num_mini_batches=mini_batches)
    want = sorted(
        (1, None if t.window is None else (t.window.first, t.window.last), t.window is not None and t.window.partial)
        for t in planned.traces
    )
    assert sorted(_step(cfg, _rollout_and_update(mini_batches))) == want
    assert not any("applies only in discrete mode" in w for w in planned.warnings)
