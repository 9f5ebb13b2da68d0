"""Kineto's own lines (``USDT: … profiler_start`` / ``profiler_stop``, two per trace with torch 2.13) stay
off stderr unless asked for: real torch.profiler in a fresh process each, since kineto reads its level once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

LOOP = """
import os, sys
import instrument as ins

ins.configure(ins.ProfilerConfig(steps=(1, 2), contents=("cpu",), save_path=sys.argv[1]), role="actor",
              rank=0, world_size=1)

@ins.profiled_stage("update_actor")
def update_actor():
    sum(range(1000))

for step in (1, 2):
    with ins.profile_step(step):
        update_actor()
files = ins.finish()
print(len([f for f in files if f.endswith(".pt.trace.json.gz")]), os.environ.get("KINETO_LOG_LEVEL"))
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "INSTRUMENT_KINETO_LOGS")}
    return subprocess.run(
        [sys.executable, "-c", LOOP, str(tmp_path / "profile")],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,  # only against a hang
        check=True,
    )


def test_a_profiled_loop_prints_no_kineto_lines(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.stdout.split() == ["2", "None"]  # two traces; the variable is gone again once kineto read it
    assert "USDT:" not in done.stderr, done.stderr


def test_instrument_kineto_logs_brings_them_back(tmp_path: Path) -> None:
    done = _run(tmp_path, INSTRUMENT_KINETO_LOGS="1")
    assert done.stdout.split() == ["2", "None"]
    assert done.stderr.count("profiler_start") == 2 and done.stderr.count("profiler_stop") == 2, done.stderr


def test_a_level_the_user_set_is_kept(tmp_path: Path) -> None:
    done = _run(tmp_path, KINETO_LOG_LEVEL="3")  # kineto's STAGE level: its stage lines and the USDT ones
    assert done.stdout.split() == ["2", "3"]
    assert "USDT:" in done.stderr and "Completed Stage" in done.stderr, done.stderr
