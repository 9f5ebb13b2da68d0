"""Faults after configure(): training goes on, one warning, nothing already written is lost."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import instrument as ins
import instrument.testing
from tests.conftest import without_timeline


@ins.profiled_stage("compute_log_prob")
def forward() -> None:
    torch.randn(8, 8) @ torch.randn(8, 8)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("instrument")]


def test_save_path_removed_mid_run_makes_the_trace_handler_fail_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save = tmp_path / "profile"
    session = ins.configure(
        ins.ProfilerConfig(save_path=str(save), contents=("cpu",), steps=(1, 2, 3)), role="actor", rank=0, world_size=1
    )
    with ins.profile_step(1):
        forward()
    ins.testing.wait_for_exports()
    kept = list(save.glob("*.pt.trace.json.gz"))
    assert len(kept) == 1
    moved = tmp_path / "kept"
    shutil.move(str(save), moved)  # the directory disappears under the running job
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for step in (2, 3):
            with ins.profile_step(step):
                forward()  # the export inside the profiler's stop raises; the stage does not
        ins.finish()
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert "compute_log_prob" in messages[0]
    assert session.failures == 2
    assert len(list(moved.glob("*.pt.trace.json.gz"))) == 1  # the earlier trace is intact


def test_full_disk_keeps_training_going(tmp_path: Path) -> None:
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk: writes fail with EFBIG, for real."""
    script = textwrap.dedent(
        f"""
        import logging, resource, signal, torch
        import instrument as ins
        logging.basicConfig(level=logging.WARNING)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        s = ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1, 2)),
                          role="actor", rank=0, world_size=1)
        @ins.profiled_stage("update_actor")
        def update():
            for _ in range(50):
                torch.randn(16, 16) @ torch.randn(16, 16)
        for step in (1, 2, 3):
            with ins.profile_step(step):
                update()
        ins.finish()
        print("trained through", step, "failures", s.failures)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "trained through 3" in done.stdout
    assert "failures 0" not in done.stdout
    assert "File too large" in done.stderr or "EFBIG" in done.stderr or "could not" in done.stderr


def test_stop_without_start_and_finish_twice(tmp_path: Path) -> None:
    session = ins.configure(ins.ProfilerConfig(save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    ins.end_step()  # no step open
    ins.end_step(last=True)
    assert ins.finish() == []
    assert ins.finish() == []
    assert session.failures == 0


@pytest.mark.parametrize(
    ("cmd", "expect"),
    [
        ("exit 3", "exit"),
        ("sleep 1000 & sleep 1000", "timed out"),
        ("yes | head -c 3000000", None),
    ],
)
def test_finish_hook_faults_never_reach_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cmd: str, expect: str | None
) -> None:
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path), contents=("cpu",), steps=(1,), finish_hook=ins.FinishHook(cmd=cmd, timeout_s=1)
    )
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    # The hanging hook would hold the step for 1000 s: the step returning and the "timed out"
    # warning say it was killed at its 1 s timeout.
    with caplog.at_level(logging.INFO, logger="instrument"), ins.profile_step(1, last=True):
        forward()
    assert len(without_timeline(ins.finish())) == 1
    if expect is not None:
        assert any(expect in m for m in _warnings(caplog)), _warnings(caplog)
    else:
        assert _warnings(caplog) == []


def test_finish_hook_runs_once_on_chosen_ranks_even_when_the_run_ends_early(tmp_path: Path) -> None:
    marker = tmp_path / "hook-ran"
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path / "p"),
        steps=(5,),  # never reached
        ranks=(1,),
        finish_hook=ins.FinishHook(cmd=f'echo "$INSTRUMENT_PROFILE_RANK" >> "{marker}"', ranks=(0,)),
    )
    ins.configure(cfg, role="actor", rank=0, world_size=2)
    for step in (1, 2):
        with ins.profile_step(step, last=(step == 2)):
            forward()
    ins.finish()
    assert marker.read_text() == "0\n"
    ins.testing.reset()
    ins.configure(cfg, role="actor", rank=1, world_size=2)  # not a hook rank
    with ins.profile_step(1, last=True):
        forward()
    ins.finish()
    assert marker.read_text() == "0\n"


def test_finish_hook_runs_after_the_last_configured_step_with_every_trace_on_disk(tmp_path: Path) -> None:
    listing = tmp_path / "listing"
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path / "p"),
        contents=("cpu",),
        steps=(1, 2),
        finish_hook=ins.FinishHook(cmd=f'ls "$INSTRUMENT_PROFILE_SAVE_PATH" > "{listing}"'),
    )
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in (1, 2, 3):
        with ins.profile_step(step):
            forward()
        if step == 2:
            assert listing.exists()  # ran right after step 2, not at the end
    text = listing.read_text()
    assert text.count(".pt.trace.json.gz") == 2
    assert "instrument-manifest-" in text
