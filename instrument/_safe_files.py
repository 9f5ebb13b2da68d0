"""Writing and opening files safely: never through a planted symlink, never half-written, never overwriting.

The one place for what every writer of the SDK does (the manifest, the step timeline, the recorders'
traces and snapshots, rollout markers, the analyze's pictures, pages and layout export, the moves of
:mod:`instrument._files`):

* :func:`create_new` / :func:`new_file`: a new regular file, created exclusively (``O_EXCL``), never
  through a symlink (``O_NOFOLLOW``), not inherited by child processes (``O_CLOEXEC``);
* :func:`write_atomically`: a complete file replacing a name in one rename (temp name, write, fsync,
  rename, folder fsync), so a reader sees the old file or the new one, whole;
* :func:`place_exclusively` / :func:`publish_exclusively`: a finished file given its final name unless
  that name is taken, by a hard link or, where the filesystem has none, a rename over an ``O_EXCL``
  placeholder of our own;
* :func:`fsync_folder`: a folder's entries on disk, where the filesystem can fsync a folder;
* :func:`open_regular`: a file opened for reading only when it is a regular file (a FIFO never blocks);
* :class:`FolderTree`: folders created under a root, each opened relative to its parent, never through
  a symlink.

Standard library only: ``import instrument`` imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "NO_FOLDER_FSYNC",
    "NO_HARDLINKS",
    "FolderTree",
    "NotRegularFileError",
    "create_new",
    "fsync_folder",
    "fsynced",
    "kind_of",
    "new_file",
    "new_temp_beside",
    "open_regular",
    "place_exclusively",
    "publish_exclusively",
    "write_atomically",
]

NO_HARDLINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})
"""``link(2)`` fails with these where the filesystem has no hard links (FAT, some FUSE and network mounts)."""
NO_FOLDER_FSYNC = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF})
"""``fsync(2)`` of a folder fails with these where the filesystem does not support it: nothing to do then."""

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_ATTEMPTS = 100
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symlink"),
)

StrPath = str | os.PathLike[str]


# --------------------------------------------------------------------------- new files


def create_new(path: StrPath, *, mode: int, append: bool = False, dir_fd: int | None = None) -> int:
    """A write-only descriptor of the new regular file ``path``: ``mode`` before the umask, ``O_APPEND`` if ``append``.

    ``FileExistsError`` when the name exists in any form, a symlink included (never followed), so two
    writers never share a file and a planted link never redirects one.
    """
    return os.open(path, _NEW_FILE | (os.O_APPEND if append else 0), mode, dir_fd=dir_fd)


@contextlib.contextmanager
def new_file(path: StrPath, *, mode: int, dir_fd: int | None = None) -> Iterator[BinaryIO]:
    """``path`` made by :func:`create_new`, open for binary writing; removed again when the block raises."""
    fd = create_new(path, mode=mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path, dir_fd=dir_fd)
        raise


def new_temp_beside(target: Path, *, mode: int) -> tuple[int, Path]:
    """A new hidden ``.{name}.{random}.tmp`` beside ``target`` (:func:`create_new`): its descriptor and path."""
    for _ in range(_TEMP_ATTEMPTS):
        temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")  # under the 255-byte limit
        try:
            return create_new(temp, mode=mode), temp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")  # pragma: no cover - 100 random names taken


def write_atomically(path: StrPath, data: bytes, *, mode: int, check: Callable[[Path], None] | None = None) -> Path:
    """Replace ``path`` by a complete file of ``data``: a reader sees the old file or the new one, whole.

    The bytes go to a new temp file beside ``path`` (:func:`new_temp_beside`), are fsync'd and renamed
    over ``path`` (which replaces a symlink there, never follows it); then the folder is fsync'd.
    ``check(path)`` runs before the temp file is made and again just before the rename, to refuse what
    ``path`` is; whatever it or the writing raises leaves no temp file behind.
    """
    target = Path(path)
    if check is not None:
        check(target)
    fd, temp = new_temp_beside(target, mode=mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if check is not None:
            check(target)  # again: a link planted while we wrote is refused too
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_folder(target.parent)
    return target


# --------------------------------------------------------------------------- placing finished files


def fsynced(path: StrPath) -> Path:
    """``path``, its content on disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    return Path(path)


def fsync_folder(folder: StrPath) -> None:
    """Put ``folder``'s entries (a name just placed) on disk; a no-op where the filesystem cannot fsync a folder."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in NO_FOLDER_FSYNC:
            raise
    finally:
        os.close(fd)


def place_exclusively(src: StrPath, dest: StrPath) -> None:
    """Give ``src``'s file the name ``dest`` and drop the name ``src``; never replace an existing ``dest``.

    ``os.rename`` silently replaces an existing destination, and checking first leaves a race.
    ``os.link`` fails with EEXIST atomically, so two writers (or a mover and a writer) never clobber
    each other; the name ``src`` is removed only once the link exists.  Where the filesystem has no
    hard links (:data:`NO_HARDLINKS`), an ``O_EXCL`` placeholder reserves ``dest`` and ``rename``
    replaces only that placeholder, which is ours.  ``FileExistsError`` when ``dest`` exists; any
    ``OSError`` (EXDEV across filesystems) leaves ``src`` in place and no ``dest`` made.
    """
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in NO_HARDLINKS:
            raise
    else:
        try:
            os.unlink(src)
        except OSError:
            os.unlink(dest)  # undo: on failure the file is only where it was
            raise
        return
    os.close(create_new(dest, mode=0o600))
    try:
        os.rename(src, dest)
    except BaseException:
        os.unlink(dest)
        raise


def publish_exclusively(src: StrPath, dest: StrPath) -> bool:
    """Publish the complete, fsync'd file ``src`` as ``dest`` unless that name exists; fsync the folder.

    :func:`place_exclusively`: ``False`` when ``dest`` exists (``src`` left as it was), ``True`` once
    ``src``'s file is ``dest`` (the name ``src`` is gone).
    """
    try:
        place_exclusively(src, dest)
    except FileExistsError:
        return False
    fsync_folder(os.path.dirname(os.path.abspath(dest)))
    return True


# --------------------------------------------------------------------------- reading


class NotRegularFileError(OSError):
    """A directory, FIFO, socket or device where a regular file was to be read (EINVAL); ``mode`` says which."""

    mode: int = 0


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a FIFO (named pipe)``)."""
    return next((words for test, words in _KINDS if test(mode)), "a special file")


def open_regular(path: StrPath, *, follow_symlinks: bool) -> BinaryIO:
    """``path`` opened for binary reading, only when it is a regular file (checked on what was opened).

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer; the check then
    refuses it with :class:`NotRegularFileError`. Without ``follow_symlinks`` a symlink is refused
    (``ELOOP``). Any other ``OSError`` when it cannot be opened.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            error = NotRegularFileError(errno.EINVAL, f"not a regular file: {kind_of(mode)}", os.fspath(path))
            error.mode = mode
            raise error
        os.set_blocking(fd, True)  # a regular file never blocks; some network filesystems honour the flag
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------- folders


class FolderTree:
    """Folders under ``root``, each created here and opened relative to its parent without following symlinks.

    ``mkdir`` is exclusive, so a name someone else made meanwhile (maybe a symlink) is refused
    (``FileExistsError``), never written through. At most ``max_open`` (at least 2) descriptors stay
    open, as a tree can have thousands of folders; a folder opened again is opened relative to its
    parent with ``O_NOFOLLOW``, so a folder swapped for a symlink meanwhile is refused, never followed.
    """

    def __init__(self, root: StrPath, *, max_open: int = 32, mode: int = 0o755) -> None:
        self._fds: OrderedDict[str, int] = OrderedDict({"": os.open(root, _FOLDER)})
        self._made: set[str] = set()
        self._max_open = max(2, max_open)  # the root and the folder just opened
        self._mode = mode

    def folder(self, relative: str) -> int:
        """The descriptor of ``relative`` (``a/b/c``), creating what is missing; never follows a link.

        Valid until the next call (it may be closed then to keep few descriptors open).
        """
        if relative in self._fds:
            self._fds.move_to_end(relative)
            return self._fds[relative]
        parent, _, part = relative.rpartition("/")
        parent_fd = self.folder(parent)
        if relative not in self._made:
            os.mkdir(part, self._mode, dir_fd=parent_fd)
            self._made.add(relative)
        fd = os.open(part, _FOLDER, dir_fd=parent_fd)
        self._fds[relative] = fd
        while len(self._fds) > self._max_open:
            oldest = next(key for key in self._fds if key)  # never the root: every path starts there
            os.close(self._fds.pop(oldest))
        return fd

    def close(self) -> None:
        """Close every descriptor held."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
