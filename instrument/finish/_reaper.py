"""Run the finish hook under a watchdog that ends its process group by the deadline, even when the trainer dies.

A trainer that waits for its hook can kill the hook's group at the deadline, but two cases escape
that wait (issue 15): the shell exits and leaves background work in its group (H9), and the trainer
dies while the hook runs (H10: SIGTERM, SIGKILL, the OOM killer).  So the shell is started *by* a
small watchdog process, which owns the deadline, and there is no moment when it runs unguarded.

* As a script (``python -I -S _reaper.py DEADLINE CMD``) this module is the watchdog.  In its own
  session (signals sent to the trainer's process group miss it) it starts ``/bin/sh -c CMD`` in
  another new session with the trainer's exact environment, working directory and output pipe.
  It reports on its stdin (a socket to the trainer): ``pid N``, written by the forked shell itself
  just before its exec; ``running`` once the exec succeeded, or ``error MSG``; then ``exit RC``
  (``timeout`` first if it killed the shell).  ``pid`` is the handshake: without it the hook never
  ran and the trainer may run it itself; after it, whatever happens to the watchdog (the hook may
  kill it) ends this run and never starts another (issue 27).  Its signal handlers are in before
  the shell exists, so a hook that signals its parent meets them.  It kills the group (SIGTERM,
  SIGKILL :data:`TERM_GRACE_S` later)
  - at the deadline;
  - at once, when the socket reaches end-of-file while the shell runs: the trainer died (the kernel
    closes its end however it dies) and nobody is left to wait for the hook or read its output;
  - at once, on SIGTERM, SIGINT or SIGHUP to the watchdog.
  Once the shell has ended, what it left in its group runs until the deadline, whether the trainer
  lives or not (a hook may background its upload and exit).  The watchdog exits when the shell has
  ended and the group has no live member.
* Imported, it gives :mod:`instrument.finish._launch` (the trainer's side: ``start_hook``) the
  process-group helpers.

Not ``prctl(PR_SET_PDEATHSIG)``: it fires when the *thread* that forked the child ends, needs a
``preexec_fn`` (unsafe in a threaded program), and reaches only the shell, not its children.
Standard library only, nothing from ``instrument``: the watchdog runs without the package on its path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from types import FrameType

__all__ = ["SETTLE_S", "TERM_GRACE_S", "end_group", "group_alive", "group_exists"]

logger = logging.getLogger(__name__)

TERM_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL of the hook's process group."""
SETTLE_S = 5.0
"""After SIGKILL, how long to wait for the group to empty (a member in D state may take a while)."""

_POLL_S = 0.2  # how often the watchdog looks at the group and at stop requests
_SHELL_POLL_S = 0.05  # waiting for the shell where no pidfd says when it ends
_SCAN_EVERY_S = 1.0  # a /proc scan (zombie-only groups) costs more: at most this often
_EXIT_WAIT_S = 2.0  # for a watchdog whose group is already gone to exit
_REPORT_SLACK_S = 5.0  # beyond its own kill, how long the trainer still waits for the watchdog's report
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# --------------------------------------------------------------------------- process groups


def group_exists(pgid: int) -> bool:
    """Whether process group ``pgid`` has any member, zombies included (cheap: one syscall)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal (setuid): it exists
        return True
    return True


def _proc_stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member that is not a zombie.

    Killed orphans become zombies of the init process, and a container's init (or a training
    script running as PID 1) may reap them late or never; ``killpg(pgid, 0)`` counts zombies, so
    on Linux ``/proc`` is read instead.
    """
    if not group_exists(pgid):
        return False
    if not os.path.exists("/proc/self/stat"):
        return True
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                fields = _proc_stat(int(entry.name))
                if fields is not None and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                    return True
    return False


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not).  Asked only while its group exists: it is not reused."""
    if not os.path.exists("/proc/self/stat"):
        return group_exists(pid)
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_empty(pgid: int, timeout_s: float, reap: Callable[[], object]) -> bool:
    end = time.monotonic() + timeout_s
    while True:
        reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)


def end_group(pgid: int, *, reap: Callable[[], object] = lambda: None) -> bool:
    """SIGTERM group ``pgid``, SIGKILL what is left after :data:`TERM_GRACE_S`; True once no live member is left.

    ``reap`` runs while waiting: the shell's parent reaps it there, or it lingers as a zombie
    member.  Until the group's last member is gone the kernel does not reuse its number, so a signal
    cannot hit a stranger, except in the tiny window where the group empties between the check
    and the signal.
    """
    _signal_group(pgid, signal.SIGTERM)
    if _wait_empty(pgid, TERM_GRACE_S, reap):
        return True
    _signal_group(pgid, signal.SIGKILL)
    return _wait_empty(pgid, SETTLE_S, reap)


# --------------------------------------------------------------------------- the watchdog process

_stop_requested = False


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the loop wakes every _POLL_S anyway, and an exception raised here could
    # surface in the middle of the kill.
    global _stop_requested
    _stop_requested = True


def _say(control: int, line: str) -> None:
    # Python ignores SIGPIPE, so a trainer that is gone is an EPIPE here, and nothing to act on.
    with contextlib.suppress(OSError):
        os.write(control, line.encode("utf-8", "replace") + b"\n")


def _closed(control: int) -> bool:
    """Read what the trainer sent (nothing is expected); True at end-of-file.

    A peer that dies with unread data in its buffer makes the read fail with ECONNRESET: that is
    end-of-file too.
    """
    try:
        return not os.read(control, 512)
    except BlockingIOError:
        return False
    except OSError:
        return True


def _exec_environment() -> Mapping[bytes, bytes]:
    """This process's environment as exec'd: Python may have added ``LC_CTYPE`` since (PEP 538)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return os.environb
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` ends (Linux >= 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _report_pid(control: int) -> None:
    """In the forked shell, after its ``setsid`` and before its exec: ``pid N`` (its pid is its group's).

    Nothing of the hook runs before the trainer holds this line, and a failed write (the trainer is
    gone or gave up on the start) raises, so the shell is never exec'd.  Safe as a ``preexec_fn``:
    the watchdog has no other thread.
    """
    line = f"pid {os.getpid()}\n".encode()
    if os.write(control, line) != len(line):
        raise OSError("short write of the pid report")


def _run_watchdog(cmd: str, deadline: float, control: int) -> int:
    """Start the hook's shell, report on it, bound its group; the watchdog's exit status."""
    for sig in _STOP_SIGNALS:
        # Before the shell exists: a hook that signals its parent at once meets the handler, not
        # the default death (which the trainer could not tell from a watchdog that never ran).
        signal.signal(sig, _on_stop_signal)
    if select.select([control], [], [], 0)[0] and _closed(control):
        return 0  # the trainer died before the hook started: do not start it
    if _stop_requested:
        _say(control, "error its watchdog was stopped by a signal before the hook started")
        return 0
    try:
        shell = subprocess.Popen(
            ["/bin/sh", "-c", cmd],
            env=_exec_environment(),
            start_new_session=True,  # its own process group: the unit that is killed
            stdin=subprocess.DEVNULL,  # stdout and stderr: ours, the trainer's output pipe
            preexec_fn=lambda: _report_pid(control),  # noqa: PLW1509 - the watchdog has one thread
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        _say(control, f"error {type(exc).__name__}: {exc}")
        return 0
    _say(control, "running")
    try:
        # Let go of the output pipe (the trainer reads it to end-of-file) and of the working directory.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        os.chdir("/")
        _guard(shell, deadline, control)
    except BaseException:
        end_group(shell.pid, reap=shell.poll)  # whatever went wrong, the group does not outlive us
        raise
    return 0


def _guard(shell: subprocess.Popen[bytes], deadline: float, control: int) -> None:
    pgid, pidfd = shell.pid, _pidfd(shell.pid)
    reported = eof = False
    next_scan = 0.0
    while not _stop_requested:
        if not reported and shell.poll() is not None:
            _say(control, f"exit {shell.returncode}")
            reported = True
        now = time.monotonic()
        if reported:
            if not group_exists(pgid):
                return
            if now >= next_scan:  # leftovers may all be unreaped zombies by now
                if not group_alive(pgid):
                    return
                next_scan = now + _SCAN_EVERY_S
            if now >= deadline:
                break
        elif eof:
            break  # the trainer is gone: nobody waits for this hook any more
        elif now >= deadline:
            _say(control, "timeout")
            break
        waiting = [] if eof else [control]
        if pidfd is not None and not reported:
            waiting.append(pidfd)
        pause = _SHELL_POLL_S if pidfd is None and not reported else _POLL_S
        pause = max(0.0, min(pause, deadline - now))
        if not waiting:
            time.sleep(pause)
        elif control in select.select(waiting, [], [], pause)[0]:
            eof = _closed(control)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the kill runs to its end
    end_group(pgid, reap=shell.poll)
    if not reported and shell.poll() is not None:
        _say(control, f"exit {shell.returncode}")


def main(argv: list[str]) -> int:
    """``_reaper.py DEADLINE CMD``: DEADLINE on the ``time.monotonic()`` clock; the control socket is stdin."""
    try:
        deadline, cmd = float(argv[1]), argv[2]
    except (IndexError, ValueError):
        print("usage: _reaper.py DEADLINE CMD (the finish hook starts this, not a person)", file=sys.stderr)
        return 2
    # A copy of stdin: the forked shell's fd 0 is /dev/null by the time it reports its pid.  The
    # copy is close-on-exec, so the hook never holds the trainer's socket.
    return _run_watchdog(cmd, deadline, os.dup(sys.stdin.fileno()))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
