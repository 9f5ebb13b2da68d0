"""Tests for ``instrument._finish``: real ``/bin/sh``, real processes, real files; no subprocess mocks."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from instrument import _finish
from instrument._finish import (
    MAX_LOGGED_LINES,
    TAIL_LINES,
    HookResult,
    hook_environment,
    move_into,
    run_finish_hook,
    wait_until_stable,
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
        f"INSTRUMENT_PROFILE_{k}"
        for k in ("SAVE_PATH", "TOOL", "ROLE", "RANK", "WORLD_SIZE", "PID", "STEPS", "MANIFEST")
    }
    assert env["INSTRUMENT_PROFILE_SAVE_PATH"] == os.path.join(os.getcwd(), "outputs/profile")
    assert os.path.isabs(env["INSTRUMENT_PROFILE_MANIFEST"])
    assert env["INSTRUMENT_PROFILE_STEPS"] == "1,3,5"
    assert env["INSTRUMENT_PROFILE_RANK"] == "0"
    assert env["INSTRUMENT_PROFILE_WORLD_SIZE"] == "4"
    assert env["INSTRUMENT_PROFILE_PID"] == "4242"
    assert _env(steps=[])["INSTRUMENT_PROFILE_STEPS"] == ""


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
        "env | grep '^INSTRUMENT_PROFILE_' | sort > env.txt; "
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
    assert all(set(line) == {"x"} and len(line) <= _finish._MAX_LINE_BYTES for line in result.tail)


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


# --------------------------------------------------------------------------- move_into


def _make(path: Path, data: bytes = b"trace data\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_move_same_filesystem(tmp_path: Path) -> None:
    src = _make(tmp_path / "a" / "t.json")
    (tmp_path / "b").mkdir()
    dest = move_into(src, tmp_path / "b")
    assert dest == tmp_path / "b" / "t.json"
    assert dest.read_bytes() == b"trace data\n" and not src.exists()
    renamed = move_into(dest, tmp_path / "a", "renamed.json")
    assert renamed.read_bytes() == b"trace data\n" and not dest.exists()


def test_move_never_overwrites(tmp_path: Path) -> None:
    src = _make(tmp_path / "a" / "t.json", b"new")
    existing = _make(tmp_path / "b" / "t.json", b"old")
    with pytest.raises(FileExistsError):
        move_into(src, tmp_path / "b")
    assert src.read_bytes() == b"new" and existing.read_bytes() == b"old"


def test_move_onto_itself_returns_it(tmp_path: Path) -> None:
    src = _make(tmp_path / "t.json")
    assert move_into(src, tmp_path) == src
    assert move_into(src, str(tmp_path), "t.json") == src
    assert src.read_bytes() == b"trace data\n"


def test_move_finishes_an_interrupted_move(tmp_path: Path) -> None:
    src = _make(tmp_path / "a" / "t.json")
    (tmp_path / "b").mkdir()
    os.link(src, tmp_path / "b" / "t.json")  # a move that stopped between link and unlink
    dest = move_into(src, tmp_path / "b")
    assert dest.read_bytes() == b"trace data\n" and not src.exists()


@pytest.mark.parametrize("name", ["", ".", "..", "../escape", "a/b"])
def test_move_rejects_names_that_are_not_file_names(tmp_path: Path, name: str) -> None:
    src = _make(tmp_path / "t.json")
    with pytest.raises(ValueError):
        move_into(src, tmp_path / "b", name)
    assert src.exists()


def test_move_failures_leave_the_source(tmp_path: Path) -> None:
    src = _make(tmp_path / "a" / "t.json")
    with pytest.raises(FileNotFoundError):
        move_into(src, tmp_path / "missing")
    not_a_dir = _make(tmp_path / "file")
    with pytest.raises(NotADirectoryError):
        move_into(src, not_a_dir)
    with pytest.raises(FileNotFoundError):
        move_into(tmp_path / "a" / "nope.json", tmp_path)
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError, match="not a regular file"):
        move_into(tmp_path / "dir", tmp_path / "a")
    (tmp_path / "link").symlink_to(src)
    with pytest.raises(OSError, match="not a regular file"):
        move_into(tmp_path / "link", tmp_path / "a", "other")
    assert src.read_bytes() == b"trace data\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_move_into_unwritable_directory(tmp_path: Path) -> None:
    src = _make(tmp_path / "a" / "t.json")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(PermissionError):
            move_into(src, locked)
    finally:
        locked.chmod(0o700)
    assert src.exists() and not list(locked.iterdir())


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than ``tmp_path`` (``/dev/shm``), or skip."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine: cannot test a move across filesystems")
    directory = Path(tempfile.mkdtemp(prefix="instrument-test-", dir="/dev/shm"))
    try:
        if os.stat(directory).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm and the test's tmp_path are on the same filesystem here")
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("direction", ["shm->tmp", "tmp->shm"])
def test_move_across_filesystems(tmp_path: Path, shm_dir: Path, direction: str) -> None:
    src_dir, dest_dir = (shm_dir, tmp_path) if direction == "shm->tmp" else (tmp_path, shm_dir)
    data = os.urandom(3_000_000)
    src = _make(src_dir / "t.pt.trace.json.gz", data)
    src.chmod(0o640)
    os.utime(src, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    dest = move_into(src, dest_dir, "renamed.pt.trace.json.gz")
    assert dest == dest_dir / "renamed.pt.trace.json.gz"
    assert dest.read_bytes() == data
    assert not src.exists()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert dest.stat().st_mtime_ns == 1_600_000_000_123_456_789
    assert _temp_files(dest_dir) == []


def test_move_across_filesystems_never_overwrites(tmp_path: Path, shm_dir: Path) -> None:
    src = _make(shm_dir / "t.json", b"new")
    existing = _make(tmp_path / "t.json", b"old")
    with pytest.raises(FileExistsError):
        move_into(src, tmp_path)
    assert src.read_bytes() == b"new" and existing.read_bytes() == b"old"
    assert _temp_files(tmp_path) == []


def test_move_across_filesystems_loses_a_race_safely(
    tmp_path: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer takes the name while we copy: our copy must not replace theirs."""
    src = _make(shm_dir / "t.json", b"ours")

    def copy_then_race(fsrc: BinaryIO, fdst: BinaryIO) -> None:
        shutil.copyfileobj(fsrc, fdst)
        (tmp_path / "t.json").write_bytes(b"theirs")

    monkeypatch.setattr(_finish, "_copy_bytes", copy_then_race)
    with pytest.raises(FileExistsError):
        move_into(src, tmp_path)
    assert src.read_bytes() == b"ours"
    assert (tmp_path / "t.json").read_bytes() == b"theirs"
    assert _temp_files(tmp_path) == []


def test_move_across_filesystems_short_copy_keeps_source(
    tmp_path: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _make(shm_dir / "t.json", b"0123456789" * 1000)

    def short_copy(fsrc: BinaryIO, fdst: BinaryIO) -> None:
        fdst.write(fsrc.read(100))

    monkeypatch.setattr(_finish, "_copy_bytes", short_copy)
    with pytest.raises(OSError) as info:
        move_into(src, tmp_path)
    assert info.value.errno == errno.EIO
    assert src.read_bytes() == b"0123456789" * 1000
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- wait_until_stable


class _Clock:
    """A stand-in for ``time`` inside ``_finish`` (``monotonic`` and ``sleep``) for the waits below.

    ``wait_until_stable`` is about time; on a real clock a loaded machine decides the result. Here
    time moves only when it sleeps, and what happens "meanwhile" to the real file is played by
    ``during(now)`` at each tick, so every result is exact.
    """

    def __init__(self, during: Callable[[float], None] = lambda now: None) -> None:
        self.now = 0.0
        self.during = during
        self.sleeps = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += max(seconds, 1e-6)  # a real sleep always takes a little: rounding cannot stall the loop
        self.during(self.now)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_finish, "time", fake)
    return fake


class _Grower:
    """Appends 100 bytes to ``path`` at every tick before ``until`` (a writer still flushing)."""

    def __init__(self, path: Path, until: float) -> None:
        self.path, self.until, self.last = path, until, 0.0

    def __call__(self, now: float) -> None:
        if now < self.until:
            with self.path.open("ab") as f:
                f.write(b"x" * 100)
            self.last = now


def test_growing_file_is_stable_only_after_growth_stops(tmp_path: Path, clock: _Clock) -> None:
    path = _make(tmp_path / "t.json", b"")
    clock.during = grower = _Grower(path, 0.6)
    assert wait_until_stable(path, quiet_s=0.3, timeout_s=10, poll_s=0.02)
    assert grower.last > 0.55  # the file grew until the writer stopped
    assert grower.last + 0.3 <= clock.now < grower.last + 0.3 + 0.05  # then quiet_s without a write, no more


def test_file_that_keeps_growing_times_out(tmp_path: Path, clock: _Clock) -> None:
    path = _make(tmp_path / "t.json", b"")
    clock.during = _Grower(path, 1.0)
    assert not wait_until_stable(path, quiet_s=0.3, timeout_s=0.5, poll_s=0.02)
    assert 0.5 <= clock.now < 0.5 + 0.05  # gave up at its timeout while the file still grew


def test_missing_or_vanishing_file_is_not_stable(tmp_path: Path, clock: _Clock) -> None:
    assert not wait_until_stable(tmp_path / "missing", quiet_s=5, timeout_s=30)
    assert clock.sleeps == 0  # at once, not after quiet_s

    path = _make(tmp_path / "t.json")
    clock.during = lambda now: path.unlink() if now >= 0.2 and path.exists() else None
    assert not wait_until_stable(path, quiet_s=5, timeout_s=30, poll_s=0.02)
    assert 0.2 <= clock.now < 0.2 + 0.05  # the first look after it vanished


def test_quiet_file_is_stable_after_quiet_s(tmp_path: Path, clock: _Clock) -> None:
    path = _make(tmp_path / "t.json")
    assert wait_until_stable(path, quiet_s=0.1, poll_s=0.02)
    assert 0.1 <= clock.now < 0.1 + 0.05


def test_quiet_file_is_stable_on_the_real_clock(tmp_path: Path) -> None:
    assert wait_until_stable(_make(tmp_path / "t.json"), quiet_s=0.1, poll_s=0.02)
