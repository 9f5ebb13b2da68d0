"""Warn once per kind of failure, count every one: what the SDK does with a failure it absorbs.

Standard library only, so any module may use it (the run, the recorders, the finish hook, the
rollout profiler). The first failure of a kind is a warning; later ones of that kind go to the
debug log, so a failure on every step cannot flood the training log.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["WarnOnce"]


class WarnOnce:
    """One warning per kind, the repeats at debug level, all counted (any thread may call it)."""

    __slots__ = ("_lock", "_logger", "_seen", "count")

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.count = 0
        """Calls so far (warned or not)."""

    def __call__(self, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args``: a warning the first time ``kind`` comes, debug after; whether it warned."""
        with self._lock:
            self.count += 1
            first = kind not in self._seen
            self._seen.add(kind)
        self._logger.log(logging.WARNING if first else logging.DEBUG, message, *args)
        return first

    def failure(self, what: str, exc: BaseException, where: str = "") -> bool:
        """A failure absorbed, of kind ``what``: ``instrument: {what}{where}: {Type}: {exc}; training continues``."""
        return self(what, "instrument: %s%s: %s: %s; training continues", what, where, type(exc).__name__, exc)
