"""Tests for ``instrument._safe_files``: exclusive creates, atomic writes, exclusive placing, regular-file opens.

A filesystem without hard links is simulated by making ``os.link`` raise EPERM (as on FAT, some FUSE
and network mounts); one that cannot fsync a folder by making ``os.fsync`` of a folder raise EINVAL.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from instrument import _safe_files
from instrument._safe_files import (
    FolderTree,
    NotRegularFileError,
    create_new,
    fsync_folder,
    new_file,
    open_regular,
    place_exclusively,
    publish_exclusively,
    write_atomically,
)
from instrument.recorders import TraceSpec
from instrument.recorders._publish import private_folder, publish_as


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_hard_links(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """``os.link`` fails as on a filesystem without hard links (EPERM); the calls are listed."""
    calls: list[tuple[Any, Any]] = []

    def refuse(src: Any, dst: Any, **_kwargs: Any) -> None:
        calls.append((src, dst))
        raise OSError(errno.EPERM, "Operation not permitted (simulated: no hard links here)")

    monkeypatch.setattr(os, "link", refuse)
    return calls


def _folder_fsync_raises(monkeypatch: pytest.MonkeyPatch, code: int) -> list[int]:
    """``os.fsync`` of a folder raises ``code``; of a file it works. Returns the folder descriptors tried."""
    real = os.fsync
    tried: list[int] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            tried.append(fd)
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return tried


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --------------------------------------------------------------------------- new files


def test_create_new_never_opens_an_existing_name_or_follows_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("victim", "link", "dangling"):
        with pytest.raises(FileExistsError):
            create_new(tmp_path / name, mode=0o644)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "nowhere").exists()  # the dangling link's target was not created either


def test_create_new_keeps_the_mode_asked_for_and_appends(tmp_path: Path, umask_022: None) -> None:
    fd = create_new(tmp_path / "log", mode=0o644, append=True)
    try:
        os.write(fd, b"a")
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"b")  # O_APPEND: still at the end
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"ab"
    assert stat.S_IMODE(os.stat(tmp_path / "log").st_mode) == 0o644
    os.close(create_new(tmp_path / "open", mode=0o666))
    assert stat.S_IMODE(os.stat(tmp_path / "open").st_mode) == 0o644  # the umask still applies


def test_new_file_is_removed_when_writing_fails_and_kept_when_it_works(tmp_path: Path) -> None:
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="disk full"), new_file("half", mode=0o644, dir_fd=folder) as out:
            out.write(b"half")
            raise OSError(errno.ENOSPC, "disk full")
        with new_file("whole", mode=0o644, dir_fd=folder) as out:
            out.write(b"whole")
    finally:
        os.close(folder)
    assert _names(tmp_path) == ["whole"]
    assert (tmp_path / "whole").read_bytes() == b"whole"


# --------------------------------------------------------------------------- atomic writes


def test_write_atomically_replaces_a_file_by_a_new_one_whole(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "marker.json"
    target.write_bytes(b"old" * 1000)
    os.link(target, tmp_path / "other-name")
    old_inode = target.stat().st_ino
    write_atomically(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != old_inode  # renamed over the name, not written through it
    assert (tmp_path / "other-name").read_bytes() == b"old" * 1000
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert _names(tmp_path) == ["marker.json", "other-name"]  # no temp left


def test_write_atomically_replaces_a_planted_symlink_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out").symlink_to(victim)
    write_atomically(tmp_path / "out", b"mine", mode=0o644)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"mine"


def test_a_check_that_refuses_leaves_the_name_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    target.write_text("old")
    seen: list[int] = []

    def refuse_second(path: Path) -> None:  # the rename's check: something was planted meanwhile
        seen.append(1)
        if len(seen) == 2:
            raise OSError(errno.EEXIST, f"{path} changed")

    with pytest.raises(OSError, match="changed"):
        write_atomically(target, b"new", mode=0o666, check=refuse_second)
    assert target.read_text() == "old" and _names(tmp_path) == ["page.html"]


def test_a_full_disk_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a.png"
    target.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_atomically(target, b"new", mode=0o666)
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["a.png"]


def test_write_atomically_tolerates_a_folder_that_cannot_be_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = _folder_fsync_raises(monkeypatch, errno.EINVAL)
    write_atomically(tmp_path / "a", b"data", mode=0o644)
    assert tried and (tmp_path / "a").read_bytes() == b"data"


# --------------------------------------------------------------------------- folder fsync


@pytest.mark.parametrize("code", sorted(_safe_files.NO_FOLDER_FSYNC))
def test_a_folder_fsync_the_filesystem_does_not_support_is_tolerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    tried = _folder_fsync_raises(monkeypatch, code)
    fsync_folder(tmp_path)
    assert len(tried) == 1


def test_a_folder_fsync_that_really_fails_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder_fsync_raises(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as caught:
        fsync_folder(tmp_path)
    assert caught.value.errno == errno.EIO


# --------------------------------------------------------------------------- placing exclusively


@pytest.fixture(params=["hard links", "no hard links"])
def links(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each placing test on a filesystem with hard links and on one without (``os.link`` raising EPERM)."""
    if request.param == "no hard links":
        request.getfixturevalue("no_hard_links")
    return str(request.param)


def test_place_exclusively_moves_the_file_and_never_replaces_a_name(tmp_path: Path, links: str) -> None:
    src, dest = tmp_path / "src.tmp", tmp_path / "dest"
    src.write_bytes(b"new")
    os.chmod(src, 0o640)
    place_exclusively(src, dest)
    assert dest.read_bytes() == b"new" and stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert _names(tmp_path) == ["dest"]

    src.write_bytes(b"late")
    with pytest.raises(FileExistsError):
        place_exclusively(src, dest)
    assert dest.read_bytes() == b"new" and src.read_bytes() == b"late"  # both untouched


def test_place_exclusively_never_replaces_a_planted_symlink(tmp_path: Path, links: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "dest").symlink_to(victim)
    (tmp_path / "src").write_text("mine")
    with pytest.raises(FileExistsError):
        place_exclusively(tmp_path / "src", tmp_path / "dest")
    assert victim.read_text() == "precious" and (tmp_path / "dest").is_symlink()
    assert (tmp_path / "src").read_text() == "mine"


def test_without_hard_links_a_failed_rename_removes_only_its_placeholder(
    tmp_path: Path, no_hard_links: list[tuple[Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_text("mine")

    def rename(_src: Any, _dest: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output"):
        place_exclusively(src, dest)
    assert no_hard_links and _names(tmp_path) == ["src"] and src.read_text() == "mine"


def test_publish_exclusively_fsyncs_the_folder_and_says_when_the_name_is_taken(
    tmp_path: Path, links: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = _folder_fsync_raises(monkeypatch, errno.EINVAL)  # a filesystem without folder fsync, too
    (tmp_path / "a.tmp").write_text("first")
    assert publish_exclusively(tmp_path / "a.tmp", tmp_path / "final")
    assert len(tried) == 1
    (tmp_path / "b.tmp").write_text("second")
    assert not publish_exclusively(tmp_path / "b.tmp", tmp_path / "final")
    assert (tmp_path / "final").read_text() == "first" and (tmp_path / "b.tmp").read_text() == "second"


def test_concurrent_publishers_of_one_name_never_clobber_each_other(tmp_path: Path, links: str) -> None:
    """Sixteen writers race for one name: exactly one wins, its bytes whole; the others keep their files."""
    sources = [tmp_path / f"writer{n}.tmp" for n in range(16)]
    for n, source in enumerate(sources):
        source.write_bytes(bytes([n]) * 4096)
    final = tmp_path / "final"
    start = threading.Barrier(len(sources))
    won: list[bool] = [False] * len(sources)

    def race(n: int) -> None:
        start.wait()
        won[n] = publish_exclusively(sources[n], final)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(len(sources))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert won.count(True) == 1
    winner = won.index(True)
    assert final.read_bytes() == bytes([winner]) * 4096
    assert _names(tmp_path) == sorted(["final", *(s.name for s in sources if s != sources[winner])])


def test_a_recorder_publishes_where_the_filesystem_has_no_hard_links(
    tmp_path: Path, no_hard_links: list[tuple[Any, Any]], umask_022: None
) -> None:
    """The recorders' publish path (``publish_as``, used for traces, memory timelines and snapshots)
    falls back to a rename over an exclusive placeholder where ``os.link`` fails with EPERM."""
    spec = TraceSpec(
        role="actor", stage="update_actor", step=1, rank=0, world_size=1, save_path=str(tmp_path), contents=("cpu",)
    )
    scratch = private_folder(str(tmp_path))
    source = scratch / "trace.tmp"
    with new_file(source, mode=0o666) as out:
        out.write(b'{"traceEvents": []}')
    final = publish_as(spec, ".pt.trace.json", lambda _final: source)
    assert no_hard_links  # the hard link was tried first
    assert final.read_bytes() == b'{"traceEvents": []}'
    assert stat.S_IMODE(final.stat().st_mode) == 0o644  # the file's own mode, not the placeholder's
    assert list(scratch.iterdir()) == []  # moved, not copied
    scratch.rmdir()
    assert _names(tmp_path) == [final.name]


# --------------------------------------------------------------------------- reading


def _in_thread(call: Callable[[], Any]) -> BaseException | None:
    """``call()``'s exception, run in a thread so a blocking open fails the test instead of hanging it."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test thread
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)  # a hang guard only
    assert not thread.is_alive(), "opening blocked"
    return caught[0] if caught else None


def test_open_regular_refuses_a_fifo_without_blocking_and_a_directory(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    caught = _in_thread(lambda: open_regular(tmp_path / "pipe", follow_symlinks=True))
    assert isinstance(caught, NotRegularFileError) and caught.errno == errno.EINVAL
    assert stat.S_ISFIFO(caught.mode) and "a FIFO (named pipe)" in str(caught)
    with pytest.raises(NotRegularFileError, match="a directory"):
        open_regular(tmp_path, follow_symlinks=True)


def test_open_regular_follows_a_symlink_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"bytes")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with open_regular(tmp_path / "link", follow_symlinks=True) as handle:
        assert handle.read() == b"bytes"
    with pytest.raises(OSError) as caught:
        open_regular(tmp_path / "link", follow_symlinks=False)
    assert caught.value.errno == errno.ELOOP


# --------------------------------------------------------------------------- folders


def test_folder_tree_never_creates_through_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").symlink_to(victim)
    tree = FolderTree(out)
    try:
        with pytest.raises(FileExistsError):
            tree.folder("a/b")
        fd = tree.folder("c/d/e")
        os.close(create_new("file", mode=0o644, dir_fd=fd))
    finally:
        tree.close()
    assert list(victim.iterdir()) == []
    assert (out / "c" / "d" / "e" / "file").is_file()


def test_folder_tree_with_two_descriptors_refuses_a_folder_swapped_for_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    tree = FolderTree(out, max_open=2)
    try:
        tree.folder("a")
        tree.folder("b")  # "a" is closed now: it will be opened again by name
        (out / "a").rmdir()
        (out / "a").symlink_to(victim)
        with pytest.raises(OSError) as caught:
            tree.folder("a")
        assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    finally:
        tree.close()
    assert list(victim.iterdir()) == []
