"""On-demand profiling decisions: the slow-step trigger, SIGUSR1, the trigger file, the cap.

Decisions are plain functions of what they are given (durations in, yes or no out); the
session feeds them and acts on the answer.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections import deque

from instrument.config import ProfilerConfig

__all__ = ["TRIGGER_FILE", "Triggers", "slow_step"]

logger = logging.getLogger(__name__)

TRIGGER_FILE = "PROFILE_NEXT_STEP"
"""Creating ``save_path/PROFILE_NEXT_STEP`` makes every process (with ``on_demand``) profile its next step."""


def slow_step(seconds: float, history: list[float] | deque[float], factor: float, window: int) -> float | None:
    """The median it exceeds if a step of ``seconds`` is over ``factor`` times the median of a full ``history``."""
    if len(history) < window:
        return None
    median = statistics.median(history)
    return median if seconds > factor * median else None


class Triggers:
    """What asks for an unplanned step to be profiled, and how many have been granted."""

    def __init__(self, config: ProfilerConfig, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.granted: list[int] = []  # steps profiled on demand
        self.signal_requested = False  # set by SIGUSR1: async-signal-safe, only a flag
        self._pending = 0  # steps still owed to a slow-step trigger
        self._file_seen: tuple[int, int] | None = None
        self._cap_reported = False
        window = config.trigger.window if config.trigger else 1
        self._durations: deque[float] = deque(maxlen=window)

    def wanted(self, step: int) -> bool:
        """Whether a trigger asks for ``step`` and the cap allows it (consumes the request)."""
        if not self.config.active:
            return False
        if not (self._pending > 0 or self.signal_requested or self._file_appeared()):
            return False
        self.signal_requested = False
        self._pending = max(0, self._pending - 1)
        if len(self.granted) >= self.config.max_triggered:
            if not self._cap_reported:
                self._cap_reported = True
                logger.warning(
                    "instrument: %d triggered steps already profiled (max_triggered); step %d is not",
                    len(self.granted),
                    step,
                )
            return False
        logger.info("instrument: profiling step %d on demand (rank %d)", step, self.rank)
        self.granted.append(step)
        return True

    def step_took(self, step: int, seconds: float) -> None:
        """An unprofiled step ended (profiled steps are slower by design: not compared)."""
        trigger = self.config.trigger
        if trigger is None:
            return
        median = slow_step(seconds, self._durations, trigger.factor, trigger.window)
        if median is not None:
            self._pending = trigger.steps
            logger.warning(
                "instrument: step %d took %.3f s, over %.1f x the median %.3f s of the last %d: "
                "profiling the next %d step(s) on rank %d",
                step,
                seconds,
                trigger.factor,
                median,
                len(self._durations),
                trigger.steps,
                self.rank,
            )
        self._durations.append(seconds)

    def _file_appeared(self) -> bool:
        if not self.config.on_demand:
            return False
        try:
            st = os.stat(os.path.join(self.config.save_path, TRIGGER_FILE))
        except OSError:
            return False
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._file_seen:
            return False  # each file (or touch of it) triggers once per process
        self._file_seen = seen
        return True
