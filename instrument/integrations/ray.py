"""Drive profiling across Ray worker groups, the way a verl-style trainer does.

Workers mix in :class:`ProfiledWorker` and call ``instrument.configure(cfg, role=...,
rank=..., world_size=...)`` with their place in the worker group (Ray actors have no
rank of their own).  The trainer wraps each step in ``ProfileController.step(step)``: on
profiled steps it starts and stops every worker once — a group registered under two names
(colocated roles sharing actors) is still driven once per actor.  The controller owns the
finish hook: after the last step it waits until every worker's traces are on disk, then
runs the hook on the hook's ranks of the finish groups (by default the first group only, so
ranks of different groups that share a number do not all run it).

With the step timeline on, the controller also measures every worker's clock against the run's
reference (round trips from the controller, at its first control call and at ``finish``) and hands
each worker its estimate, and records a timeline of its own: role :data:`CONTROLLER_ROLE`, one step
span per ``ctl.step`` — unless the driver called ``instrument.configure`` itself, whose run then
records the driver's timeline (and gets the clock estimate).

Importing this module imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

import instrument
from instrument._warnings import WarnOnce
from instrument.config import ProfilerConfig
from instrument.integrations.nsys import nsys_runtime_env
from instrument.run import controller
from instrument.run.controller import (
    ROUND_TRIPS,
    ControllerTimeline,
    Sample,
    is_last_step,
    relative,
    reported_host,
    round_trip,
    sees_every_step,
)

__all__ = ["CONTROLLER_ROLE", "ProfileController", "ProfiledWorker", "WorkerFailure", "nsight_runtime_env"]

logger = logging.getLogger(__name__)

_CONTROL_TIMEOUT_S = 120.0
"""Seconds a start / stop call may take before the controller reports the worker and moves on."""
_CLOCK_TIMEOUT_S = 10.0  # one clock round trip that takes longer: that host stays unaligned
CONTROLLER_ROLE = "controller"
"""The role of the controller's own step timeline (a driver that did not call ``instrument.configure``)."""
_CLOCK_FAILED = "cannot measure the Ray workers' clocks (the step timeline may stay unaligned across hosts)"


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
        controller.yield_finish_hook()

    def wait_profile_exports(self) -> None:
        """Block until this worker's traces so far are on disk."""
        controller.wait_for_exports()

    def run_profile_finish_hook(self) -> None:
        """Run the finish hook now if this worker's rank is one of its ranks (once per run)."""
        controller.run_finish_hook()

    def finish_profile(self) -> list[str]:
        """End this worker's run (idempotent): flush its traces; returns the files it wrote."""
        return instrument.finish()

    def profile_rank(self) -> int:
        """This worker's global rank as configured, or -1 before ``configure``."""
        run = instrument.current_run()
        return -1 if run is None else run.rank

    def profile_clock(self) -> tuple[int, str, int, int]:
        """``(clock_ns, host, rank, pid)``: this worker's clock now (the timeline's), host, rank and process."""
        now = time.perf_counter_ns()  # first: the controller's round trip brackets this read
        return now, reported_host(), self.profile_rank(), os.getpid()

    def record_profile_clock(self, offset_ns: int, uncertainty_ns: int, source: str) -> bool:
        """Record a clock estimate (this clock minus the reference's) in the timeline; whether there is one."""
        return controller.record_clock(offset_ns, uncertainty_ns, source)


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
        self.clock_failures = 0
        """Clock measurements that failed (each left some timeline unaligned); the first is a warning."""
        self._warn = WarnOnce(logger)
        self._step_started_ns = 0
        self._timeline = ControllerTimeline(config, role=CONTROLLER_ROLE, report=self._timeline_failed)

    @property
    def manifest_path(self) -> Path | None:
        """The controller's own manifest (it lists the controller's timeline), once written; else ``None``."""
        return self._timeline.manifest_path

    @property
    def workers(self) -> list[Any]:
        """The distinct actors driven, in registration order."""
        return list(self._workers)

    def _call(self, method: str, *args: Any, timeout_s: float | None = None, only: set[Any] | None = None) -> list[Any]:
        """Call ``method`` on every live worker (or those in ``only``) at once; report failures and timeouts."""
        if not self._controlling:
            self._controlling = True
            self._call("yield_finish_hook")
            self._measure_clocks("the first step")
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
        # Without the timeline, metrics or triggers only profiled steps are worth two remote calls per worker.
        return sees_every_step(self.config) or self.config.profiles_step(step)

    def start(self, step: int) -> None:
        """Open step ``step`` on every worker (every step with the timeline, metrics or triggers; else profiled)."""
        self._step_started_ns = time.perf_counter_ns()
        if self._drives(step):
            self._call("start_profile", step)

    def stop(self, step: int, *, last: bool = False) -> None:
        """Close step ``step``; after the last step run the finish hook (the same rule as a single process)."""
        if self._drives(step):
            self._call("stop_profile", step, False)
        if self._step_started_ns:
            self._timeline.add_step(step, self._step_started_ns, time.perf_counter_ns())
        self._step_started_ns = 0
        if is_last_step(self.config, step, last=last):
            self._timeline.write_now()  # the hook's archive holds every step of it
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
            if self._controlling:
                self._measure_clocks("the finish")
            for files in self._call("finish_profile"):
                self.files.extend(files)
            path = self._timeline.close()  # bounded, never raises
            if path is not None:
                self.files.append(path)
        return list(self.files)

    # ------------------------------------------------------------------ clocks

    def _measure_clocks(self, when: str) -> None:
        """Every worker's clock minus the reference's (see the module), recorded in its timeline; never raises."""
        if not (self.config.timeline and self.config.enable):
            return
        try:
            self._hand_out_clocks(when)
        except Exception as exc:
            self._clock_failed(exc)

    def _timeline_failed(self, what: str, exc: BaseException) -> None:
        self._warn.failure(what, exc, " (the Ray controller's own timeline)")

    def _clock_failed(self, exc: BaseException) -> None:
        self.clock_failures += 1
        self._warn.failure(_CLOCK_FAILED, exc)

    def _hand_out_clocks(self, when: str) -> None:
        live = [actor for actor in self._workers if actor not in self._dead]
        places = dict(zip(live, self._ask_all(live, "profile_clock"), strict=True))
        places = {actor: place for actor, place in places.items() if place is not None}
        here = reported_host()
        # Per host, the host's clock minus this controller's: processes of one host share a clock.
        hosts: dict[str, Sample] = {here: Sample(0, 0)}
        for actor, (_, host, _, _) in places.items():
            if host not in hosts:
                sample = self._round_trips(actor)
                if sample is not None:
                    hosts[host] = sample
        # The reference is the timeline the analysis takes for it: the lowest (rank, pid).
        candidates = [((rank, pid), host) for _, host, rank, pid in places.values() if rank >= 0]
        own_rank = self._timeline.clock_rank()  # the controller's own timeline, or the driver's run's
        if own_rank is not None:
            candidates.append(((own_rank, os.getpid()), here))
        if not candidates:
            return
        reference_host = min(candidates)[1]
        reference = hosts.get(reference_host)
        if reference is None:
            raise TimeoutError(f"no round trip to the reference host {reference_host} succeeded")
        source = f"Ray controller round trips at {when}, best of {ROUND_TRIPS}"

        def estimate(host: str) -> tuple[int, int, str] | None:
            if host == reference_host:
                return 0, 0, f"Ray: same host as the reference ({reference_host})"
            sample = hosts.get(host)
            if sample is None:
                return None
            shifted = relative(sample, reference)
            return shifted.offset_ns, shifted.uncertainty_ns, source

        missing = sorted({host for _, host, _, _ in places.values() if estimate(host) is None})
        pending = {}
        for actor, (_, host, _, _) in places.items():
            value = estimate(host)
            if value is not None:
                pending[actor.record_profile_clock.remote(*value)] = actor
        own_estimate = estimate(here)
        if own_rank is not None and own_estimate is not None:
            self._timeline.add_clock(*own_estimate)
        if pending:
            _, late = ray.wait(list(pending), num_returns=len(pending), timeout=_CLOCK_TIMEOUT_S)
            if late:
                missing.append(f"{len(late)} worker(s) that did not record it in time")
        if missing:
            raise TimeoutError(f"no clock estimate for {', '.join(missing)}")

    def _ask_all(self, actors: list[Any], method: str) -> list[Any]:
        """``method`` on every actor at once; ``None`` for one that did not answer in time (it is not dropped)."""
        refs = [getattr(actor, method).remote() for actor in actors]
        ray.wait(refs, num_returns=len(refs), timeout=_CLOCK_TIMEOUT_S)
        answers: list[Any] = []
        for ref in refs:
            try:
                answers.append(ray.get(ref, timeout=0))
            except Exception:
                answers.append(None)
        return answers

    def _round_trips(self, actor: Any) -> Sample | None:
        """``actor``'s clock minus this controller's, the best of :data:`ROUND_TRIPS` (``None``: none answered)."""
        samples = []
        for _ in range(ROUND_TRIPS):
            sent = time.perf_counter_ns()
            try:
                stamp = ray.get(actor.profile_clock.remote(), timeout=_CLOCK_TIMEOUT_S)[0]
            except Exception as exc:
                logger.debug("instrument: a clock round trip failed: %s", exc)
                break
            worker = round_trip(sent, stamp, time.perf_counter_ns())  # the controller minus the worker
            samples.append(Sample(worker.uncertainty_ns, -worker.offset_ns))
        return min(samples, default=None)

    @staticmethod
    def nsight_runtime_env(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, Any]:
        """Ray ``runtime_env`` that runs workers under nsys; see :func:`nsight_runtime_env`."""
        return nsight_runtime_env(config, capture_ranges=capture_ranges)


nsight_runtime_env = nsys_runtime_env
"""``{"nsight": {...}}`` for Ray actors (Ray's own word for it):
:func:`instrument.integrations.nsys.nsys_runtime_env`."""
