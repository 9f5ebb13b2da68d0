"""Drive profiling across Ray worker groups, the way a verl-style trainer does.

Workers mix in :class:`ProfiledWorker` and call ``instrument.configure(cfg, role=...,
rank=..., world_size=...)`` with their place in the worker group (Ray actors have no
rank of their own).  The trainer wraps each step in ``ProfileController.step(step)``: on
profiled steps it starts and stops every worker once — a group registered under two names
(colocated roles sharing actors) is still driven once per actor.  The controller owns the
finish hook: after the last step it waits until every worker's traces are on disk, then
runs the hook on the hook's ranks of the finish groups (by default the first group only, so
ranks of different groups that share a number do not all run it).

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
from instrument.config import ProfilerConfig
from instrument.recorders.nsys import nsys_runtime_env
from instrument.run._session import STATE, is_last_step

__all__ = ["ProfileController", "ProfiledWorker", "WorkerFailure", "nsight_runtime_env"]

logger = logging.getLogger(__name__)

_CONTROL_TIMEOUT_S = 120.0
"""Seconds a start / stop call may take before the controller reports the worker and moves on."""


class ProfiledWorker:
    """Mixin for Ray worker classes: the remote control methods a :class:`ProfileController` calls.

    The worker calls ``instrument.configure(cfg, role=..., rank=..., world_size=...)`` itself
    (in ``__init__``); these methods then open and close its steps when the controller asks.
    Mini-batches are marked inside worker methods with ``instrument.profile_window``.
    """

    def start_profile(self, step: int) -> bool:
        """Open RL step ``step`` in this worker; returns whether this worker records it."""
        return instrument.begin_step(step)

    def stop_profile(self, step: int, last: bool = False) -> int:
        """Close RL step ``step``; ``last`` runs the finish hook unless a controller owns it. Returns the rank."""
        run = instrument.current_run()
        if run is None:
            return -1
        if run.step != step and run.step is not None:
            logger.warning("instrument: stop_profile(%d) while step %s is open; closing it", step, run.step)
        instrument.end_step(last=last)
        return run.rank

    def yield_finish_hook(self) -> None:
        """Let the controller decide when and where the finish hook runs."""
        session = STATE.session
        if session is not None:
            session.hook.automatic = False

    def wait_profile_exports(self) -> None:
        """Block until this worker's traces so far are on disk."""
        session = STATE.session
        if session is not None:
            session.wait_for_exports()

    def run_profile_finish_hook(self) -> None:
        """Run the finish hook now if this worker's rank is one of its ranks (once per run)."""
        session = STATE.session
        if session is not None:
            session.run_finish_hook()

    def finish_profile(self) -> list[str]:
        """End this worker's run (idempotent): flush its traces; returns the files it wrote."""
        return instrument.finish()

    def profile_rank(self) -> int:
        """This worker's global rank as configured, or -1 before ``configure``."""
        run = instrument.current_run()
        return -1 if run is None else run.rank


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
        finish_groups: Sequence[str] | None = None,
        timeout_s: float = _CONTROL_TIMEOUT_S,
    ) -> None:
        """``groups`` maps names to actors; the finish hook runs in ``finish_groups`` (default: the first group)."""
        if not isinstance(config, ProfilerConfig):
            raise TypeError(f"'config' must be a ProfilerConfig: {config!r}")
        if not groups:
            raise ValueError("'groups' must name at least one worker group: {}")
        if not timeout_s > 0:
            raise ValueError(f"'timeout_s' must be > 0: {timeout_s!r}")
        chosen = list(groups)[:1] if finish_groups is None else list(finish_groups)
        unknown = [name for name in chosen if name not in groups]
        if unknown:
            raise ValueError(f"'finish_groups' must name groups among {sorted(groups)}: {unknown}")
        self.config = config
        self.timeout_s = float(timeout_s)
        self.failures: list[WorkerFailure] = []
        self.files: list[str] = []
        self._finished = False
        self._hook_done = False
        self._controlling = False
        self._hook_workers = {actor for name in chosen for actor in groups[name]}
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

    def _call(self, method: str, *args: Any, timeout_s: float | None = None, only: set[Any] | None = None) -> list[Any]:
        """Call ``method`` on every live worker (or those in ``only``) at once; report failures and timeouts."""
        if not self._controlling:
            self._controlling = True
            self._call("yield_finish_hook")
        pending = {}
        for actor in self._workers:
            if actor in self._dead or (only is not None and actor not in only):
                continue
            try:
                pending[getattr(actor, method).remote(*args)] = actor
            except Exception as exc:
                self._report(actor, method, exc)
        results: list[Any] = []
        if not pending:
            return results
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

    def _drives(self, step: int) -> bool:
        # The step timeline, stage metrics and triggers need every step's boundaries on the workers;
        # without them only profiled steps are worth two remote calls per worker.
        config = self.config
        every_step = (config.timeline and config.enable) or config.metrics or config.trigger is not None
        return every_step or config.on_demand or config.profiles_step(step)

    def start(self, step: int) -> None:
        """Open step ``step`` on every worker (every step with the timeline, metrics or triggers; else profiled)."""
        if self._drives(step):
            self._call("start_profile", step)

    def stop(self, step: int, *, last: bool = False) -> None:
        """Close step ``step``; after the last step run the finish hook (the same rule as a single process)."""
        if self._drives(step):
            self._call("stop_profile", step, False)
        if is_last_step(self.config, step, last=last):
            self._run_finish_hook()

    def _run_finish_hook(self) -> None:
        """Once: wait until every worker's traces are on disk, then run the hook in the finish groups."""
        if self._hook_done:
            return
        self._hook_done = True
        hook = self.config.finish_hook
        if hook is None or not self.config.active:
            return
        self._call("wait_profile_exports")
        self._call("run_profile_finish_hook", timeout_s=self.timeout_s + hook.timeout_s, only=self._hook_workers)

    @contextlib.contextmanager
    def step(self, step: int, *, last: bool = False) -> Iterator[None]:
        """``with ctl.step(step, last=(step == n)):`` around one trainer step."""
        self.start(step)
        try:
            yield
        finally:
            self.stop(step, last=last)

    def finish(self) -> list[str]:
        """Finish every worker once (idempotent), running the finish hook if still due; returns their files."""
        if not self._finished:
            self._finished = True
            self._run_finish_hook()
            for files in self._call("finish_profile"):
                self.files.extend(files)
        return list(self.files)

    @staticmethod
    def nsight_runtime_env(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, Any]:
        """Ray ``runtime_env`` that runs workers under nsys; see :func:`nsight_runtime_env`."""
        return nsight_runtime_env(config, capture_ranges=capture_ranges)


nsight_runtime_env = nsys_runtime_env
"""``{"nsight": {...}}`` for Ray actors (Ray's own word for it): :func:`instrument.recorders.nsys.nsys_runtime_env`."""
