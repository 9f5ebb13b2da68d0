"""Drive profiling across Ray worker groups, the way a verl-style trainer does.

Workers mix in :class:`ProfiledWorker` and call ``instrument.configure(cfg, role=...,
rank=..., world_size=...)`` with their place in the worker group (Ray actors have no
rank of their own).  The trainer wraps each step in ``ProfileController.step(step)``: on
profiled steps it starts and stops every worker once — a group registered under two names
(colocated roles sharing actors) is still driven once per actor — and after the last step
it lets each worker run the finish hook, which fires only on the hook's ranks.

Importing this module imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

import instrument
from instrument._session import STATE
from instrument.config import ProfilerConfig

__all__ = ["ProfileController", "ProfiledWorker", "WorkerFailure", "nsight_runtime_env"]

logger = logging.getLogger("instrument")

_CONTROL_TIMEOUT_S = 120.0
"""Seconds a start / stop call may take before the controller reports the worker and moves on."""


class ProfiledWorker:
    """Mixin for Ray worker classes: remote ``start_profile`` / ``stop_profile`` / ``finish_profile``.

    The worker calls ``instrument.configure(cfg, role=..., rank=..., world_size=...)`` itself
    (in ``__init__``); these methods then open and close its steps when the controller asks.
    Mini-batches are marked inside worker methods with ``instrument.profile_window``.
    """

    def start_profile(self, step: int) -> bool:
        """Open RL step ``step`` in this worker; returns whether this worker records it."""
        session = STATE.session
        if session is None:
            return False
        session.begin_step(step)
        return session.step_profiled

    def stop_profile(self, step: int, last: bool = False) -> int:
        """Close RL step ``step``; ``last`` runs the finish hook (on the hook's ranks). Returns the rank."""
        session = STATE.session
        if session is None:
            return -1
        if session.step != step and session.step is not None:
            logger.warning("instrument: stop_profile(%d) while step %s is open; closing it", step, session.step)
        session.end_step(last=last)
        return session.rank

    def finish_profile(self) -> list[str]:
        """End this worker's run (idempotent): flush traces, run the finish hook if still due."""
        return instrument.finish()

    def profile_rank(self) -> int:
        """This worker's global rank as configured, or -1 before ``configure``."""
        session = STATE.session
        return -1 if session is None else session.rank


@dataclass(frozen=True)
class WorkerFailure:
    """A worker that did not answer a control call."""

    group: str
    index: int
    call: str
    error: str


class ProfileController:
    """Start, stop and finish profiling on every worker of a trainer's groups, each actor once."""

    def __init__(
        self,
        config: ProfilerConfig,
        groups: Mapping[str, Sequence[Any]],
        *,
        timeout_s: float = _CONTROL_TIMEOUT_S,
    ) -> None:
        if not isinstance(config, ProfilerConfig):
            raise TypeError(f"'config' must be a ProfilerConfig: {config!r}")
        if not groups:
            raise ValueError("'groups' must name at least one worker group: {}")
        if not timeout_s > 0:
            raise ValueError(f"'timeout_s' must be > 0: {timeout_s!r}")
        self.config = config
        self.timeout_s = float(timeout_s)
        self.failures: list[WorkerFailure] = []
        self.files: list[str] = []
        self._finished = False
        # One entry per distinct actor, named after the first group it appears in.
        self._workers: dict[Any, tuple[str, int]] = {}
        for name, actors in groups.items():
            for index, actor in enumerate(actors):
                self._workers.setdefault(actor, (name, index))
        self._dead: set[Any] = set()

    @property
    def workers(self) -> list[Any]:
        """The distinct actors driven, in registration order."""
        return list(self._workers)

    def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Call ``method`` on every live worker at once; report the ones that fail or time out."""
        pending = {}
        for actor in self._workers:
            if actor in self._dead:
                continue
            try:
                pending[getattr(actor, method).remote(*args)] = actor
            except Exception as exc:
                self._report(actor, method, exc)
        results = []
        timeout = self.timeout_s if timeout_s is None else timeout_s
        ready, not_ready = ray.wait(list(pending), num_returns=len(pending), timeout=timeout)
        for ref in ready:
            try:
                results.append(ray.get(ref))
            except RayError as exc:
                self._report(pending[ref], method, exc)
        for ref in not_ready:
            self._report(pending[ref], method, GetTimeoutError(f"no answer within {timeout:g} s"))
        return results

    def _report(self, actor: Any, call: str, exc: BaseException) -> None:
        group, index = self._workers[actor]
        self._dead.add(actor)
        failure = WorkerFailure(
            group, index, call, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        self.failures.append(failure)
        logger.warning(
            "instrument: worker %s[%d] failed %s (%s); it is no longer driven, the others go on",
            group,
            index,
            call,
            failure.error,
        )

    def start(self, step: int) -> None:
        """Open step ``step`` on every worker if the configuration profiles it."""
        if self.config.profiles_step(step):
            self._call("start_profile", step)

    def stop(self, step: int, *, last: bool = False) -> None:
        """Close step ``step``; ``last`` lets every worker run the finish hook (on its ranks)."""
        if self.config.profiles_step(step) or last:
            hook = self.config.finish_hook
            wait = self.timeout_s + (hook.timeout_s if last and hook is not None else 0.0)
            self._call("stop_profile", step, last, timeout_s=wait)

    @contextlib.contextmanager
    def step(self, step: int, *, last: bool = False) -> Iterator[None]:
        """``with ctl.step(step, last=(step == n)):`` around one trainer step."""
        self.start(step)
        try:
            yield
        finally:
            self.stop(step, last=last)

    def finish(self) -> list[str]:
        """Finish every worker once (idempotent); returns the files they wrote."""
        if not self._finished:
            self._finished = True
            hook = self.config.finish_hook
            wait = self.timeout_s + (hook.timeout_s if hook is not None else 0.0)
            for files in self._call("finish_profile", timeout_s=wait):
                self.files.extend(files)
        return list(self.files)

    @staticmethod
    def nsight_runtime_env(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, Any]:
        """Ray ``runtime_env`` that runs workers under nsys; see :func:`nsight_runtime_env`."""
        return nsight_runtime_env(config, capture_ranges=capture_ranges)


def nsight_runtime_env(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, Any]:
    """``{"nsight": {...}}`` for Ray actors: nsys records only the profiler's capture ranges.

    ``capture_ranges`` is how many ``cudaProfilerStart/Stop`` ranges each worker opens; when it
    is not given it is derived for continuous mode with listed steps (one range per step), and
    otherwise ``stop`` ends capture after the first range — a ``repeat-shutdown:N`` that is never
    reached would leave no report at all.
    """
    if capture_ranges is None and not config.discrete and config.steps is not None:
        capture_ranges = len(config.steps)
    if capture_ranges is not None and capture_ranges < 1:
        raise ValueError(f"'capture_ranges' must be >= 1: {capture_ranges}")
    options: dict[str, Any] = {
        "t": "cuda,nvtx,osrt,cudnn,cublas",
        "cuda-memory-usage": "true",
        "capture-range": "cudaProfilerApi",
        "capture-range-end": f"repeat-shutdown:{capture_ranges}" if capture_ranges else "stop",
        "kill": "none",
    }
    return {"nsight": options}
