"""Writing a file whole or not at all, never through a symlink or into a FIFO (the PNG and the page)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["UnsafeDestinationError", "write_new_file"]


class UnsafeDestinationError(OSError):
    """The destination is a symlink, a directory, a FIFO or another special file: nothing was written."""


_TEMP_ATTEMPTS = 100


def _check_destination(target: Path) -> None:
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"))
    kind = next((words for test, words in kinds if test(mode)), "a special file")
    raise UnsafeDestinationError(f"{target} is {kind}, not a regular file: refusing to write there")


def write_new_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all, never through a symlink.

    The bytes go to a new file beside ``path`` (created exclusively, not following links), which is
    renamed over ``path``; an existing regular file is replaced, a symlink or a non-regular file is
    refused with :class:`UnsafeDestinationError` (an ``OSError``). A reader never sees half a file.
    """
    target = Path(path)
    _check_destination(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_ATTEMPTS):
        temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 random names taken
        raise FileExistsError(f"no free temporary name beside {target}")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        # Checked again: a link planted while we wrote is refused (rename would replace the link, not
        # follow it, but the user asked for that path and should hear about it).
        _check_destination(target)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return target
