"""The finish hook's elapsed time against its timeout, drawn on a terminal once it runs long."""

from __future__ import annotations

import logging
import threading
import time
from typing import TextIO

from instrument._terminal import Display, wanted

__all__ = ["HOOK_PROGRESS_AFTER_S", "HookProgress"]

logger = logging.getLogger(__name__)

HOOK_PROGRESS_AFTER_S = 5.0
"""A finish hook running longer than this shows its elapsed time against its timeout (on a terminal)."""

_HOOK_REFRESH_S = 0.5


class HookProgress:
    """The finish hook's elapsed time against its timeout, once it has run ``after_s`` (terminal only).

    A daemon thread waits ``after_s``, then draws until :meth:`stop`.  :meth:`print` puts a hook
    output line above the display while it is drawn.  Never raises, never blocks for long.
    """

    def __init__(
        self,
        label: str,
        timeout_s: float,
        stream: TextIO | None,
        *,
        after_s: float | None = None,
    ) -> None:
        self._label, self._timeout_s, self._stream = label, timeout_s, stream
        self._after_s = HOOK_PROGRESS_AFTER_S if after_s is None else after_s
        self._stopped = threading.Event()
        self._display: Display | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not wanted(self._stream):
            return
        started = time.monotonic()
        try:
            self._thread = threading.Thread(
                target=self._run, args=(started,), name="instrument-finish-hook-progress", daemon=True
            )
            self._thread.start()
        except Exception:  # no thread left: no progress, nothing else changes
            logger.debug("no finish hook progress", exc_info=True)

    def _run(self, started: float) -> None:
        try:
            if self._stopped.wait(self._after_s):
                return
            with self._lock:
                if self._stopped.is_set():
                    return
                self._display = Display(self._stream, kind="timeout")
                self._display.__enter__()
                task = self._display.add(self._label, total=self._timeout_s)
            while not self._stopped.wait(_HOOK_REFRESH_S):
                self._display.update(task, completed=min(self._timeout_s, time.monotonic() - started))
        except Exception:
            logger.debug("finish hook progress failed", exc_info=True)
        finally:
            with self._lock:
                if self._display is not None:
                    self._display.close()
                    self._display = None

    def print(self, text: str) -> bool:
        """Print a line above the display; ``False`` when none is drawn (the caller writes it itself)."""
        display = self._display
        return display is not None and display.print(text)

    def stop(self) -> None:
        """Remove the display (waits a moment for the drawing thread, never long)."""
        self._stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(2.0)
