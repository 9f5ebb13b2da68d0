"""The user's finish hook: its environment, and one bounded ``/bin/sh -c CMD`` that never raises.

* :func:`hook_environment` builds the ``INSTRUMENT_PROFILE_*`` variables the hook reads (and the same
  values as ``VERL_PROFILE_*``, so a command moved over from verl keeps working).
* :func:`run_finish_hook` runs ``/bin/sh -c CMD`` once, in its own process group, with those
  values only in the environment (never spliced into ``CMD``), shows its output on stderr or in the log,
  and kills the whole group at the timeout, through a watchdog process that does so even when this
  process dies (:mod:`instrument.finish._reaper`).  It never raises: a broken hook must not break training.

Standard library only (plus ``instrument.*``).  See ``docs/finish-hook.md``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from instrument.finish._launch import (
    MAX_LOGGED_LINES,
    OUTPUTS,
    TAIL_LINES,
    HookStartError,
    OutputReader,
    OutputSink,
    start_hook,
)
from instrument.finish._progress import HookProgress
from instrument.finish._reaper import TERM_GRACE_S

__all__ = [
    "ENV_PREFIX",
    "VERL_ENV_PREFIX",
    "MAX_LOGGED_LINES",
    "OUTPUTS",
    "TAIL_LINES",
    "HookResult",
    "hook_environment",
    "run_finish_hook",
]

logger = logging.getLogger(__name__)

ENV_PREFIX = "INSTRUMENT_PROFILE_"
"""Prefix of the variables :func:`hook_environment` sets."""

VERL_ENV_PREFIX = "VERL_PROFILE_"
"""verl's prefix: :func:`hook_environment` sets each variable under it too, with the same value."""

_TERM_GRACE_S = TERM_GRACE_S  # between SIGTERM and SIGKILL of the hook's process group
_READER_GRACE_S = 2.0  # draining output still buffered in the pipe after the shell exited


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
    """The ``INSTRUMENT_PROFILE_*`` variables for the finish hook, each also as ``VERL_PROFILE_*``.

    ``SAVE_PATH`` and ``MANIFEST`` are made absolute (the hook may ``cd``); ``STEPS`` lists the
    profiled steps ascending, comma-separated (empty when none).  Values are passed as they are:
    the hook reads them as data, so they need no quoting.
    """
    env = {
        f"{ENV_PREFIX}SAVE_PATH": os.path.abspath(save_path),
        f"{ENV_PREFIX}TOOL": tool,
        f"{ENV_PREFIX}ROLE": role,
        f"{ENV_PREFIX}RANK": str(rank),
        f"{ENV_PREFIX}WORLD_SIZE": str(world_size),
        f"{ENV_PREFIX}PID": str(pid),
        f"{ENV_PREFIX}STEPS": ",".join(str(s) for s in sorted(set(steps))),
        f"{ENV_PREFIX}MANIFEST": os.path.abspath(manifest) if manifest else "",
    }
    # verl exports VERL_PROFILE_*: a finish_hook_cmd moved over from verl reads the same values there.
    return {**env, **{VERL_ENV_PREFIX + name[len(ENV_PREFIX) :]: value for name, value in env.items()}}


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
    :data:`~instrument.finish._progress.HOOK_PROGRESS_AFTER_S`) shows its elapsed time against ``timeout_s``.

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
        # happens to this process (see instrument/finish/_reaper.py and docs/finish-hook.md).
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
