"""nsys options, command line, Ray runtime_env, capture-range counts and report relocation (real files)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import instrument as ins
from instrument.integrations.nsys import (
    capture_ranges_for,
    nsys_command,
    nsys_options,
    nsys_runtime_env,
    relocate_nsys_reports,
)
from instrument.manifest import Manifest, read_manifests
from instrument.plan import StageSpec


def test_command_line_and_runtime_env_share_the_options(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(tool="nvtx", steps=(2, 4), discrete=False)
    command = nsys_command(cfg, output=tmp_path / "actor")
    assert command == [
        "nsys",
        "profile",
        "--trace=cuda,nvtx,osrt,cudnn,cublas",
        "--cuda-memory-usage=true",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat-shutdown:2",
        "--kill=none",
        f"--output={tmp_path / 'actor'}",
        "--force-overwrite=false",
    ]
    assert nsys_runtime_env(cfg) == {"nsight": nsys_options(cfg)}
    assert nsys_options(ins.ProfilerConfig(tool="nvtx"))["capture-range-end"] == "stop"  # unknown count
    with pytest.raises(ValueError, match="'capture_ranges' must be >= 1: 0"):
        nsys_options(cfg, capture_ranges=0)


@pytest.mark.parametrize(
    ("overrides", "rank", "expected"),
    [
        ({"discrete": False, "steps": (1, 3)}, 0, 2),  # one per profiled step
        ({"discrete": False, "steps": (1, 3, 9)}, 0, 2),  # step 9 is never reached in 4 steps
        ({"discrete": False, "steps": (1, 3)}, 1, 0),  # an unprofiled rank opens none
        ({"steps": (1, 3)}, 0, 4),  # discrete: two stages per step
        ({"steps": (2,), "schedule": ins.Schedule(wait=1, active=2, repeat=2)}, 0, 3),  # 1 + 2 windows
        ({"steps": (2,), "schedule": ins.Schedule(skip_first=9, active=2)}, 0, 1),  # the window never starts
    ],
)
def test_capture_ranges_are_counted_from_the_plan(overrides: dict[str, object], rank: int, expected: int) -> None:
    cfg = ins.ProfilerConfig(tool="nvtx", **overrides)  # type: ignore[arg-type]
    stages = (StageSpec("compute_log_prob"), StageSpec("update_actor", scheduled=True))
    count = capture_ranges_for(cfg, rank=rank, world_size=2, num_steps=4, stages=stages, num_mini_batches=6)
    assert count == expected


def test_capture_ranges_unknown_without_stages_in_discrete_mode() -> None:
    assert capture_ranges_for(ins.ProfilerConfig(tool="nvtx"), rank=0, world_size=1, num_steps=3) is None


def test_reports_of_this_process_are_moved_others_left(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "nsight"
    logs.mkdir(parents=True)
    mine = logs / "worker_process_4242.nsys-rep"
    other = logs / "worker_process_42421.nsys-rep"
    mine.write_bytes(b"r" * 1000)
    other.write_bytes(b"o" * 10)
    save = tmp_path / "save"
    moved = relocate_nsys_reports(
        logs, pid=4242, save_path=save, role="actor", rank=3, world_size=8, manifest=Manifest(save), quiet_s=0.05
    )
    assert len(moved) == 1
    name = Path(moved[0].path).name
    assert name.startswith("actor_nsys_rank3-of-8_") and "_pid4242_" in name and name.endswith(".nsys-rep")
    assert other.exists() and not mine.exists()
    assert [r.path for r in read_manifests(save)] == [moved[0].path]
    assert moved[0].bytes == 1000


def test_relocation_waits_until_nsys_has_finished_writing(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    report = logs / f"profile_{os.getpid()}.nsys-rep"
    report.write_bytes(b"")

    def finalise() -> None:
        with report.open("ab") as handle:
            for _ in range(6):
                handle.write(b"z" * 512)
                handle.flush()
                time.sleep(0.05)

    writer = threading.Thread(target=finalise)
    writer.start()
    moved = relocate_nsys_reports(
        logs, pid=os.getpid(), save_path=tmp_path / "save", role="rollout", rank=0, world_size=1, quiet_s=0.3
    )
    writer.join()
    assert [r.bytes for r in moved] == [3072]
