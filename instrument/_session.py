"""Per-process profiling state: role, rank, the current step, open stages and the backend.

The public entry points (:mod:`instrument._api`) check one flag, :data:`STATE.recording`,
before doing anything; it is true only while a profiled step is open on a profiled rank, so
unprofiled steps and ranks cost one attribute read.  Everything after ``configure`` catches
its own failures: one warning per kind of failure, a counter, and training goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from instrument import naming
from instrument import ranks as _ranks
from instrument._finish import hook_environment, run_finish_hook
from instrument._manifest import Manifest, TraceRecord
from instrument.backends import TraceSpec
from instrument.config import ProfilerConfig

__all__ = ["STATE", "Session", "current_session", "detect_rank_and_world", "start_session"]

logger = logging.getLogger("instrument")


class Backend(Protocol):
    """What the session needs from a backend (see ``instrument/backends``)."""

    tool: str
    windows_saved: int  # traces (or capture ranges) saved since the last start
    stage_range_in_windows: bool  # whether a windowed stage also gets a stage range

    def on_step(self, role: str, step: int) -> None: ...
    @property
    def tracing(self) -> bool: ...
    def start(self, spec: TraceSpec) -> None: ...
    def window_step(self) -> None: ...
    def stop(self) -> None: ...
    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]: ...
    def flush(self) -> list[TraceRecord]: ...
    def close(self) -> list[TraceRecord]: ...


class _State:
    """The flags the hot path reads."""

    __slots__ = ("engaged", "recording", "session")

    def __init__(self) -> None:
        self.recording = False  # a profiled step is open on this rank
        self.engaged = False  # recording, or stage metrics on: decorated calls take the slow path
        self.session: Session | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Decorated methods hold this object in their closure, and Ray pickles worker classes
        # by value: unpickling must give the receiving process's own state, not a frozen copy.
        return (_process_state, ())


STATE = _State()

_PEER_TIMEOUT_S = 120.0
"""How long ranks wait for each other before the finish hook runs anyway."""


def _process_state() -> _State:
    return STATE


def current_session() -> Session | None:
    """The session of this process, if ``configure`` was called."""
    return STATE.session


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


class _Frame:
    """One open stage (slots, no dataclass: built once per stage call on profiled steps)."""

    __slots__ = (
        "close_range",
        "close_window",
        "concurrent",
        "mini_batches",
        "name",
        "scheduled",
        "trace",
        "traced",
        "window_open",
        "windowed",
    )

    def __init__(self, name: str, scheduled: bool, concurrent: bool = False) -> None:
        self.name = name
        self.scheduled = scheduled
        self.concurrent = concurrent
        self.traced = False  # this frame opened the trace (its owner)
        self.trace = -1  # the trace (generation) this frame's range lies in; -1: none
        self.windowed = False
        self.close_range: Callable[[], None] | None = None
        self.mini_batches = 0
        self.window_open = False
        self.close_window: Callable[[], None] | None = None


_STAGES: ContextVar[tuple[_Frame, ...]] = ContextVar("instrument_stages", default=())
"""The open stages of this thread or asyncio task, innermost last (each context its own)."""


class Session:
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
        self.hook_ran = False
        self.auto_finish_hook = True  # False when a controller decides when and where the hook runs
        self.finished = False
        self._backend: Backend | None = None
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
        self._manifest = Manifest(config.save_path)
        self.failures = 0  # SDK failures this run absorbed (each kind warned about once)
        self._warned: set[str] = set()
        self._never_recorded: set[str] = set()
        self._specs: dict[tuple[str, int | None, bool, bool], TraceSpec] = {}
        self.step_triggered = False
        self.triggered_steps: list[int] = []
        self._pending_triggered = 0
        self._signal_requested = False
        self._trigger_file_seen: tuple[int, int] | None = None
        self._cap_reported = False
        self._step_started = 0.0
        self._durations: deque[float] = deque(maxlen=config.trigger.window if config.trigger else 1)
        self.metrics: Any = None
        if config.metrics:
            try:
                from instrument.metrics import StageMetrics

                self.metrics = StageMetrics(role=role, rank=rank, rank_label=config.metrics_rank_label)
            except Exception as exc:
                self._fail("cannot record stage metrics (is prometheus_client installed?)", exc)
        self._lock = threading.RLock()
        self._finish_lock = threading.Lock()  # finish() once; never held while recording

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
            _terminate_now(self)

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

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if self.metrics is not None:
            self.metrics.failures.inc()
        if what in self._warned:
            logger.debug("instrument: %s: %s", what, exc)
            return
        self._warned.add(what)
        logger.warning(
            "instrument: %s (role %s, rank %d): %s: %s; training continues",
            what,
            self.role,
            self.rank,
            type(exc).__name__,
            exc,
        )

    # ------------------------------------------------------------------ backend

    def _ensure_backend(self) -> Backend | None:
        if self._backend is not None or self._backend_failed:
            return self._backend
        try:
            Path(self.config.save_path).mkdir(parents=True, exist_ok=True)
            if self.config.tool == "nvtx":
                from instrument.backends.nvtx import NvtxBackend

                self._backend = NvtxBackend(self._manifest, self._fail)
            else:
                from instrument.backends.torch import TorchBackend

                self._backend = TorchBackend(self._manifest, self._fail)
        except Exception as exc:
            self._backend_failed = True
            self._fail(f"cannot profile into {self.config.save_path!r}", exc)
        return self._backend

    def _spec(self, stage: str, schedule: Any = None) -> TraceSpec:
        key = (stage, self.step, schedule is not None, self.step_triggered)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 1024:
                self._specs.clear()
            spec = self._specs[key] = self._new_spec(stage, schedule)
        return spec

    def _new_spec(self, stage: str, schedule: Any) -> TraceSpec:
        return TraceSpec(
            save_path=self.config.save_path,
            role=self.role,
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
            self.step = step
            self._step_started = time.perf_counter()
            planned = self.profiles_rank and self.config.profiles_step(step)
            self.step_triggered = not planned and self._triggered_now(step)
            self.step_profiled = not self.finished and (planned or self.step_triggered)
            if not self.step_profiled:
                return
            backend = self._ensure_backend()
            if backend is None:
                self.step_profiled = False
                return
            self.profiled_steps.append(step)
            if self.step_triggered:
                self.triggered_steps.append(step)
            backend.on_step(self.role, step)
            if not self.config.discrete and self._may_start(naming.CONTINUOUS_STAGE):
                backend.start(self._spec(naming.CONTINUOUS_STAGE))
            STATE.recording = STATE.engaged = True
        except Exception as exc:
            self._fail(f"could not start profiling step {step}", exc)
        finally:
            self._release(held)

    def end_step(self, *, last: bool = False, failed: bool = False) -> None:
        """End the open step; after the last one (``last`` or the last configured step) run the finish hook.

        ``failed``: the step is unwinding from an exception, so other ranks may never arrive;
        the hook then runs without waiting for them.
        """
        held = self._acquire()
        try:
            step, self.step = self.step, None
            STATE.recording = False
            STATE.engaged = self.metrics is not None
            self._after_step(step, profiled=self.step_profiled)
            self._stop_trace(f"could not save the trace of step {step}")  # no trace outlives its step
            self.step_profiled = False
        finally:
            self._release(held)
        steps = self.config.steps
        # With triggers a step nobody planned may still come: only `last` or finish() ends the run.
        may_trigger = self.config.trigger is not None or self.config.on_demand
        after_last = last or (not may_trigger and steps is not None and step is not None and step >= steps[-1])
        if after_last and self.auto_finish_hook and self._hook_pending():
            self.wait_for_exports()
            if not failed:
                self._meet_peers()
            self.run_finish_hook()

    def _may_start(self, stage: str) -> bool:
        """Whether a new trace may open (caller holds the lock): not while ranges of a stopped one are open."""
        if self._stale == 0:
            return True
        self._fail(
            "a trace did not start",
            RuntimeError(
                f"stage {stage!r} at step {self.step} is not traced: {self._stale} stage(s) of an earlier trace "
                "are still running in other threads or tasks (a trace opens only when they have ended)"
            ),
        )
        return False

    def _stop_trace(self, what: str) -> None:
        """Stop the open trace (caller holds the lock); guests still inside it become stale."""
        backend, owner = self._backend, self._owner
        self._trace += 1
        self._stale += self._guests + (1 if owner is not None and not self._owner_left else 0)
        self._owner, self._owner_left, self._guests = None, False, 0
        if backend is None or not backend.tracing:
            return
        try:
            backend.stop()
            if self.metrics is not None:
                self.metrics.windows.inc(backend.windows_saved)
            if owner is not None and owner.windowed and backend.windows_saved == 0:
                self._report_never_recorded(owner)
        except Exception as exc:
            self._fail(what, exc)

    def _hook_pending(self) -> bool:
        return not self.hook_ran and self.config.finish_hook is not None and self.config.active

    def _meet_peers(self) -> None:
        """Wait for the other torch.distributed ranks, so the hook sees their traces on disk too."""
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return
            timeout = timedelta(seconds=_PEER_TIMEOUT_S)
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timeout)
            else:
                dist.barrier(async_op=True).wait(timeout=timeout)
        except Exception as exc:  # a dead or late rank: run the hook on what is there
            self._fail("ranks did not meet before the finish hook", exc)

    # ------------------------------------------------------------------ on-demand profiling and metrics

    def _triggered_now(self, step: int) -> bool:
        """Whether a trigger asks for this step (slow step, SIGUSR1, the trigger file), within the cap."""
        if not self.config.active:
            return False
        wanted = self._pending_triggered > 0 or self._signal_requested or self._trigger_file_appeared()
        if not wanted:
            return False
        self._signal_requested = False
        self._pending_triggered = max(0, self._pending_triggered - 1)
        if len(self.triggered_steps) >= self.config.max_triggered:
            if not self._cap_reported:
                self._cap_reported = True
                logger.warning(
                    "instrument: %d triggered steps already profiled (max_triggered); step %d is not",
                    len(self.triggered_steps),
                    step,
                )
            return False
        logger.info("instrument: profiling step %d on demand (rank %d)", step, self.rank)
        return True

    def _trigger_file_appeared(self) -> bool:
        if not self.config.on_demand:
            return False
        try:
            st = os.stat(os.path.join(self.config.save_path, TRIGGER_FILE))
        except OSError:
            return False
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._trigger_file_seen:
            return False  # each file (or touch of it) triggers once per process
        self._trigger_file_seen = seen
        return True

    def request_profile(self) -> None:
        """Profile the next step (what SIGUSR1 does); async-signal-safe: it only sets a flag."""
        self._signal_requested = True

    def _after_step(self, step: int | None, *, profiled: bool) -> None:
        """Step metrics and the slow-step trigger (profiled steps are slower by design: not compared)."""
        if step is None:
            return
        seconds = time.perf_counter() - self._step_started
        try:
            if self.metrics is not None:
                self.metrics.step.observe(seconds)
                self.metrics.steps.inc()
            trigger = self.config.trigger
            if trigger is not None and not profiled:
                history = self._durations
                if len(history) == history.maxlen:
                    median = statistics.median(history)
                    if seconds > trigger.factor * median:
                        self._pending_triggered = trigger.steps
                        logger.warning(
                            "instrument: step %d took %.3f s, over %.1f x the median %.3f s of the last %d: "
                            "profiling the next %d step(s) on rank %d",
                            step,
                            seconds,
                            trigger.factor,
                            median,
                            len(history),
                            trigger.steps,
                            self.rank,
                        )
                history.append(seconds)
        except Exception as exc:
            self._fail("could not record step metrics", exc)

    def observe_stage(self, name: str, seconds: float) -> None:
        """Record one stage (or ``mini_batch``) duration in the metrics."""
        try:
            self.metrics.stage_observer(name)(seconds)
        except Exception as exc:
            self._fail("could not record stage metrics", exc)

    # ------------------------------------------------------------------ stages and windows

    def enter_stage(self, name: str, scheduled: bool, *, concurrent: bool = False) -> _Frame:
        """A stage begins inside a profiled step; ``concurrent`` for coroutines (ranges not per thread)."""
        frame = _Frame(name, scheduled, concurrent)
        _STAGES.set((*_STAGES.get(), frame))
        backend = self._backend
        if backend is None:
            return frame
        held = self._acquire()
        try:
            if backend.tracing:  # another stage's trace (or the step's): a range in it
                self._guests += 1
                frame.trace = self._trace
            elif self.config.discrete and self.step_profiled and self._may_start(name):
                windowed = scheduled and self.config.schedule is not None
                backend.start(self._spec(name, self.config.schedule if windowed else None))
                frame.traced, frame.windowed, frame.trace = True, windowed, self._trace
                self._owner = frame
        except Exception as exc:
            self._fail(f"could not start stage {name!r}", exc)
        finally:
            self._release(held)
        if frame.trace >= 0 and (not frame.windowed or backend.stage_range_in_windows):
            try:
                frame.close_range = backend.enter_range(name, concurrent=concurrent)
            except Exception as exc:
                self._fail(f"could not start stage {name!r}", exc)
        return frame

    def exit_stage(self, frame: _Frame) -> None:
        """The stage of ``frame`` ends (also when it raised)."""
        stack = _STAGES.get()
        if stack and stack[-1] is frame:
            _STAGES.set(stack[:-1])
        elif frame in stack:
            _STAGES.set(tuple(f for f in stack if f is not frame))
        if frame.trace < 0:
            return
        try:
            if frame.close_range is not None:
                frame.close_range()
        except Exception as exc:
            self._fail(f"could not close the range of stage {frame.name!r}", exc)
        held = self._acquire()
        try:
            if frame.trace != self._trace:
                self._stale -= 1  # its trace was stopped under it (end of step, SIGTERM, finish)
            else:
                if frame is self._owner:
                    self._owner_left = True
                else:
                    self._guests -= 1
                if self._owner_left and self._guests == 0:
                    owner = self._owner.name if self._owner is not None else frame.name
                    self._stop_trace(f"could not save the trace of stage {owner!r}")
        finally:
            self._release(held)

    def _report_never_recorded(self, frame: _Frame) -> None:
        if frame.name in self._never_recorded:
            return
        self._never_recorded.add(frame.name)
        logger.warning(
            "instrument: stage %r ran %d mini-batches at step %s but its schedule %s recorded none; "
            "nothing was written (see `instrument plan`)",
            frame.name,
            frame.mini_batches,
            self.step,
            self.config.schedule,
        )

    def enter_window(self, mini_batch: int) -> tuple[_Frame | None, Callable[[], None] | None]:
        """A mini-batch begins in this context's innermost stage: record its range."""
        stack = _STAGES.get()
        frame = stack[-1] if stack else None
        backend = self._backend
        if backend is None or frame is None or frame.trace != self._trace:
            return frame, None
        close = None
        try:
            close = backend.enter_range(f"mini_batch{mini_batch}", concurrent=frame.concurrent)
        except Exception as exc:
            self._fail("could not record a mini-batch range", exc)
        frame.window_open, frame.close_window = True, close
        return frame, close

    def exit_window(self, frame: _Frame | None, close_range: Callable[[], None] | None) -> None:
        """A mini-batch ends: close its range and, in a scheduled stage's trace, advance the schedule."""
        try:
            if close_range is not None:
                close_range()
            if frame is None:
                return
            frame.window_open, frame.close_window = False, None
            frame.mini_batches += 1
            if frame.windowed and frame is self._owner and self._backend is not None:
                held = self._acquire()
                try:
                    if frame is self._owner:  # still its trace: not stopped under it meanwhile
                        self._backend.window_step()
                finally:
                    self._release(held)
        except Exception as exc:
            self._fail("could not advance the mini-batch schedule", exc)

    # ------------------------------------------------------------------ the end

    def _add_records(self, records: list[TraceRecord]) -> None:
        self.records.extend(records)
        if self.metrics is not None and records:
            self.metrics.bytes.inc(sum(record.bytes for record in records))

    def wait_for_exports(self) -> None:
        """Block until every trace this process saved so far is on disk."""
        if self._backend is not None:
            try:
                self._add_records(self._backend.flush())
            except Exception as exc:
                self._fail("could not finish exporting traces", exc)

    def run_finish_hook(self) -> None:
        """Run the finish command once, on the chosen ranks, after every trace is on disk."""
        hook = self.config.finish_hook
        with self._lock:
            if self.hook_ran or hook is None or not self.config.active:
                return
            self.hook_ran = True
        if not (hook.all_ranks or self.rank in hook.ranks):
            return
        self.wait_for_exports()
        try:
            env = hook_environment(
                save_path=self.config.save_path,
                tool=self.config.tool,
                role=self.role,
                rank=self.rank,
                world_size=self.world_size,
                pid=os.getpid(),
                steps=sorted(set(self.profiled_steps)),
                manifest=str(self._manifest.path.absolute()),
            )
            run_finish_hook(
                hook.cmd, env=env, timeout_s=hook.timeout_s, log_prefix=f"[instrument {self.role} rank {self.rank}]"
            )
        except Exception as exc:
            self._fail("could not run the finish hook", exc)

    def flush(self) -> None:
        """Close whatever is open and wait for exports (a SIGTERM path: no finish hook)."""
        held = self._acquire()
        try:
            STATE.recording = False
            owner = self._owner
            if owner is not None and owner.window_open:  # interrupted inside a mini-batch: the trace holds it
                self.exit_window(owner, owner.close_window)
            self._stop_trace("could not flush traces")
            if self._backend is not None:
                try:
                    self._add_records(self._backend.close())
                except Exception as exc:
                    self._fail("could not flush traces", exc)
        finally:
            self._release(held)

    def forget_after_fork(self) -> None:
        """In a forked child: this run belongs to the parent. Never touch its profiler, exports,
        manifest or finish hook from here (a stage the child is still inside ends as a no-op)."""
        self._backend, self._backend_failed = None, True
        self.finished = self.hook_ran = True
        self.metrics = None
        self._lock, self._finish_lock = threading.RLock(), threading.Lock()  # another thread may have held them
        self._holder, self.terminate_pending = 0, False

    def finish(self, *, run_hook: bool = True) -> list[str]:
        """End the run: close everything, wait for exports, run the finish hook; idempotent."""
        with self._finish_lock:
            if not self.finished:
                if self.step is not None:
                    self.end_step()
                self.flush()
                if run_hook and self.auto_finish_hook:
                    self.run_finish_hook()
                self.finished = True
                self._manifest.close()
                if STATE.session is self:
                    STATE.engaged = False
            return [os.path.join(self.config.save_path, record.path) for record in self.records]


# ---------------------------------------------------------------------- process-wide wiring

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
    _terminate_now(session)


def _terminate_now(session: Session | None) -> None:
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
    STATE.session = None
    STATE.recording = STATE.engaged = False


os.register_at_fork(after_in_child=_forget_parent_run)


def _at_exit() -> None:
    session = STATE.session
    if session is not None:
        session.finish()


def _install_process_hooks() -> None:
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


TRIGGER_FILE = "PROFILE_NEXT_STEP"
"""Creating ``save_path/PROFILE_NEXT_STEP`` makes every process (with ``on_demand``) profile its next step."""

_previous_usr1: Any = None
_usr1_installed = False


def _on_usr1(signum: int, frame: FrameType | None) -> None:
    session = STATE.session
    if session is not None:
        session.request_profile()
    if callable(_previous_usr1):
        _previous_usr1(signum, frame)


def _install_usr1() -> None:
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
"""Set to 1 to keep an NVTX injection library even under ``tool="torch"`` with CUDA."""


def _keep_cupti_for_torch(config: ProfilerConfig) -> None:
    """Under torch.profiler with CUDA, drop NVTX injection (nsys): both want CUPTI, and torch loses its kernels.

    Takes effect for NVTX calls that have not happened yet in this process (the tool is chosen
    at the first call), so ``configure`` should run before CUDA work.
    """
    if config.tool != "torch" or "cuda" not in config.contents or os.environ.get(KEEP_NVTX_INJECTION) == "1":
        return
    removed = [name for name in NVTX_INJECTION_VARIABLES if os.environ.pop(name, None) is not None]
    if removed:
        logger.warning(
            "instrument: tool='torch' with CUDA: removed %s from this process's environment so torch.profiler "
            "keeps CUPTI (kernels in the trace); set %s=1 to keep NVTX injection",
            ", ".join(removed),
            KEEP_NVTX_INJECTION,
        )


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
    _keep_cupti_for_torch(config)
    previous = STATE.session
    if previous is not None and not previous.finished:
        logger.warning("instrument: configure() called while a run was open; finishing that run first")
        previous.finish()
    session = Session(config, role=role, rank=rank, world_size=world_size)
    STATE.recording = False
    STATE.engaged = session.metrics is not None
    STATE.session = session
    if config.on_demand:
        _install_usr1()
    _install_process_hooks()
    return session
