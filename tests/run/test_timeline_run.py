"""The step timeline inside a real run: one warning for one cause, listed before the finish hook, and after SIGTERM."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import instrument as ins
from instrument.manifest import read_manifests
from instrument.naming import SDK_STAGE_PREFIX, TIMELINE_SUFFIX
from instrument.timeline import read_timeline

GUARD_S = 120.0  # a hang guard only


@ins.profiled_stage("generate_sequences")
def generate() -> int:
    return 1


def test_a_save_path_that_cannot_be_made_is_one_failure_for_the_recorder_and_the_timeline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    cfg = ins.ProfilerConfig(save_path=str(blocker / "profile"), steps=(2,), tool="none")
    blocker.write_text("not a directory")  # after the config is built: the run absorbs it
    with caplog.at_level(logging.WARNING, logger="instrument"):
        run = ins.configure(cfg, role="rollout", rank=0, world_size=1)
        for step in (1, 2, 3):
            with ins.profile_step(step):
                generate()
        assert ins.finish() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(blocker / "profile") in warnings[0]
    assert run.failures == 1


def test_a_hook_run_by_finish_sees_the_timeline_in_the_manifest(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    hook = ins.FinishHook(cmd=f'cat "$INSTRUMENT_PROFILE_MANIFEST" > "{seen}"', output="log")
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "p"), contents=("cpu",), finish_hook=hook)  # every step
    ins.configure(cfg, role="rollout", rank=0, world_size=1)
    for step in (1, 2):
        with ins.profile_step(step):
            generate()
    ins.finish()  # no last step was named: the hook runs here, after the timeline is closed and listed
    [record] = [r for r in map(json.loads, seen.read_text().splitlines()) if r["tool"] == "timeline"]
    assert record["path"].endswith(TIMELINE_SUFFIX)
    assert [s.step for s in read_timeline(tmp_path / "p" / record["path"]).spans if s.kind == "step"] == [1, 2]


def test_a_rank_killed_by_sigterm_lists_its_timeline(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, instrument as ins
        ins.configure(ins.ProfilerConfig(save_path={str(tmp_path / "p")!r}, tool="none"), role="actor", rank=0)

        @ins.profiled_stage("update_actor")
        def update():
            pass

        for step in (1, 2):
            with ins.profile_step(step):
                update()
        os.kill(os.getpid(), signal.SIGTERM)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=GUARD_S)
    assert done.returncode == -15, done.stderr
    [record] = read_manifests(tmp_path / "p")
    assert record.tool == "timeline"
    timeline = read_timeline(tmp_path / "p" / record.path)
    assert not timeline.torn
    assert [(s.kind, s.step) for s in timeline.spans] == [("stage", 1), ("step", 1), ("stage", 2), ("step", 2)]


@pytest.mark.parametrize("discrete", [True, False])
def test_the_sdks_own_work_on_a_profiled_step_is_its_own_span_inside_the_step(tmp_path: Path, discrete: bool) -> None:
    """Real torch.profiler: its start before the stage and its stop (with the export) after it are spans named
    ``instrument:...`` of the traced step, inside the step's span; an untraced step has none."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "p"), steps=(2,), contents=("cpu",), discrete=discrete)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in (1, 2, 3):
        with ins.profile_step(step):
            generate()
    ins.finish()
    [path] = (tmp_path / "p").glob(f"*{TIMELINE_SUFFIX}")
    spans = read_timeline(path).spans
    own = [s for s in spans if s.stage.startswith(SDK_STAGE_PREFIX)]
    assert {s.stage for s in own} == {SDK_STAGE_PREFIX + "profiler_start", SDK_STAGE_PREFIX + "profiler_stop"}
    assert {s.step for s in own} == {2} and all(s.kind == "stage" for s in own)
    [step] = [s for s in spans if s.kind == "step" and s.step == 2]
    assert all(step.start_ns <= s.start_ns and s.end_ns <= step.end_ns for s in own)
    [user] = [s for s in spans if s.stage == "generate_sequences" and s.step == 2]
    assert not any(s.start_ns < user.end_ns and user.start_ns < s.end_ns for s in own)  # beside the stage, not in it
