"""Tests for ``instrument._files``: moves that never overwrite (also across filesystems), waits for writers."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from instrument import _files
from instrument._files import move_into, wait_until_stable

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


def test_move_fileses_an_interrupted_move(tmp_path: Path) -> None:
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

    monkeypatch.setattr(_files, "_copy_bytes", copy_then_race)
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

    monkeypatch.setattr(_files, "_copy_bytes", short_copy)
    with pytest.raises(OSError) as info:
        move_into(src, tmp_path)
    assert info.value.errno == errno.EIO
    assert src.read_bytes() == b"0123456789" * 1000
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- wait_until_stable


class _Clock:
    """A stand-in for ``time`` inside ``_files`` (``monotonic`` and ``sleep``) for the waits below.

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
    monkeypatch.setattr(_files, "time", fake)
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
