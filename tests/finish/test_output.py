"""The finish hook's output is shown by default: on stderr, each line behind ``[hook rank R]``, then its
exit status and duration; ``FinishHook(output="log")`` sends it to the logger only (issue 18 item 1).

Real trainer processes, real ``/bin/sh`` hooks; stderr read from the process, never mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import instrument as ins

GUARD_S = 120.0  # only ever hit when something hangs

# A whole run whose last step runs the hook; argv: save_path, cmd, output, rank.  The recorder is
# instrument.testing's (no torch needed): the hook and its output are the real ones.
TRAINER = """
import sys
import instrument as ins
import instrument.testing
save, cmd, output, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
hook = ins.FinishHook(cmd=cmd, ranks=(rank,), timeout_s=60, output=output)
cfg = ins.ProfilerConfig(steps=(1,), ranks=(rank,), save_path=save, finish_hook=hook)
with instrument.testing.capture():
    ins.configure(cfg, role="actor", rank=rank, world_size=rank + 1)
    with ins.profile_step(1, last=True):
        print("training step 1", flush=True)
    print("after the hook", flush=True)
"""


def _train(tmp_path: Path, cmd: str, output: str, rank: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, "-c", TRAINER, str(tmp_path / "profile"), cmd, output, str(rank)],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=env,
        check=False,
    )


def test_hook_output_goes_to_stderr_by_default_with_rank_prefix_exit_status_and_duration(tmp_path: Path) -> None:
    assert ins.FinishHook(cmd="true").output == "stderr"
    done = _train(tmp_path, 'echo "uploading $INSTRUMENT_PROFILE_RANK"; echo "to stderr" >&2', "stderr", rank=3)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "[hook rank 3] uploading 3" in lines
    assert "[hook rank 3] to stderr" in lines
    status = [line for line in lines if line.startswith("[hook rank 3] exit ")]
    assert len(status) == 1 and status[0].endswith(" s"), lines
    assert status[0].startswith("[hook rank 3] exit 0 after ")
    assert lines.index(status[0]) > lines.index("[hook rank 3] uploading 3")  # the end comes last
    assert "after the hook" in done.stdout  # training went on
    assert "uploading" not in done.stdout  # the hook's stdout is not mixed into the trainer's


def test_failing_hook_shows_its_exit_code_and_one_warning(tmp_path: Path) -> None:
    done = _train(tmp_path, "echo 'bucket not found'; exit 3", "stderr")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "[hook rank 0] bucket not found" in lines
    assert any(line.startswith("[hook rank 0] exit 3 after ") for line in lines), lines
    warnings = [line for line in lines if "finish hook exited with code 3" in line]
    assert len(warnings) == 1, lines  # Python's last-resort handler shows the one WARNING
    assert "after the hook" in done.stdout


def test_output_log_keeps_the_hook_off_stderr(tmp_path: Path) -> None:
    done = _train(tmp_path, "echo 'quiet upload'", "log")
    assert done.returncode == 0, done.stderr
    assert "quiet upload" not in done.stderr  # INFO records are not shown without a logging config
    assert "[hook rank" not in done.stderr
    assert "after the hook" in done.stdout


def test_output_log_reaches_the_finish_hook_logger(tmp_path: Path) -> None:
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(message)s')\n" + TRAINER
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "p"), "echo logged line", "log", "0"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "instrument.finish_hook [instrument actor rank 0] logged line" in done.stdout.splitlines()
    assert "logged line" not in done.stderr


def test_a_closed_stderr_loses_the_lines_not_the_run(tmp_path: Path) -> None:
    script = "import os, sys\nsys.stderr.close()\n" + TRAINER
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "p"), "echo hi", "stderr", "0"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    assert "after the hook" in done.stdout


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("stdout", ValueError, "'output' must be one of 'stderr', 'log': 'stdout'"),
        (None, ValueError, "'output' must be one of 'stderr', 'log': None"),
    ],
)
def test_bad_output_fails_at_construction_naming_field_values_and_value(
    value: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match="^" + words.replace("(", r"\(").replace(")", r"\)") + "$"):
        ins.FinishHook(cmd="true", output=value)  # type: ignore[arg-type]


def test_output_reads_from_overrides_and_dicts() -> None:
    cfg = ins.ProfilerConfig.from_overrides(["finish_hook.cmd=true", "finish_hook.output=log"])
    assert cfg.finish_hook is not None and cfg.finish_hook.output == "log"
    cfg = ins.ProfilerConfig.from_dict({"finish_hook": {"cmd": "true", "output": "stderr"}})
    assert cfg.finish_hook is not None and cfg.finish_hook.output == "stderr"
