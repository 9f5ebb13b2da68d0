"""The trainer's side of the finish hook: start ``/bin/sh -c CMD`` under the watchdog, read its reports,
and show its output (:class:`OutputReader` into an :class:`OutputSink`: stderr or the log).

The watchdog itself is :mod:`instrument.finish._reaper` run as a script (it must run without the package);
see its docstring for the whole design.  Where no watchdog can run (no usable interpreter; warned
once) the shell is started directly and guarded by a thread only while the trainer lives.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

from instrument.finish import _reaper
from instrument.finish._progress import HookProgress
from instrument.finish._reaper import (
    _EXIT_WAIT_S,
    _POLL_S,
    _REPORT_SLACK_S,
    _SHELL_POLL_S,
    SETTLE_S,
    TERM_GRACE_S,
    _running,
    end_group,
    group_exists,
)

__all__ = [
    "INTERPRETER",
    "MAX_LOGGED_LINES",
    "OUTPUTS",
    "TAIL_LINES",
    "HookEnd",
    "HookStartError",
    "OutputReader",
    "OutputSink",
    "decode",
    "start_hook",
]

logger = logging.getLogger(__name__)

INTERPRETER: str | None = None
"""The Python that runs the watchdog; ``None``: ``sys.executable``.  Tests point it elsewhere."""


class HookStartError(Exception):
    """The hook's shell could not start (no ``/bin/sh``, a NUL byte, no processes left)."""


class _NoWatchdogError(Exception):
    """The watchdog ended without a ``pid`` report (the hook never ran): the shell is started directly."""


@dataclass(frozen=True)
class HookEnd:
    """How the shell ended, as far as the trainer can tell."""

    returncode: int | None
    timed_out: bool
    error: str | None = None


_warned: set[str] = set()
_live: set[_Watched] = set()  # whose control sockets a forked child must close


def _warn_once(kind: str, message: str, *args: object) -> None:
    if kind in _warned:
        logger.debug(message, *args)
        return
    _warned.add(kind)
    logger.warning(message, *args)


def start_hook(cmd: str, env: Mapping[str, str], deadline: float, output: int, log_prefix: str) -> _Watched | _Direct:
    """Start ``/bin/sh -c cmd`` with ``env``, stdin from /dev/null, stdout and stderr on fd ``output``.

    Under a watchdog where one can run, else directly.  Raises :class:`HookStartError`; the
    handle's ``wait`` (bounded), ``abandon`` and ``release`` never raise.
    """
    python = INTERPRETER or sys.executable
    script = os.path.abspath(_reaper.__file__)
    # A frozen app's executable is the app itself; a zipped package has no script file to run.
    if python and not getattr(sys, "frozen", False) and os.path.isfile(script):
        try:
            return _Watched.start([python, "-I", "-S", script, repr(deadline), cmd], env, deadline, output, log_prefix)
        except _NoWatchdogError as exc:
            _warn_once(
                "start",
                "%s could not start the finish hook's watchdog (%s); running the hook without it: its "
                "processes are bounded by timeout_s only while this process lives",
                log_prefix,
                exc,
            )
    else:
        _warn_once("start", "%s no Python to run the finish hook's watchdog; running the hook without it", log_prefix)
    return _Direct.start(cmd, env, deadline, output)


class _Watched:
    """The shell under a watchdog, which reports on it over a socket."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, deadline: float, prefix: str) -> None:
        self._proc, self._deadline, self._prefix = proc, deadline, prefix
        self._sock: socket.socket | None = sock
        self._pending = b""
        self._eof = False  # every holder of the watchdog's end has closed it
        self.pid = 0  # the shell's, which is also its process group id

    @classmethod
    def start(cls, command: list[str], env: Mapping[str, str], deadline: float, output: int, prefix: str) -> _Watched:
        ours, theirs = socket.socketpair()  # both ends close-on-exec: only the watchdog gets one, as stdin
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=theirs.fileno(),
                stdout=output,  # until the shell runs: an interpreter's complaint shows in the hook's log
                stderr=output,
                start_new_session=True,  # out of reach of signals sent to the trainer's process group
            )
        except (ValueError, TypeError) as exc:  # a NUL byte, a value that is no string: the hook's fault
            ours.close()
            raise HookStartError(f"{type(exc).__name__}: {exc}") from exc
        except (OSError, subprocess.SubprocessError) as exc:
            ours.close()
            raise _NoWatchdogError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            theirs.close()
        self = cls(proc, ours, deadline, prefix)
        _live.add(self)
        logger.debug("%s finish hook watchdog started: pid %d", prefix, proc.pid)
        try:
            first = self._line(until=deadline)
            if first is None and not self._eof:
                first = self._seal()  # silent until the deadline: from now on it cannot start the shell
            if first is not None and first.startswith("pid "):
                self.pid = int(first[4:])
                # The shell is past its exec or about to be: whatever happens from here (the hook may kill
                # its watchdog at once) is this run's end, never a reason to start the hook again.
                self._confirm_exec()
                return self
        except BaseException:
            self.abandon()
            raise
        # No "pid": the shell never reached its exec, and never will (end-of-file: nobody holds the
        # watchdog's end; sealed: a late report fails), so starting it without the watchdog runs it once.
        self._close()
        if first is not None and first.startswith("error "):
            self._reap()
            raise HookStartError(first[6:])
        if not self._eof:
            proc.kill()  # our unreaped child: its pid cannot have been reused
            proc.wait()
            raise HookStartError("its watchdog did not start it before the deadline")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_EXIT_WAIT_S)  # it is on its way out
        status = proc.poll()
        if status is None:
            proc.kill()
            proc.wait()
            raise _NoWatchdogError("it closed its control socket without starting the hook")
        raise _NoWatchdogError(f"it {_ended(status)}")

    def _confirm_exec(self) -> None:
        """After ``pid``: ``error`` is a failed exec (the hook never ran); any other report is kept for :meth:`wait`."""
        line = self._line(until=self._deadline)
        if line is not None and line.startswith("error "):
            self._close()
            self._reap()
            raise HookStartError(line[6:])
        if line is not None and line != "running":
            self._pending = line.encode() + b"\n" + self._pending

    def _seal(self) -> str | None:
        """Refuse further reports, and return the first line already received, if any.

        After ``shutdown(SHUT_RD)`` a shell forked late fails to write its pid, so it is never exec'd;
        a pid written before is still read here.
        """
        if self._sock is None:
            return None
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RD)
        try:
            while select.select([self._sock], [], [], 0)[0] and (data := self._sock.recv(4096)):
                self._pending += data
        except OSError:
            pass
        if b"\n" not in self._pending:
            return None
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def _line(self, until: float) -> str | None:
        """The watchdog's next report; None at end-of-file or when ``until`` passes."""
        while b"\n" not in self._pending:
            wait = until - time.monotonic()
            if self._sock is None or wait <= 0 or not select.select([self._sock], [], [], wait)[0]:
                return None
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:  # ECONNRESET: the peer died with unread data
                data = b""
            if not data:
                self._eof = True
                return None
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def wait(self) -> HookEnd:
        """Until the shell ends or is killed at the deadline."""
        until = self._deadline + TERM_GRACE_S + SETTLE_S + _REPORT_SLACK_S
        timed_out = False
        while (line := self._line(until)) is not None:
            if line == "timeout":
                timed_out = True
            elif line.startswith("exit "):
                return HookEnd(None if timed_out else int(line[5:]), timed_out)
        # Silent, or gone (the hook may have killed it): guard the hook from here, as if there had been
        # no watchdog.  One warning at the end says how it went, not a second one here.
        self._close()
        if self._eof:  # a dying process closes its files before it can be waited for
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(_EXIT_WAIT_S)
        status = self._proc.poll()
        if status is None:
            self._proc.kill()  # our unreaped child: its pid cannot have been reused
            lost = f"its watchdog (pid {self._proc.pid}) stopped reporting and was killed"
        else:
            lost = f"its watchdog (pid {self._proc.pid}) {_ended(status)} while it ran"
        logger.info("%s finish hook: %s; guarding the hook from here", self._prefix, lost)
        self._reap()
        while _running(self.pid) and time.monotonic() < self._deadline:
            time.sleep(_SHELL_POLL_S)
        if _running(self.pid):
            end_group(self.pid)
            return HookEnd(None, True)
        return HookEnd(None, False, f"{lost}, so the hook's exit status is unknown")

    def abandon(self) -> None:
        """The trainer stops waiting (interrupted): end the group now."""
        self._close()  # end-of-file: the watchdog kills the group now if the shell still runs
        if self._proc.poll() is not None and self.pid and group_exists(self.pid):
            end_group(self.pid)  # no watchdog to do it
        self._reap()

    def release(self) -> None:
        """After :meth:`wait`: what the shell left in its group may run until the deadline, no longer."""
        self._close()
        if self._proc.poll() is not None:
            if self.pid and group_exists(self.pid):  # the watchdog is gone: guard the leftovers from here
                _guard_in_thread(self.pid, self._deadline)
            return
        if not (self.pid and group_exists(self.pid)):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(_EXIT_WAIT_S)  # it exits as soon as it sees the group gone
        self._reap()

    def _reap(self) -> None:
        # Wait for the watchdog from a daemon thread so it never lingers as our zombie; if this
        # process ends first, init adopts and reaps it.
        if self._proc.poll() is None:
            threading.Thread(target=self._proc.wait, name="instrument-finish-hook-watchdog", daemon=True).start()

    def _close(self) -> None:
        _live.discard(self)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class _Direct:
    """The shell as this process's own child, guarded only while this process lives."""

    def __init__(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        self._proc, self._deadline, self.pid = proc, deadline, proc.pid

    @classmethod
    def start(cls, cmd: str, env: Mapping[str, str], deadline: float, output: int) -> _Direct:
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", cmd],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
            )
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            raise HookStartError(f"{type(exc).__name__}: {exc}") from exc
        return cls(proc, deadline)

    def wait(self) -> HookEnd:
        try:
            return HookEnd(self._proc.wait(timeout=max(0.0, self._deadline - time.monotonic())), False)
        except subprocess.TimeoutExpired:
            self._end()
            return HookEnd(None, True)

    def abandon(self) -> None:
        if self._proc.poll() is None:
            self._end()

    def release(self) -> None:
        if group_exists(self.pid):
            _guard_in_thread(self.pid, self._deadline)

    def _end(self) -> None:
        end_group(self.pid, reap=self._proc.poll)
        try:
            self._proc.wait(timeout=SETTLE_S)
        except subprocess.TimeoutExpired:
            logger.warning("finish hook shell (pid %d) did not exit after SIGKILL", self.pid)


def _ended(status: int) -> str:
    return f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"


def _guard_in_thread(pgid: int, deadline: float) -> None:
    """Without a watchdog: end the group at the deadline, or stop watching once it is gone."""

    def guard() -> None:
        try:
            while time.monotonic() < deadline:
                if not group_exists(pgid):
                    return
                time.sleep(max(0.0, min(_POLL_S, deadline - time.monotonic())))
            end_group(pgid)
        except Exception as exc:  # a daemon thread must never die loudly
            logger.debug("guarding the finish hook's leftovers failed: %s", exc, exc_info=True)

    threading.Thread(target=guard, name="instrument-finish-hook-guard", daemon=True).start()


def _forget_all_in_child() -> None:
    # A forked child's copy of the trainer's socket end would hide the trainer's death from the watchdog.
    for watched in list(_live):
        with contextlib.suppress(Exception):
            watched._close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)


# --------------------------------------------------------------------------- the hook's output

TAIL_LINES = 20
"""Lines of hook output kept in :attr:`~instrument.finish._hook.HookResult.tail`."""

MAX_LOGGED_LINES = 200
"""Hook output lines shown per run; the rest are counted, not shown."""

OUTPUTS = ("stderr", "log")
"""Where the hook's output goes: this process's stderr, or the ``instrument.finish_hook`` logger only."""

_READ_CHUNK = 1 << 16
_MAX_LINE_BYTES = 8192  # a longer line is cut into pieces, so one endless line cannot eat memory
_output_logger = logging.getLogger("instrument.finish_hook")  # the hook's own output lines (docs name this logger)


class OutputSink:
    """Where the hook's lines go: ``stderr`` (``"{prefix} {line}"``, above a progress display if one
    is drawn) or the ``instrument.finish_hook`` logger at INFO.  Never raises: a closed or broken
    stderr loses the line, not the training run."""

    def __init__(self, output: str, prefix: str, progress: HookProgress | None = None) -> None:
        self.output, self.prefix, self._progress = output, prefix, progress

    def line(self, text: str) -> None:
        if self.output != "stderr":
            _output_logger.info("%s %s", self.prefix, text)
            return
        shown = f"{self.prefix} {text}"
        try:
            if self._progress is not None and self._progress.print(shown):
                return
            stream = sys.stderr
            if stream is not None:
                stream.write(shown + "\n")
                stream.flush()
        except Exception:  # a closed stderr, an encoding that cannot hold the text
            logger.debug("%s could not write a finish hook line to stderr", self.prefix, exc_info=True)


class OutputReader:
    """Drains a pipe line by line: shows the first lines, counts the rest, keeps the last ones.

    It reads whole chunks and only decodes the lines it shows or keeps, so a hook printing
    megabytes costs little and is never blocked on a full pipe.
    """

    def __init__(self, stream: IO[bytes], sink: OutputSink) -> None:
        self._stream = stream
        self._sink = sink
        self._lock = threading.Lock()
        self._tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)
        self._total = 0
        self._logged = 0
        self._quiet = False

    def run(self) -> None:
        pending = b""
        try:
            fd = self._stream.fileno()
            while chunk := os.read(fd, _READ_CHUNK):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                while len(pending) > _MAX_LINE_BYTES:
                    lines.append(pending[:_MAX_LINE_BYTES])
                    pending = pending[_MAX_LINE_BYTES:]
                self._take(lines)
            if pending:
                self._take([pending])
        except Exception:  # a reader must never die loudly in a daemon thread
            logger.debug("%s reading finish hook output failed", self._sink.prefix, exc_info=True)
        finally:
            self._stream.close()

    def _take(self, lines: list[bytes]) -> None:
        with self._lock:
            self._total += len(lines)
            room = 0 if self._quiet else max(0, MAX_LOGGED_LINES - self._logged)
            shown = lines[:room]
            self._logged += len(shown)
            self._tail.extend(lines[-TAIL_LINES:])
        for raw in shown:
            self._sink.line(decode(raw))

    def finish(self) -> tuple[tuple[str, ...], int]:
        """Stop showing lines; return the tail and how many lines were not shown."""
        with self._lock:
            self._quiet = True
            return tuple(decode(raw) for raw in self._tail), self._total - self._logged


def decode(raw: bytes) -> str:
    """A line of hook output as text (bad bytes replaced, a trailing CR dropped)."""
    return raw.decode("utf-8", errors="replace").rstrip("\r")
