"""Each distinct mistake is named once (issue 32): a second kind of misuse is warned about even after a first,
and a repeat of either is not."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import instrument as ins


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="instrument"):
        yield caplog


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("instrument")]


@ins.profiled_stage("update_actor")
def update_actor(x: int) -> int:
    return x + 1


def _each_mistake_twice() -> list[int]:
    done = []
    for _ in range(2):
        done.append(update_actor(1))  # a stage while no step is open
        with ins.profile_step(0):  # a step numbered from 0
            done.append(update_actor(2))
        with ins.profile_step(3):  # a step as it should be: nothing to say
            done.append(update_actor(3))
    return done


def test_two_different_misuses_each_warn_once(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    run = ins.configure(ins.ProfilerConfig(tool="none", save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    assert _each_mistake_twice() == [2, 3, 4] * 2  # training ran through every one
    ins.finish()
    said = _warned(warnings)
    assert len(said) == 2, said
    outside, below_one = said
    assert outside.startswith("instrument: stage 'update_actor' ran outside any step")
    assert below_one.startswith("instrument: profile_step(0): RL steps count from 1")
    # each mistake counted, the repeats at debug level: 2 stages outside a step, 2 steps from 0 (the stage
    # inside a step that was not opened is that step's mistake, not one more)
    assert run.failures == 4


def test_a_step_below_one_first_then_a_stage_outside_a_step(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    """The other order: neither mistake hides the other."""
    ins.configure(ins.ProfilerConfig(tool="none", save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    with ins.profile_step(0):
        pass
    assert update_actor(1) == 2
    ins.finish()
    said = _warned(warnings)
    assert [m.split(":")[1].strip() for m in said] == [
        "profile_step(0)",
        "stage 'update_actor' ran outside any step (role actor, rank 0)",
    ]
