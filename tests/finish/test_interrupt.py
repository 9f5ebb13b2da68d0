"""An interrupted process's finish hook: never started, said once (FinishCoordinator.interrupt)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import instrument as ins
from instrument.finish._coordinator import FinishCoordinator


def _coordinator(tmp_path: Path, failures: list[str]) -> FinishCoordinator:
    hook = ins.FinishHook(cmd=f"touch {tmp_path / 'ran'}", timeout_s=30)
    config = ins.ProfilerConfig(save_path=str(tmp_path / "profile"), finish_hook=hook)
    return FinishCoordinator(config, role="actor", rank=0, world_size=1, fail=lambda what, exc: failures.append(what))


def test_an_interrupted_run_never_starts_its_hook_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[str] = []
    coordinator = _coordinator(tmp_path, failures)
    assert not coordinator.interrupted
    coordinator.interrupt("Ctrl-C (SIGINT)")
    assert coordinator.interrupted and coordinator.pending
    waited: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="instrument"):
        coordinator.meet_peers()  # returns at once (no process group here either way)
        coordinator.run(steps=[1], manifest="", wait_for_exports=lambda: waited.append(True))
        coordinator.run(steps=[1], manifest="", wait_for_exports=lambda: waited.append(True))
    assert not (tmp_path / "ran").exists() and not waited and not failures
    assert not coordinator.pending  # once: a later finish() does not start it either
    said = [r.getMessage() for r in caplog.records if "finish hook does not run" in r.getMessage()]
    assert said == [
        f"instrument: Ctrl-C (SIGINT): the finish hook does not run, so the process ends now; the traces are "
        f"saved in {tmp_path / 'profile'} (run finish_hook.cmd yourself to upload them)"
    ]


def test_a_run_not_interrupted_runs_its_hook(tmp_path: Path) -> None:
    failures: list[str] = []
    coordinator = _coordinator(tmp_path, failures)
    coordinator.run(steps=[1], manifest="", wait_for_exports=lambda: None)
    assert (tmp_path / "ran").exists() and not failures
