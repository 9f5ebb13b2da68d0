"""Mistakes in the calling code are named once: one warning with the fix, counted, and training goes on."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
import instrument.testing
from instrument.naming import TIMELINE_SUFFIX
from instrument.run._state import STATE
from instrument.testing import RecorderCall
from instrument.timeline import read_timeline


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The ``instrument`` logger's records, debug included (repeats go there)."""
    with caplog.at_level(logging.DEBUG, logger="instrument"):
        yield caplog


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("instrument")]


@ins.profiled_stage("update_actor")
def update_actor(x: int) -> int:
    return x + 1


@ins.profiled_stage("generate")
async def generate(x: int) -> int:
    return x * 2


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=env,
    )


# ---------------------------------------------------------------------- 1. before configure()


def test_calls_before_configure_are_named_once_at_configure(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    done = [update_actor(1), update_actor(2), asyncio.run(generate(3))]
    with ins.profile_step(1), ins.profiled_stage("rollout"), ins.profile_window(mini_batch=0):
        done.append(4)
    assert done == [2, 3, 6, 4]  # training ran
    assert _warned(warnings) == []  # nothing said yet: the process may still configure

    run = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,)), role="actor", rank=0, world_size=1)

    (message,) = _warned(warnings)
    assert message.startswith("instrument: stage calls (the first: stage 'update_actor') ran before configure()")
    assert "they were not recorded" in message and "call configure() first" in message
    assert run.failures == 1
    ins.finish()


def test_a_run_configured_first_hears_nothing(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    with instrument.testing.capture() as calls:
        run = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,)), role="actor", rank=0)
        with ins.profile_step(1):
            assert update_actor(1) == 2
        ins.finish()
    assert RecorderCall("start", "update_actor") in calls
    assert _warned(warnings) == [] and run.failures == 0


def test_a_process_that_never_configures_is_told_at_exit(tmp_path: Path) -> None:
    done = _run(
        """
        import instrument as ins

        @ins.profiled_stage("update_actor")
        def update_actor(x):
            return x + 1

        for step in range(1, 4):
            with ins.profile_step(step):
                print("trained", update_actor(step), flush=True)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["trained", "2", "trained", "3", "trained", "4"]
    lines = [line for line in done.stderr.splitlines() if "instrument" in line]
    assert len(lines) == 1, done.stderr
    assert "stage calls (the first: profile_step) ran but this process never called configure()" in lines[0]
    assert "instrument.configure(instrument.ProfilerConfig(...), role=" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_process_that_imports_but_calls_nothing_says_nothing(tmp_path: Path) -> None:
    done = _run("import instrument\nprint('ok')\n", tmp_path)
    assert done.returncode == 0 and done.stdout == "ok\n" and done.stderr == ""


# ---------------------------------------------------------------------- 2. a stage outside any step


@pytest.mark.parametrize("options", [{}, {"timeline": False, "on_demand": True}], ids=["timeline", "on_demand"])
def test_a_stage_outside_any_step_is_named_once(
    tmp_path: Path, warnings: pytest.LogCaptureFixture, options: dict[str, Any]
) -> None:
    with instrument.testing.capture() as calls:
        config = ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,), **options)
        run = ins.configure(config, role="actor", rank=0, world_size=1)
        assert [update_actor(i) for i in range(3)] == [1, 2, 3]  # forgot profile_step
        with ins.profiled_stage("rollout"):
            pass
        (message,) = _warned(warnings)
        assert message.startswith("instrument: stage 'update_actor' ran outside any step (role actor, rank 0)")
        assert "with instrument.profile_step(step):" in message and "begin_step(step)" in message
        assert run.failures == 4  # each counted, one warning

        with ins.profile_step(1):  # used rightly afterwards: recorded, nothing more said
            assert update_actor(5) == 6
        assert update_actor(6) == 7  # between steps: named already (debug only)
        ins.finish()
    assert RecorderCall("start", "update_actor") in calls
    assert len(_warned(warnings)) == 1


def test_without_timeline_metrics_or_triggers_a_stage_between_steps_stays_free(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    # A Ray controller opens only the profiled steps of such a run: its workers' stages run between steps by design.
    with instrument.testing.capture():
        config = ins.ProfilerConfig(save_path=str(tmp_path), steps=(2,), timeline=False)
        run = ins.configure(config, role="actor", rank=0, world_size=1)
        assert not STATE.engaged  # the disabled path: nothing to see, nothing to pay
        assert update_actor(1) == 2
        with ins.profile_step(2):
            update_actor(2)
        assert not STATE.engaged and update_actor(3) == 4
    assert _warned(warnings) == [] and run.failures == 0


def test_a_stage_between_steps_with_the_timeline_keeps_its_span(tmp_path: Path) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(99,)), role="actor", rank=0, world_size=1)
    with ins.profile_step(1):
        update_actor(1)
    update_actor(2)  # outside: named, still in the timeline (step 0), as before
    (path,) = [f for f in ins.finish() if f.endswith(TIMELINE_SUFFIX)]
    spans = [s for s in read_timeline(path).spans if s.stage == "update_actor"]
    assert sorted(s.step for s in spans) == [0, 1]


# ---------------------------------------------------------------------- 3. a window outside any stage


def test_a_window_outside_any_stage_is_named_once(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    with instrument.testing.capture():
        run = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,)), role="actor", rank=0)
        done = []
        with ins.profile_step(1):
            for i in range(2):
                with ins.profile_window(mini_batch=i):  # forgot the stage around the loop
                    done.append(i)
            with ins.profiled_stage("update_actor", scheduled=True), ins.profile_window(mini_batch=0):
                done.append(9)  # rightly used: nothing said
        ins.finish()
    assert done == [0, 1, 9]
    (message,) = _warned(warnings)
    assert message.startswith("instrument: profile_window(mini_batch=0) ran outside any stage at step 1")
    assert "inside the @profiled_stage function" in message
    assert run.failures == 2


# ---------------------------------------------------------------------- 4. steps count from 1


@pytest.mark.parametrize("step", [0, -1])
def test_a_step_below_one_is_named_once_and_not_opened(
    tmp_path: Path, warnings: pytest.LogCaptureFixture, step: int
) -> None:
    with instrument.testing.capture() as calls:
        run = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
        with ins.profile_step(step):
            assert update_actor(1) == 2  # training goes on; the stage's own warning is folded into this one
        assert ins.begin_step(step) is False
        ins.end_step()
        with ins.profile_step(1):
            assert run.step == 1 and run.step_profiled
            update_actor(2)
        ins.finish()
    (message,) = _warned(warnings)
    assert message.startswith(f"instrument: profile_step({step}): RL steps count from 1")
    assert "range(1, n + 1)" in message
    assert [c.step for c in calls if c.kind == "step"] == [1]
    assert run.profiled_steps == (1,)


def test_a_step_that_is_no_int_fails_at_the_call() -> None:
    with pytest.raises(TypeError, match=r"'step' must be an int \(1-based RL step\): 1.0"):
        ins.profile_step(1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- 5. finish() paths


def test_finish_returns_absolute_paths_for_a_relative_save_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with instrument.testing.capture():
        run = ins.configure(ins.ProfilerConfig(save_path="out/profile", steps=(1,)), role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            update_actor(1)
        files = ins.finish()
    assert files, "the step timeline is a file of the run"
    assert sorted(run.files) == sorted(files)  # RunInfo says the same paths
    for path in files:
        assert os.path.isabs(path) and Path(path).is_file()
        assert Path(path).parent == tmp_path / "out" / "profile"
