"""The end of a profiling run: relocate result files, then run the user's finish hook.

* :func:`hook_environment` builds the ``INSTRUMENT_PROFILE_*`` variables the hook reads.
* :func:`run_finish_hook` runs ``/bin/sh -c CMD`` once, in its own process group, with those
  values only in the environment (never spliced into ``CMD``), shows its output on stderr or in the log,
  and kills the whole group at the timeout, through a watchdog process that does so even when this
  process dies (:mod:`instrument._reaper`).  It never raises: a broken hook must not break training.
* :func:`move_into` moves a file into a directory without ever overwriting, also across
  filesystems (copy to a temp name, fsync, exclusive link into place, then remove the source).
* :func:`wait_until_stable` waits for files another process writes to stop changing.

Standard library only (plus ``instrument.*``).  See ``docs/finish-hook.md``.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from instrument._hookproc import (
    _MAX_LINE_BYTES,  # noqa: F401 - re-exported: tests read the line cut here
    MAX_LOGGED_LINES,
    OUTPUTS,
    TAIL_LINES,
    HookStartError,
    OutputReader,
    OutputSink,
    start_hook,
)
from instrument._progress import HookProgress
from instrument._reaper import TERM_GRACE_S

__all__ = [
    "ENV_PREFIX",
    "MAX_LOGGED_LINES",
    "OUTPUTS",
    "TAIL_LINES",
    "HookResult",
    "hook_environment",
    "move_into",
    "run_finish_hook",
    "wait_until_stable",
]

logger = logging.getLogger("instrument")

ENV_PREFIX = "INSTRUMENT_PROFILE_"
"""Prefix of every variable :func:`hook_environment` sets."""

_TERM_GRACE_S = TERM_GRACE_S  # between SIGTERM and SIGKILL of the hook's process group
_READER_GRACE_S = 2.0  # draining output still buffered in the pipe after the shell exited
_COPY_CHUNK = 1 << 20
# link(2) fails with these where the filesystem has no hard links (FAT, some FUSE and network mounts).
_NO_HARDLINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})
# fsync(2) on a directory fails with these where the filesystem does not support it; nothing to do then.
_NO_DIR_FSYNC = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF})


# --------------------------------------------------------------------------- environment


def hook_environment(
    *,
    save_path: str,
    tool: str,
    role: str,
    rank: int,
    world_size: int,
    pid: int,
    steps: Sequence[int],
    manifest: str,
) -> dict[str, str]:
    """The ``INSTRUMENT_PROFILE_*`` variables for the finish hook.

    ``SAVE_PATH`` and ``MANIFEST`` are made absolute (the hook may ``cd``); ``STEPS`` lists the
    profiled steps ascending, comma-separated (empty when none).  Values are passed as they are:
    the hook reads them as data, so they need no quoting.
    """
    return {
        f"{ENV_PREFIX}SAVE_PATH": os.path.abspath(save_path),
        f"{ENV_PREFIX}TOOL": tool,
        f"{ENV_PREFIX}ROLE": role,
        f"{ENV_PREFIX}RANK": str(rank),
        f"{ENV_PREFIX}WORLD_SIZE": str(world_size),
        f"{ENV_PREFIX}PID": str(pid),
        f"{ENV_PREFIX}STEPS": ",".join(str(s) for s in sorted(set(steps))),
        f"{ENV_PREFIX}MANIFEST": os.path.abspath(manifest) if manifest else "",
    }


# --------------------------------------------------------------------------- running the hook


@dataclass(frozen=True)
class HookResult:
    """How a finish hook run ended."""

    returncode: int | None
    """The shell's exit status (negative: killed by that signal, not at the timeout); ``None`` if it
    never ran, was killed at the timeout, or its status is unknown (see :attr:`error`)."""
    timed_out: bool
    duration_s: float
    tail: tuple[str, ...]
    """The last lines of output (at most :data:`TAIL_LINES`)."""
    error: str | None
    """Why the hook could not run, or why its end is unknown, if so."""

    @property
    def ok(self) -> bool:
        """True when the hook ran to the end and exited 0."""
        return self.error is None and not self.timed_out and self.returncode == 0


def run_finish_hook(
    cmd: str,
    *,
    env: Mapping[str, str],
    timeout_s: float,
    log_prefix: str,
    output: str = "log",
    rank: int | None = None,
    progress_after_s: float | None = None,
) -> HookResult:
    """Run ``/bin/sh -c cmd`` once with ``env`` added to this process's environment; never raises.

    The hook runs in its own process group with stdin from ``/dev/null``.  Its output (stdout and
    stderr together, the first :data:`MAX_LOGGED_LINES` lines) goes, with ``output="stderr"``, to
    this process's stderr as ``"[hook rank {rank}] {line}"``, followed by one line with its exit
    status and duration; with ``output="log"`` to the ``instrument.finish_hook`` logger at INFO as
    ``"{log_prefix} {line}"``.  Failures are one WARNING in both cases.  On a terminal, a hook
    running longer than ``progress_after_s`` (default
    :data:`~instrument._progress.HOOK_PROGRESS_AFTER_S`) shows its elapsed time against ``timeout_s``.

    At ``timeout_s`` the whole group gets SIGTERM, then SIGKILL.  It returns when the shell ends;
    what the shell left running in its group is killed at ``timeout_s``, also if this process has
    ended by then, and everything at once if this process dies while the shell still runs.
    """
    start = time.monotonic()
    try:
        label = "[hook]" if rank is None else f"[hook rank {rank}]"
        if output not in OUTPUTS:
            raise ValueError(f"'output' must be one of {', '.join(map(repr, OUTPUTS))}: {output!r}")
        progress = HookProgress(f"{label} running", timeout_s, sys.stderr, after_s=progress_after_s)
        sink = OutputSink(output, label if output == "stderr" else log_prefix, progress)
        return _run(cmd, env, timeout_s, log_prefix, start, sink, progress)
    except Exception as exc:
        logger.warning("%s finish hook failed: %s: %s", log_prefix, type(exc).__name__, exc)
        return HookResult(None, False, time.monotonic() - start, (), f"{type(exc).__name__}: {exc}")


def _run(
    cmd: str,
    env: Mapping[str, str],
    timeout_s: float,
    log_prefix: str,
    start: float,
    sink: OutputSink,
    progress: HookProgress,
) -> HookResult:
    logger.info("%s running finish hook (timeout %g s): %s", log_prefix, timeout_s, cmd)
    deadline = start + timeout_s
    read_fd, write_fd = os.pipe()  # both close-on-exec: the hook gets the write end as stdout and stderr only
    reader = OutputReader(open(read_fd, "rb", buffering=0), sink)  # noqa: SIM115 - the reader closes it
    thread = threading.Thread(target=reader.run, name="instrument-finish-hook-output", daemon=True)
    try:
        thread.start()
        # The shell is started by a watchdog process that ends its group by the deadline whatever
        # happens to this process (see instrument/_reaper.py and docs/finish-hook.md).
        hook = start_hook(cmd, {**os.environ, **env}, deadline, write_fd, log_prefix)
    except HookStartError as exc:
        error = str(exc)
        _status(sink, f"could not start: {error}")
        logger.warning("%s finish hook could not start: %s", log_prefix, error)
        return HookResult(None, False, time.monotonic() - start, (), error)
    finally:
        os.close(write_fd)  # from now on only the hook holds it: the reader sees end-of-file when it is done
    progress.start()
    try:
        end = hook.wait()
    except BaseException:
        # Interrupted (KeyboardInterrupt): leave no hook process behind.
        progress.stop()
        hook.abandon()
        raise
    # What the shell left in its group may run until the deadline, no longer: a hook may background
    # its upload and exit.
    hook.release()
    timed_out, returncode = end.timed_out, end.returncode

    # A process the hook put in another group or session may still hold the pipe open: give the
    # reader a moment to drain what is buffered, then abandon it (a daemon thread) rather than hang.
    thread.join(_READER_GRACE_S)
    progress.stop()  # the display goes before the last lines, so they stay on the screen
    if thread.is_alive():
        logger.warning(
            "%s a background process of the finish hook still holds its output open; not waiting for it "
            "(if still in the hook's process group, it is killed at the hook's deadline)",
            log_prefix,
        )
    tail, not_shown = reader.finish()
    duration = time.monotonic() - start
    if not_shown:
        sink.line(f"... {not_shown} more output lines not shown")

    shown_tail = "".join(f"\n    {line}" for line in tail) or " (no output)"
    if timed_out:
        _status(sink, f"timed out after {timeout_s:g} s: killed")
        logger.warning(
            "%s finish hook timed out after %g s and was killed (SIGTERM, then SIGKILL to its group); last output:%s",
            log_prefix,
            timeout_s,
            shown_tail,
        )
    elif end.error is not None:
        _status(sink, f"{end.error} after {duration:.1f} s")
        logger.warning("%s finish hook: %s; last output:%s", log_prefix, end.error, shown_tail)
    elif returncode is not None and returncode != 0:
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        end_word = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        _status(sink, f"{end_word} after {duration:.1f} s")
        logger.warning("%s finish hook %s after %.1f s; last output:%s", log_prefix, how, duration, shown_tail)
    else:
        _status(sink, f"exit 0 after {duration:.1f} s")
        logger.info("%s finish hook succeeded in %.1f s", log_prefix, duration)
    return HookResult(returncode, timed_out, duration, tail, end.error)


def _status(sink: OutputSink, text: str) -> None:
    """The hook's last line on stderr (exit status and duration); the log has its own wording."""
    if sink.output == "stderr":
        sink.line(text)


# --------------------------------------------------------------------------- relocating files


def _copy_bytes(fsrc: BinaryIO, fdst: BinaryIO) -> None:
    """Copy an open source into an open temp file.

    A module-level seam: tests replace it to simulate a racing writer or a short copy in the
    cross-filesystem path of :func:`move_into`; nothing else does.
    """
    shutil.copyfileobj(fsrc, fdst, _COPY_CHUNK)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def _place_exclusively(src: Path, dest: Path) -> None:
    """Give ``src``'s file the name ``dest`` and drop the name ``src``; never replace an existing ``dest``.

    ``os.rename`` silently replaces an existing destination, and checking first leaves a race.
    ``os.link`` fails with EEXIST atomically, so two movers (or a mover and a writer) can never
    clobber each other; the source name is removed only once the link exists.  Where the filesystem
    has no hard links, an ``O_EXCL`` placeholder reserves ``dest`` and ``rename`` replaces only that
    placeholder, which is ours.  Raises ``OSError`` (EXDEV across filesystems) with ``src`` in place.
    """
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_HARDLINKS:
            raise
    else:
        try:
            os.unlink(src)
        except OSError:
            os.unlink(dest)  # undo: on failure the file is only where it was
            raise
        return
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    try:
        os.rename(src, dest)
    except BaseException:
        os.unlink(dest)
        raise


def _copy_across(src: Path, dest: Path, src_stat: os.stat_result) -> None:
    """Copy ``src`` to a temp name beside ``dest``, fsync it, place it exclusively, then drop ``src``.

    On any failure the temp file is removed and ``src`` stays where it was.
    """
    stem = dest.name[:200]  # the temp name must stay under the 255-byte name limit
    tmp = dest.parent / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
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
        _place_exclusively(tmp, dest)
        placed = True
        _fsync_dir(dest.parent)
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
        _place_exclusively(source, dest)
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
