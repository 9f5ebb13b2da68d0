"""What ties a run to its process: rank detection, SIGTERM / SIGUSR1, interpreter exit, fork.

Handlers only ever reach the run through :data:`instrument.run._state.STATE`, so this module
imports no session (the session imports it).
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


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        # The user's handler decides what SIGTERM means (often: set a flag, stop gracefully);
        # traces are saved when the run ends (finish() or exit), never from inside a handler.
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    session = STATE.session
    if session is not None and session.holds_lock_in_this_thread():
        # Interrupted inside one of our own profiler calls: stopping or exporting now could
        # re-enter torch.profiler mid-call. The call ends the process when it returns.
        session.terminate_pending = True
        return
    terminate_now(session)


def terminate_now(session: Any) -> None:
    """Save what is open, then die of SIGTERM as the default disposition would."""
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
    global _previous_sigterm, _sigterm_installed, _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    if not _sigterm_installed and threading.current_thread() is threading.main_thread():
        try:
            _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True
        except (ValueError, OSError) as exc:  # not the main interpreter, or signals unavailable
            logger.debug("instrument: no SIGTERM handler: %s", exc)


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
    """Restore the SIGTERM handler found at install time (tests)."""
    global _sigterm_installed, _usr1_installed
    if threading.current_thread() is not threading.main_thread():
        return
    if _sigterm_installed:
        signal.signal(signal.SIGTERM, _previous_sigterm if _previous_sigterm is not None else signal.SIG_DFL)
        _sigterm_installed = False
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
