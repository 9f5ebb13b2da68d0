"""Writing a file whole or not at all, never through a symlink or into a FIFO (the PNG and the page)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from instrument._safe_files import write_atomically

__all__ = ["UnsafeDestinationError", "write_new_file"]


class UnsafeDestinationError(OSError):
    """The destination is a symlink, a directory, a FIFO or another special file: nothing was written."""


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
    refused with :class:`UnsafeDestinationError` (an ``OSError``), before writing and again just before
    the rename (a link planted meanwhile: the rename would replace it, not follow it, but the user
    asked for that path and should hear about it). A reader never sees half a file.
    """
    return write_atomically(path, data, mode=0o666, check=_check_destination)
