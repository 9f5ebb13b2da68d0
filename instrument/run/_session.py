"""Per-process profiling state: role, rank, the current step, open stages and the backend.

The public entry points (:mod:`instrument.run._api`) check one flag, :data:`STATE.recording`,
before doing anything; it is true only while a profiled step is open on a profiled rank, so
unprofiled steps and ranks cost one attribute read.  Everything after ``configure`` catches
its own failures: one warning per kind of failure, a counter, and training goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from instrument import naming, recorders
from instrument import ranks as _ranks
from instrument._warnings import WarnOnce
from instrument.config import ProfilerConfig, Schedule
from instrument.finish._coordinator import FinishCoordinator
from instrument.manifest import Manifest, TraceRecord
from instrument.recorders import FastRanges, Recorder, TraceSpec
from instrument.run._clock import StoreClock
from instrument.run._process import (
    detect_rank_and_world,
    install_process_hooks,
    install_usr1,
    keep_cupti,
    terminate_now,
)
from instrument.run._run_id import older_runs, resolve_run_id
from instrument.run._stages import StageTracing, _Frame
from instrument.run._state import STATE
from instrument.run._timeline import TimelineWriter
from instrument.run._triggers import Triggers

__all__ = ["STATE", "Session", "detect_rank_and_world", "start_session"]

logger = logging.getLogger(__name__)

_STEP_SPAN = ("step", None, "step")  # the timeline's name of a profile_step span


def is_last_step(config: ProfilerConfig, step: int, *, last: bool) -> bool:
    """Whether the run's profiling ends after ``step``: ``last``, or the last configured step.

    With triggers or on-demand profiling a step nobody planned may still come: then only
    ``last`` (or ``finish()``) ends the run. The Ray controller uses the same rule.
    """
    may_trigger = config.trigger is not None or config.on_demand
    return last or (not may_trigger and config.steps is not None and step >= config.steps[-1])


def continuous_schedule(config: ProfilerConfig) -> Schedule | None:
    """The schedule a continuous step's trace follows: verl's, in verl's dialect; none (the whole step) otherwise."""
    return config.schedule if config.dialect == "verl" else None


class Session(StageTracing):
    """One run of one process: what it profiles, what it wrote, and its finish hook."""

    def __init__(self, config: ProfilerConfig, *, role: str, rank: int, world_size: int) -> None:
        self.config = config
        self.role = role
        self.rank = rank
        self.world_size = world_size
        self.profiles_rank = config.profiles_rank(rank)
        self.step: int | None = None
        self.step_profiled = False
        self.profiled_steps: list[int] = []
        self.records: list[TraceRecord] = []
        self.finished = False
        self._backend: Recorder | None = None
        self._fast: FastRanges | None = None
        # One trace at a time per process (torch.profiler crashes when two threads drive it).
        # The stage that opens a trace owns it; stages of other threads or tasks entered while it
        # is open are ranges in it ("guests"). The trace stops when its owner and every guest have
        # left (or at the end of the step), so no range of ours ever spans a stop and a restart.
        self._trace = 0  # generation of the current (or next) trace
        self._owner: _Frame | None = None
        self._owner_left = False
        self._guests = 0
        self._stale = 0  # ranges still open from traces stopped under them: no new trace until they close
        self._holder = 0  # thread holding self._lock (the SIGTERM handler must not re-enter from it)
        self.terminate_pending = False
        self._backend_failed = False
        self.run_id = resolve_run_id(rank=rank, world_size=world_size)  # the job's, agreed by every process
        self._manifest = Manifest(config.save_path, run=self.run_id)
        self._failures = WarnOnce(logger)  # SDK failures this run absorbed (each kind warned about once)
        self._never_recorded: set[str] = set()
        self._specs: dict[tuple[str, int | None, bool, bool, str | None], TraceSpec] = {}
        self.step_triggered = False
        self.triggers = Triggers(config, rank)
        self._step_started = 0.0
        self.metrics: Any = None
        self.hook = FinishCoordinator(config, role=role, rank=rank, world_size=world_size, fail=self._fail)
        if config.metrics:
            try:
                from instrument.metrics import StageMetrics

                self.metrics = StageMetrics(role=role, rank=rank, rank_label=config.metrics_rank_label)
            except Exception as exc:
                self._fail("cannot record stage metrics", exc)  # a missing prometheus_client names its extra
        self.timeline: TimelineWriter | None = None
        if config.timeline and config.enable:  # enable=False: nothing written, nothing timed
            self.timeline = TimelineWriter(
                config.save_path,
                role=role,
                rank=rank,
                world_size=world_size,
                publish=self.publish,
                report=self._fail,
                ready=self.save_path_ready,
            )
        self.clock: StoreClock | None = None  # torch.distributed's clock exchange, started by start_session
        self._step_started_ns = 0
        self._save_path_ok: bool | None = None
        self._save_path_lock = threading.Lock()
        self._lock = threading.RLock()
        self._finish_lock = threading.Lock()  # finish() once; never held while recording

    @property
    def engaged(self) -> bool:
        """Whether decorated calls leave the disabled path off profiled steps: stage metrics or the timeline."""
        return self.metrics is not None or self.timeline is not None

    # A reentrant lock that knows its holder: the SIGTERM handler runs on the main thread between
    # two bytecodes, possibly inside one of our own backend calls; it must then defer, not re-enter.
    def _acquire(self) -> int:
        self._lock.acquire()
        held, self._holder = self._holder, threading.get_ident()
        return held

    def _release(self, held: int) -> None:
        self._holder = held
        self._lock.release()
        if self.terminate_pending and not held:
            terminate_now(self)

    def holds_lock_in_this_thread(self) -> bool:
        """Whether this thread is inside one of the session's guarded sections."""
        return self._holder == threading.get_ident()

    def profiles(self, step: int) -> bool:
        """Whether this process records RL step ``step``."""
        return self.profiles_rank and self.config.profiles_step(step)

    @property
    def manifest_path(self) -> Path:
        """This process's manifest file (written once a trace is saved)."""
        return self._manifest.path

    # ------------------------------------------------------------------ failures

    @property
    def failures(self) -> int:
        """SDK failures this run absorbed so far."""
        return self._failures.count

    def _fail(self, what: str, exc: BaseException) -> None:
        self._failures.failure(what, exc, f" (role {self.role}, rank {self.rank})")
        if self.metrics is not None:
            self.metrics.failures.inc()

    # ------------------------------------------------------------------ backend

    def _ensure_backend(self) -> Recorder | None:
        if self._backend is not None or self._backend_failed:
            return self._backend
        if not self.save_path_ready():
            self._backend_failed = True
            return None
        try:
            self._backend = recorders.build(self.config.tool, self.publish, self._fail, config=self.config)
        except Exception as exc:
            self._backend_failed = True
            self._fail(f"cannot profile into {self.config.save_path!r}", exc)
        return self._backend

    def save_path_ready(self) -> bool:
        """Whether ``save_path`` is a folder, made at the first call (any thread); the recorder and the timeline
        both ask, so a save_path that cannot be made is one failure, warned about once."""
        with self._save_path_lock:
            if self._save_path_ok is None:
                try:
                    Path(self.config.save_path).mkdir(parents=True, exist_ok=True)
                    self._save_path_ok = True
                    if self.rank == 0:
                        self._tell_older_runs()
                except Exception as exc:
                    self._save_path_ok = False
                    self._fail(f"cannot profile into {self.config.save_path!r}", exc)
            return self._save_path_ok

    def _tell_older_runs(self) -> None:
        """Once, on rank 0: ``save_path`` holds files of older runs, and which run ``instrument analyze`` shows."""
        try:
            older = older_runs(self.config.save_path, self.run_id.id)
        except Exception:  # a note only: never a reason to refuse the save_path
            return
        if older:
            logger.warning(
                "instrument: %s already holds files of older runs (manifests: %d); `instrument analyze` shows the "
                "newest run (this one, %s) unless given --run ID or --run all",
                self.config.save_path,
                older,
                self.run_id.id,
            )

    def publish(self, record: TraceRecord) -> None:
        """A recorder saved a complete file (any thread): list it in the manifest and the run."""
        self.records.append(record)
        if self.metrics is not None:
            self.metrics.bytes.inc(record.bytes)
        self._manifest.append(record)

    def _spec(self, stage: str, schedule: Any = None, role: str | None = None) -> TraceSpec:
        key = (stage, self.step, schedule is not None, self.step_triggered, role)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 1024:
                self._specs.clear()
            spec = self._specs[key] = self._new_spec(stage, schedule, role)
        return spec

    def _new_spec(self, stage: str, schedule: Any, role: str | None) -> TraceSpec:
        return TraceSpec(
            save_path=self.config.save_path,
            role=self.role if role is None else role,
            stage=stage,
            step=self.step if self.step is not None else 0,
            rank=self.rank,
            world_size=self.world_size,
            contents=self.config.contents,
            schedule=schedule,
            triggered=self.step_triggered,
        )

    # ------------------------------------------------------------------ steps

    def begin_step(self, step: int) -> None:
        """Start RL step ``step``; profiling opens if the step and this rank are selected."""
        if self.step is not None:
            logger.warning("instrument: step %d began while step %s was open; closing it", step, self.step)
            self.end_step()
        held = self._acquire()
        try:
            self.step = STATE.step = step
            self._step_started = time.perf_counter()
            self._step_started_ns = time.perf_counter_ns()
            planned = self.profiles_rank and self.config.profiles_step(step)
            self.step_triggered = not planned and not self.finished and self.triggers.wanted(step)
            self.step_profiled = not self.finished and (planned or self.step_triggered)
            if not self.step_profiled:
                return
            started = time.perf_counter_ns()
            backend = self._ensure_backend()
            if backend is None:
                self.step_profiled = False
                return
            self.profiled_steps.append(step)
            backend.on_step(self.role, step)
            if not self.config.discrete and self._may_start(naming.CONTINUOUS_STAGE):
                schedule = continuous_schedule(self.config)
                backend.start(self._spec(naming.CONTINUOUS_STAGE, schedule))
                self._scheduled_step = schedule is not None
                if schedule is None:  # with one, every stage keeps its frame: scheduled ones advance it
                    self._offer_fast_ranges(backend)  # stages of this step need only a range in its trace
            elif self.config.discrete:
                self._offer_fast_ranges(backend)  # each stage opens its own trace (NVTX: a capture range and range)
            self.own_time("profiler_start", started)  # the recorder's first build (torch's import) included
            STATE.recording = STATE.engaged = True
        except Exception as exc:
            self._fail(f"could not start profiling step {step}", exc)
        finally:
            self._release(held)

    def _offer_fast_ranges(self, backend: Recorder) -> None:
        """If the recorder offers it (and no metrics time each call), decorated calls open their own ranges."""
        self._fast = None
        if self.metrics is None and isinstance(backend, FastRanges):
            scope = backend.fast_ranges(discrete=self.config.discrete)
            if scope is not None:
                self._fast = backend
                STATE.fast_thread = 0 if scope == "any thread" else threading.get_ident()
                STATE.fast = {}

    def end_step(self, *, last: bool = False, failed: bool = False) -> None:
        """End the open step; after the last one (``last`` or the last configured step) run the finish hook.

        ``failed``: the step is unwinding from an exception, so other ranks may never arrive;
        the hook then runs without waiting for them.
        """
        held = self._acquire()
        try:
            step = self.step
            STATE.recording, STATE.fast, STATE.step = False, None, 0
            STATE.engaged = self.engaged
            self._after_step(step, profiled=self.step_profiled)
            # No trace outlives its step; its stop and export lie inside the step's span, as instrument's own time.
            self._stop_trace("could not save the trace of step", str(step))
            self.step = None
            self._step_span(step)
            self.step_profiled = False
        finally:
            self._release(held)
        after_last = step is not None and is_last_step(self.config, step, last=last)
        if after_last and self.hook.automatic and self.hook.pending:
            if self.timeline is not None:
                self.timeline.write_now()  # the hook sees every step so far (listed at the run's end)
            self.wait_for_exports()
            if not failed:
                self.hook.meet_peers()
            self.run_finish_hook()

    # ------------------------------------------------------------------ on-demand profiling and metrics

    @property
    def triggered_steps(self) -> list[int]:
        """Steps profiled on demand so far."""
        return self.triggers.granted

    def request_profile(self) -> None:
        """Profile the next step (what SIGUSR1 does); async-signal-safe: it only sets a flag."""
        self.triggers.signal_requested = True

    def _after_step(self, step: int | None, *, profiled: bool) -> None:
        """Step metrics and the slow-step trigger (profiled steps are slower by design: not compared)."""
        if step is None:
            return
        seconds = time.perf_counter() - self._step_started
        try:
            if self.metrics is not None:
                self.metrics.step.observe(seconds)
                self.metrics.steps.inc()
            if not profiled:
                self.triggers.step_took(step, seconds)
        except Exception as exc:
            self._fail("could not record step metrics", exc)

    def _step_span(self, step: int | None) -> None:
        """The step's span in the timeline, and a nudge to its writer (the step's spans are written now)."""
        timeline = self.timeline
        if timeline is None or step is None:
            return
        timeline.pending.append(
            (_STEP_SPAN, step, self._step_started_ns, time.perf_counter_ns(), threading.get_ident())
        )
        timeline.wake()

    def observe_stage(self, name: str, seconds: float, *, role: str | None = None) -> None:
        """Record one stage (or ``mini_batch``) duration in the metrics, under the stage's own role if it has one."""
        try:
            self.metrics.stage_observer(name, role)(seconds)
        except Exception as exc:
            self._fail("could not record stage metrics", exc)

    # ------------------------------------------------------------------ the end

    def wait_for_exports(self) -> None:
        """Block until every trace this process saved so far is on disk."""
        if self._backend is not None:
            try:
                self._backend.flush()
            except Exception as exc:
                self._fail("could not finish exporting traces", exc)

    def run_finish_hook(self) -> None:
        """Run the finish command once, on the chosen ranks, after every trace is on disk."""
        self.hook.run(
            steps=self.profiled_steps,
            manifest=str(self._manifest.path.absolute()),
            wait_for_exports=self.wait_for_exports,
        )

    def flush(self) -> None:
        """Close whatever is open and wait for exports (a SIGTERM path: no finish hook)."""
        held = self._acquire()
        try:
            STATE.recording, STATE.fast = False, None
            owner = self._owner
            if owner is not None and owner.window_open:  # interrupted inside a mini-batch: the trace holds it
                self.exit_window(owner, owner.close_window)
            self._stop_trace("could not flush traces")
            if self._backend is not None:
                try:
                    self._backend.close()
                except Exception as exc:
                    self._fail("could not flush traces", exc)
            if self.timeline is not None:  # last: the traces' lines first, as a run always wrote them
                self.timeline.close()  # bounded; listed in the manifest before a hook or a SIGTERM death
        finally:
            self._release(held)

    def forget_after_fork(self) -> None:
        """In a forked child: this run belongs to the parent. Never touch its profiler, exports,
        manifest or finish hook from here (a stage the child is still inside ends as a no-op)."""
        self._backend, self._backend_failed = None, True
        self.finished = self.hook.ran = True
        self.metrics = None
        if self.timeline is not None:
            self.timeline.forget()  # the parent's file; the child's spans are not recorded
            self.timeline = None
        if self.clock is not None:
            self.clock.forget()
        STATE.spans = None
        self._lock, self._finish_lock = threading.RLock(), threading.Lock()  # another thread may have held them
        self._holder, self.terminate_pending = 0, False

    def watch_out_of_memory(self) -> None:
        """With ``memory.on_oom``: a CUDA out-of-memory error leaving a stage, on any step, saves a snapshot."""
        memory = self.config.memory
        if memory is None or not memory.on_oom or not self.config.enable:
            return
        try:
            from instrument.recorders.memory import OomSnapshots  # imports torch: only when asked for

            STATE.on_oom = OomSnapshots(memory, spec=self._out_of_memory_spec, publish=self.publish, report=self._fail)
        except Exception as exc:
            self._fail("cannot save memory snapshots at out-of-memory errors", exc)

    def _out_of_memory_spec(self, stage: str, role: str | None) -> TraceSpec | None:
        return None if self.finished else self._new_spec(stage, None, role)

    def finish(self, *, run_hook: bool = True) -> list[str]:
        """End the run: close everything, wait for exports, run the finish hook; idempotent."""
        with self._finish_lock:
            if not self.finished:
                if self.step is not None:
                    self.end_step()
                if self.clock is not None and not self.hook.interrupted:  # Ctrl-C: no 10 s wait for peers' clocks
                    self.clock.at_finish()  # bounded; its estimate goes in before the timeline closes
                self.flush()
                if run_hook and self.hook.automatic:
                    self.run_finish_hook()
                self.finished = True
                self._manifest.close()
                if STATE.session is self:
                    STATE.engaged, STATE.observers, STATE.spans = False, None, None
                    _stop_watching_out_of_memory()  # the run-long allocation history ends with the run
            return [os.path.join(os.path.abspath(self.config.save_path), record.path) for record in self.records]


# ---------------------------------------------------------------------- process-wide wiring


def start_session(config: ProfilerConfig, *, role: str, rank: int | None, world_size: int | None) -> Session:
    """Validate and install a new session for this process."""
    if not isinstance(config, ProfilerConfig):
        raise TypeError(f"'config' must be a ProfilerConfig: {config!r}")
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"'role' must be a non-empty string such as 'actor': {role!r}")
    naming.check_label("role", role)
    if rank is None or world_size is None:
        detected_rank, detected_world, _source = detect_rank_and_world()
        rank = detected_rank if rank is None else rank
        world_size = detected_world if world_size is None else world_size
    _ranks.validate_ranks([rank], world_size, field="rank")
    if config.active and not config.all_ranks:
        _ranks.validate_ranks(config.ranks, world_size)
    if config.finish_hook is not None and not config.finish_hook.all_ranks:
        _ranks.validate_ranks(config.finish_hook.ranks, world_size, field="finish_hook.ranks")
    keep_cupti(config)
    previous = STATE.session
    if previous is not None and not previous.finished:
        logger.warning("instrument: configure() called while a run was open; finishing that run first")
        previous.finish()
    _stop_watching_out_of_memory()
    session = Session(config, role=role, rank=rank, world_size=world_size)
    session.watch_out_of_memory()
    if session.timeline is not None:
        session.clock = StoreClock.start(
            run=f"{session.run_id.id} {config.save_path}", add_clock=session.timeline.add_clock, report=session._fail
        )
    STATE.recording, STATE.fast, STATE.step = False, None, 0
    STATE.engaged = session.engaged
    STATE.observers = None if session.metrics is None else session.metrics.observers
    STATE.spans = None if session.timeline is None else session.timeline.pending
    STATE.session = session
    early, first, STATE.early, STATE.early_first = STATE.early, STATE.early_first, 0, None
    session.leave_steps()  # no step open yet: a stage called now is named
    if early:
        session.misuse(
            "before configure",
            "instrument: stage calls (the first: %s) ran before configure(); they were not recorded — call "
            "configure() first, before the first stage or step",
            first,
        )
    if config.on_demand:
        install_usr1()
    install_process_hooks()
    return session


def _stop_watching_out_of_memory() -> None:
    on_oom, STATE.on_oom = STATE.on_oom, None
    if on_oom is not None:
        on_oom.close()  # never raises
