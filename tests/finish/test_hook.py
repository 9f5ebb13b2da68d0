"""Tests for ``instrument.finish._hook``: real ``/bin/sh``, real processes, real files; no subprocess mocks."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from instrument.finish import _launch
from instrument.finish._hook import (
    MAX_LOGGED_LINES,
    TAIL_LINES,
    HookResult,
    hook_environment,
    run_finish_hook,
)

PREFIX = "[finish rank0]"
GUARD_S = 60.0  # waits for a process or file give up after this: a hang guard, never a speed check


def _env(**overrides: object) -> dict[str, str]:
    values: dict[str, object] = {
        "save_path": "outputs/profile",
        "tool": "torch",
        "role": "actor",
        "rank": 0,
        "world_size": 4,
        "pid": 4242,
        "steps": [3, 1],
        "manifest": "outputs/profile/instrument-manifest-h-pid4242.jsonl",
    }
    values.update(overrides)
    return hook_environment(**values)  # type: ignore[arg-type]


def _run(cmd: str, timeout_s: float = 30, env: dict[str, str] | None = None) -> HookResult:
    return run_finish_hook(cmd, env=env or {}, timeout_s=timeout_s, log_prefix=PREFIX)


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies.

    Zombies are skipped: an orphaned, killed grandchild waits for the init process to reap it, and
    some container inits never do; it runs nothing and holds nothing.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = text.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _hook_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The hook's own output lines as logged (status messages go to the parent logger)."""
    return [r.getMessage() for r in caplog.records if r.name == "instrument.finish_hook"]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture(autouse=True)
def _capture_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="instrument")


# --------------------------------------------------------------------------- hook_environment


def test_hook_environment_values() -> None:
    env = _env(steps=[5, 1, 3, 3])
    assert set(env) == {
        f"{prefix}{k}"
        for prefix in ("INSTRUMENT_PROFILE_", "VERL_PROFILE_")
        for k in ("SAVE_PATH", "TOOL", "ROLE", "RANK", "WORLD_SIZE", "PID", "STEPS", "MANIFEST")
    }
    assert env["INSTRUMENT_PROFILE_SAVE_PATH"] == os.path.join(os.getcwd(), "outputs/profile")
    assert os.path.isabs(env["INSTRUMENT_PROFILE_MANIFEST"])
    assert env["INSTRUMENT_PROFILE_STEPS"] == "1,3,5"
    assert env["INSTRUMENT_PROFILE_RANK"] == "0"
    assert env["INSTRUMENT_PROFILE_WORLD_SIZE"] == "4"
    assert env["INSTRUMENT_PROFILE_PID"] == "4242"
    assert _env(steps=[])["INSTRUMENT_PROFILE_STEPS"] == ""


def test_verl_names_carry_the_same_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finish_hook_cmd moved over from verl reads $VERL_PROFILE_*: the same values as INSTRUMENT_PROFILE_*."""
    env = _env(steps=[2, 1], role="actor")
    for name, value in env.items():
        if name.startswith("INSTRUMENT_PROFILE_"):
            assert env["VERL_PROFILE_" + name[len("INSTRUMENT_PROFILE_") :]] == value
    monkeypatch.chdir(tmp_path)
    cmd = 'printf "%s|%s|%s" "$VERL_PROFILE_SAVE_PATH" "$VERL_PROFILE_RANK" "$VERL_PROFILE_ROLE" > verl.txt'
    assert _run(cmd, env=env).ok
    assert (tmp_path / "verl.txt").read_text(encoding="utf-8") == f"{env['INSTRUMENT_PROFILE_SAVE_PATH']}|0|actor"


# --------------------------------------------------------------------------- run_finish_hook


@pytest.mark.parametrize(
    "role",
    ["a;touch PWNED", "$(touch PWNED2)", "`touch PWNED3`", 'x\' "y" & touch PWNED4 | é 名\\n'],
)
def test_values_reach_the_hook_as_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str) -> None:
    monkeypatch.chdir(tmp_path)
    save_path = tmp_path / "out dir; $(touch PWNED5) `touch PWNED6` ünï"
    env = _env(role=role, save_path=str(save_path), manifest=str(save_path / "m $(touch PWNED7).jsonl"))
    cmd = (
        "env | grep -E '^(INSTRUMENT|VERL)_PROFILE_' | sort > env.txt; "
        'printf %s "$INSTRUMENT_PROFILE_ROLE" > role.txt; '
        'printf %s "$INSTRUMENT_PROFILE_SAVE_PATH" > save.txt'
    )
    result = _run(cmd, env=env)
    assert result.ok, result
    seen = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text(encoding="utf-8").splitlines())
    assert seen == env
    assert (tmp_path / "role.txt").read_text(encoding="utf-8") == role
    assert (tmp_path / "save.txt").read_text(encoding="utf-8") == str(save_path)
    assert not list(tmp_path.rglob("PWNED*"))
    assert not save_path.exists()


def test_success_is_logged_with_duration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    result = _run("echo hello; printf 'no newline at the end'")
    assert result.ok
    assert (result.returncode, result.timed_out, result.error) == (0, False, None)
    assert result.tail == ("hello", "no newline at the end")
    assert result.duration_s > 0
    assert _hook_lines(caplog) == [f"{PREFIX} hello", f"{PREFIX} no newline at the end"]
    assert any("succeeded in" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    assert not _warnings(caplog)


def test_failing_hook_warns_with_code_and_last_lines(caplog: pytest.LogCaptureFixture) -> None:
    result = _run("echo first; echo second; echo 'last words' >&2; exit 3")
    assert result.returncode == 3
    assert not result.ok and not result.timed_out and result.error is None
    assert result.tail == ("first", "second", "last words")
    (warning,) = _warnings(caplog)
    assert "exited with code 3" in warning
    assert "last words" in warning and "first" in warning
    assert PREFIX in warning


def test_undecodable_output_is_replaced() -> None:
    result = _run(r"printf 'caf\351\n'")
    assert result.ok
    assert result.tail == ("caf\ufffd",)


def test_hanging_hook_is_killed_with_its_whole_group(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pgid_file, bg_file = tmp_path / "pgid", tmp_path / "bg"
    cmd = 'echo $$ > "$PGID_FILE"; sleep 1000 & echo $! > "$BG_FILE"; sleep 1000'
    result = _run(cmd, timeout_s=1, env={"PGID_FILE": str(pgid_file), "BG_FILE": str(bg_file)})
    # Killed at the timeout, not ended on its own: the shell and its background sleep are gone.
    assert result.timed_out and result.returncode is None and not result.ok
    pgid, bg = int(pgid_file.read_text()), int(bg_file.read_text())
    assert _live_members(pgid) == []
    assert not _alive(bg)
    (warning,) = _warnings(caplog)
    assert "timed out after 1 s" in warning


def test_hook_ignoring_sigterm_gets_sigkill(tmp_path: Path) -> None:
    pgid_file = tmp_path / "pgid"
    # Ignored signals stay ignored in children, so every process of the group shrugs off SIGTERM.
    cmd = 'trap "" TERM; echo $$ > "$PGID_FILE"; sleep 1000 & sleep 1000 & wait'
    result = _run(cmd, timeout_s=0.5, env={"PGID_FILE": str(pgid_file)})
    assert result.timed_out and result.returncode is None
    assert _live_members(int(pgid_file.read_text())) == []  # SIGTERM alone would have left all three


def test_megabytes_of_output_are_drained_and_capped(caplog: pytest.LogCaptureFixture) -> None:
    result = _run("yes | head -c 5000000; echo done", timeout_s=120)
    assert result.ok, result  # ran to its end: a full pipe never stalled it until the timeout
    assert result.tail == ("y",) * (TAIL_LINES - 1) + ("done",)
    assert len(_hook_lines(caplog)) == MAX_LOGGED_LINES + 1  # and the line saying how many were not shown
    assert f"{2_500_001 - MAX_LOGGED_LINES} more output lines not shown" in _hook_lines(caplog)[-1]


def test_one_endless_line_is_cut_into_pieces() -> None:
    result = _run("head -c 3000000 /dev/zero | tr '\\0' x", timeout_s=120)
    assert result.ok
    assert len(result.tail) == TAIL_LINES
    assert all(set(line) == {"x"} and len(line) <= _launch._MAX_LINE_BYTES for line in result.tail)


def test_background_process_holding_the_pipe_does_not_hang_us(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pid_file = tmp_path / "held.pid"
    # It writes its pid only after leaving the hook's group and session, so it outlives the hook's deadline.
    script = "import os, sys, time; os.setsid(); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(3600)"
    env = {"PY": sys.executable, "SCRIPT": script, "PID_FILE": str(pid_file)}
    result = _run('"$PY" -c "$SCRIPT" "$PID_FILE" & echo started', env=env)
    guard = time.monotonic() + GUARD_S  # only against a broken test hanging; no assertion on speed
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < guard, "the background process never started"
        time.sleep(0.05)
    held = int(pid_file.read_text())
    try:
        assert result.ok and result.tail == ("started",)
        assert _alive(held)  # we returned while it still holds the pipe: nobody waited for it
        assert any("still holds its output open" in w for w in _warnings(caplog))
    finally:
        os.kill(held, signal.SIGKILL)


@pytest.mark.parametrize(
    ("cmd", "env"),
    [("true", {"BAD": "nul\0inside"}), ("echo \0", {}), ("true", {"NOT_A_STR": 1})],
    ids=["nul-in-env", "nul-in-cmd", "non-str-env"],
)
def test_unstartable_hook_warns_and_never_raises(
    cmd: str, env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    result = _run(cmd, env=env)
    assert not result.ok
    assert result.returncode is None and not result.timed_out
    assert result.error
    assert len(_warnings(caplog)) == 1


def test_missing_command_is_a_failure_not_an_error() -> None:
    result = _run("surely-no-such-command-exists-here")
    assert result.returncode == 127 and not result.ok and result.error is None
