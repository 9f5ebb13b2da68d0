"""Moving files into ``save_path`` safely, and waiting for another process's files to settle.

* :func:`move_into` moves a file into a directory without ever overwriting, also across
  filesystems (copy to a temp name, fsync, exclusive link into place, then remove the source).
* :func:`wait_until_stable` waits for files another process writes to stop changing.

Used by relocation (engine traces, nsys reports) and the finish coordinator. Built on
:mod:`instrument._safe_files` (exclusive placing, folder fsync); standard library only.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from instrument._safe_files import fsync_folder, new_temp_beside, place_exclusively

__all__ = ["move_into", "wait_until_stable"]

logger = logging.getLogger(__name__)

_COPY_CHUNK = 1 << 20


def _copy_bytes(fsrc: BinaryIO, fdst: BinaryIO) -> None:
    """Copy an open source into an open temp file.

    A module-level seam: tests replace it to simulate a racing writer or a short copy in the
    cross-filesystem path of :func:`move_into`; nothing else does.
    """
    shutil.copyfileobj(fsrc, fdst, _COPY_CHUNK)


def _copy_across(src: Path, dest: Path, src_stat: os.stat_result) -> None:
    """Copy ``src`` to a temp name beside ``dest``, fsync it, place it exclusively, then drop ``src``.

    On any failure the temp file is removed and ``src`` stays where it was.
    """
    fd, tmp = new_temp_beside(dest, mode=0o600)
    placed = False
    try:
        with open(src, "rb") as fsrc, os.fdopen(fd, "wb") as fdst:
            _copy_bytes(fsrc, fdst)
            fdst.flush()
            os.fchmod(fdst.fileno(), stat.S_IMODE(src_stat.st_mode))
            os.utime(fdst.fileno(), ns=(src_stat.st_atime_ns, src_stat.st_mtime_ns))
            os.fsync(fdst.fileno())
            copied = os.fstat(fdst.fileno()).st_size
            now = os.fstat(fsrc.fileno()).st_size
        if not copied == now == src_stat.st_size:
            raise OSError(errno.EIO, f"copy is {copied} bytes, source {now} (was {src_stat.st_size})", str(src))
        place_exclusively(tmp, dest)
        placed = True
        fsync_folder(dest.parent)
        if os.stat(dest).st_size != src_stat.st_size:
            raise OSError(errno.EIO, "size changed after the copy was placed", str(dest))
        os.unlink(src)
    except BaseException:
        # Undo: once placed, the copy goes again (the source is still there); before, the temp file.
        leftover = dest if placed else tmp
        try:
            leftover.unlink(missing_ok=True)
        except OSError:
            logger.warning("could not remove %s after a failed move", leftover)
        raise


def move_into(src: str | os.PathLike[str], dest_dir: str | os.PathLike[str], name: str | None = None) -> Path:
    """Move the regular file ``src`` into ``dest_dir`` (as ``name``, default its own name); return the new path.

    Never overwrites: an existing destination raises ``FileExistsError``.  Across filesystems the
    file is copied to a temp name in ``dest_dir``, fsynced, placed exclusively, the directory
    fsynced, sizes compared, and only then is the source removed.  Raises ``OSError`` on failure,
    leaving the source in place and no temp file behind; ``ValueError`` for a ``name`` that is not a
    plain file name.  If ``src`` already is the destination it is returned unchanged.
    """
    source = Path(src)
    directory = Path(dest_dir)
    name = source.name if name is None else name
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"'name' must be a plain file name: {name!r}")
    dest = directory / name

    src_stat = os.lstat(source)
    if not stat.S_ISREG(src_stat.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(source))
    try:
        dest_stat: os.stat_result | None = os.lstat(dest)
    except FileNotFoundError:
        dest_stat = None
    if dest_stat is not None:
        if os.path.samestat(src_stat, dest_stat):
            if source.name == name and os.path.samestat(os.stat(source.parent), os.stat(directory)):
                return dest  # the very same directory entry: nothing to move
            # Two names for one file: an earlier move stopped between link and unlink. Finish it.
            os.unlink(source)
            return dest
        raise FileExistsError(errno.EEXIST, "destination exists; not overwriting", str(dest))

    try:
        place_exclusively(source, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _copy_across(source, dest, src_stat)
    return dest


# --------------------------------------------------------------------------- waiting for writers


def wait_until_stable(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    quiet_s: float = 0.5,
    timeout_s: float = 60.0,
    poll_s: float = 0.1,
    missing_ok: bool = False,
) -> bool:
    """Wait until the size and mtime of ``paths`` (one path or several) have not changed for ``quiet_s``.

    Returns ``True`` then (at once for no paths); ``False`` when ``timeout_s`` passes first or a file
    is missing or vanishes. With ``missing_ok`` a missing file is just one more state: its vanishing
    counts as a change, so the others are still waited for.
    """
    group = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not group:
        return True

    def snapshot() -> tuple[tuple[int, int, int] | None, ...] | None:
        seen: list[tuple[int, int, int] | None] = []
        for path in group:
            try:
                st = os.stat(path)
            except OSError:
                if not missing_ok:
                    return None
                seen.append(None)
                continue
            seen.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(seen)

    start = time.monotonic()
    deadline = start + timeout_s
    last: tuple[tuple[int, int, int] | None, ...] | None = None
    since = start
    while True:
        seen = snapshot()
        if seen is None:
            return False
        now = time.monotonic()
        if seen != last:
            last, since = seen, now
        elif now - since >= quiet_s:
            return True
        if now >= deadline:
            return False
        time.sleep(max(0.0, min(poll_s, deadline - now, since + quiet_s - now)))
