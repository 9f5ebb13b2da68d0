"""What ties a run to its process: rank detection, SIGTERM / SIGINT / SIGUSR1, interpreter exit, fork.

Handlers only ever reach the run through :data:`instrument.run._state.STATE`, so this module
imports no session (the session imports it).

A signal that lands inside one of the SDK's own profiler calls (the session's lock held by the main
thread: a profiler's start, stop or export) is acted on when the call returns, so no profiler is left
half started and no file half written. Ctrl-C (SIGINT, while Python's own handler is the one installed)
then raises ``KeyboardInterrupt`` as Python would, and the run ends without waiting for anything that
is not its files: no finish hook, no peers (:meth:`~instrument.finish.FinishCoordinator.interrupt`).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from instrument import recorders
from instrument._warnings import WarnOnce
from instrument.config import ProfilerConfig
from instrument.run._state import STATE
from instrument.run._triggers import TRIGGER_FILE

__all__ = [
    "KEEP_NVTX_INJECTION",
    "TRIGGER_FILE",
    "detect_rank_and_world",
    "install_process_hooks",
    "install_usr1",
    "keep_cupti",
    "terminate_now",
    "uninstall_process_hooks",
]

logger = logging.getLogger(__name__)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        logger.warning("instrument: ignoring %s=%r: not an integer", name, value)
        return None


def detect_rank_and_world() -> tuple[int, int, str]:
    """Global rank, world size and where they came from.

    In order: an initialised ``torch.distributed`` (only if torch is already imported: this
    never imports torch), torchrun's ``RANK`` / ``WORLD_SIZE``, Ray Train's context (if Ray
    is imported and a Train session is running), else rank 0 of 1.  Ray actors outside Ray
    Train pass their place in the worker group to ``configure`` (the Ray integration does).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed"
        except Exception as exc:  # a half-initialised process group
            logger.debug("instrument: torch.distributed rank unavailable: %s", exc)
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is not None and world is not None:
        return rank, world, "RANK/WORLD_SIZE"
    train = sys.modules.get("ray.train")
    if train is not None:
        try:
            context = train.get_context()
            return int(context.get_world_rank()), int(context.get_world_size()), "ray.train"
        except Exception as exc:  # not inside a Ray Train worker
            logger.debug("instrument: no Ray Train context: %s", exc)
    return 0, 1, "default"


_previous_sigterm: Any = None
_sigterm_installed = False
_atexit_registered = False
_previous_sigint: Any = None
_sigint_installed = False
_interrupt_pending = False  # a SIGINT deferred out of one of our own calls (a SIGTERM outranks it)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        # The user's handler decides what SIGTERM means (often: set a flag, stop gracefully);
        # traces are saved when the run ends (finish() or exit), never from inside a handler.
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    global _interrupt_pending
    _interrupt_pending = False  # the process ends of SIGTERM, whatever Ctrl-C came before
    session = STATE.session
    if session is not None and session.holds_lock_in_this_thread():
        # Interrupted inside one of our own profiler calls: stopping or exporting now could
        # re-enter torch.profiler mid-call. The call ends the process when it returns.
        session.terminate_pending = True
        return
    terminate_now(session)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: what Python's own handler does (``KeyboardInterrupt``), after telling the run it is interrupted;
    inside one of our own profiler calls, once that call returns (a profiler interrupted mid-start or an export
    mid-write is what could hang or corrupt the exit)."""
    global _interrupt_pending
    session = STATE.session
    if session is not None:
        session.hook.interrupt("Ctrl-C (SIGINT)")  # a flag: no lock, no I/O in a handler
        if session.holds_lock_in_this_thread():
            _interrupt_pending = session.terminate_pending = True
            return
    signal.default_int_handler(signum, frame)


def terminate_now(session: Any) -> None:
    """Act on a signal deferred out of one of our own calls, or on SIGTERM: a deferred Ctrl-C raises
    ``KeyboardInterrupt`` here; SIGTERM saves what is open, then dies of SIGTERM as the default disposition would."""
    global _interrupt_pending
    if _interrupt_pending:
        _interrupt_pending = False
        if session is not None:
            session.terminate_pending = False
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # more SIGTERMs while saving must not recurse
    if session is not None:
        session.terminate_pending = False
        session.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _forget_parent_run() -> None:
    """After ``fork()`` the child starts unconfigured: its own ``configure`` starts its own run."""
    session = STATE.session
    if session is not None:
        session.forget_after_fork()
    STATE.reset()  # the OOM hook is never closed here: its lock may have been held by another thread at fork
    if session is not None:
        STATE.engaged = False  # the parent's stages running on in the child are not calls "before configure()"


os.register_at_fork(after_in_child=_forget_parent_run)


def _at_exit() -> None:
    session = STATE.session
    if session is not None:
        session.finish()


_unconfigured = WarnOnce(logger)


def _never_configured() -> None:
    """At exit: a process that ran stages but never called ``configure()`` is told so, once."""
    if STATE.session is None and STATE.early:
        _unconfigured(
            "never configured",
            "instrument: stage calls (the first: %s) ran but this process never called configure(), so nothing "
            'was recorded; call instrument.configure(instrument.ProfilerConfig(...), role="actor") in every '
            "process before its first stage or step (docs/quickstart.md)",
            STATE.early_first,
        )


atexit.register(_never_configured)  # at import: a process that never configures installs no other hook


def install_process_hooks() -> None:
    """The run's hooks: its end at interpreter exit, SIGTERM, and Ctrl-C where Python's own handler is installed
    (a handler of the program's own is left alone: SIGINT is then the program's)."""
    global _previous_sigterm, _sigterm_installed, _atexit_registered, _previous_sigint, _sigint_installed
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        return
    if not _sigterm_installed:
        try:
            _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True
        except (ValueError, OSError) as exc:  # not the main interpreter, or signals unavailable
            logger.debug("instrument: no SIGTERM handler: %s", exc)
    if not _sigint_installed:
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                _previous_sigint = signal.signal(signal.SIGINT, _on_sigint)
                _sigint_installed = True
        except (ValueError, OSError) as exc:
            logger.debug("instrument: no SIGINT handler: %s", exc)


_previous_usr1: Any = None
_usr1_installed = False


def _on_usr1(signum: int, frame: FrameType | None) -> None:
    session = STATE.session
    if session is not None:
        session.request_profile()
    if callable(_previous_usr1):
        _previous_usr1(signum, frame)


def install_usr1() -> None:
    global _previous_usr1, _usr1_installed
    if _usr1_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        _previous_usr1 = signal.signal(signal.SIGUSR1, _on_usr1)
        _usr1_installed = True
    except (ValueError, OSError, AttributeError) as exc:
        logger.warning("instrument: on_demand: no SIGUSR1 handler in this process: %s", exc)


def uninstall_process_hooks() -> None:
    """Restore the SIGTERM, SIGINT and SIGUSR1 handlers found at install time (tests)."""
    global _sigterm_installed, _usr1_installed, _sigint_installed, _interrupt_pending
    if threading.current_thread() is not threading.main_thread():
        return
    if _sigterm_installed:
        signal.signal(signal.SIGTERM, _previous_sigterm if _previous_sigterm is not None else signal.SIG_DFL)
        _sigterm_installed = False
    if _sigint_installed:
        if signal.getsignal(signal.SIGINT) is _on_sigint:  # one installed since is the program's
            signal.signal(signal.SIGINT, _previous_sigint)
        _sigint_installed, _interrupt_pending = False, False
    if _usr1_installed:
        signal.signal(signal.SIGUSR1, _previous_usr1 if _previous_usr1 is not None else signal.SIG_DFL)
        _usr1_installed = False


NVTX_INJECTION_VARIABLES = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")
KEEP_NVTX_INJECTION = "INSTRUMENT_KEEP_NVTX_INJECTION"
"""Set to 1 to keep an NVTX injection library even under a CUPTI recorder (``tool="torch"``) with CUDA."""


def keep_cupti(config: ProfilerConfig) -> None:
    """Under a recorder that uses CUPTI (torch.profiler) with CUDA, drop NVTX injection (nsys): both want CUPTI,
    and the recorder loses its kernels. What a recorder uses is its registration's to say (``uses_cupti``).

    Takes effect for NVTX calls that have not happened yet in this process (the tool is chosen
    at the first call), so ``configure`` should run before CUDA work.
    """
    if "cuda" not in config.contents or os.environ.get(KEEP_NVTX_INJECTION) == "1":
        return
    if not any(name in os.environ for name in NVTX_INJECTION_VARIABLES) or not recorders.uses_cupti(config.tool):
        return
    removed = [name for name in NVTX_INJECTION_VARIABLES if os.environ.pop(name, None) is not None]
    logger.warning(
        "instrument: tool=%r with CUDA: removed %s from this process's environment so its recorder keeps CUPTI "
        "(kernels in the trace); set %s=1 to keep NVTX injection",
        config.tool,
        ", ".join(removed),
        KEEP_NVTX_INJECTION,
    )
