"""Stages and the one trace a process records at a time: the part of the session the hot path drives.

Each thread and asyncio task has its own stage stack (one context variable, :data:`_STAGES`), so a
``profile_window`` belongs to the stage of its own context. Every form of a stage pushes its frame
on entry and drops it on exit in a ``finally``, as opentelemetry's ``use_span`` attaches and
detaches its context; a frame is dropped by identity, so stages that end out of order (threads,
hand-called ``__exit__``) leave the others in place. One trace is open per process
(torch.profiler crashes when two threads drive it): the stage that opens it owns it, stages
entered elsewhere while it is open are ranges in it ("guests"), and it stops when its owner
and every guest have left, or at the end of the step. No range of ours ever spans a stop
and a restart, because a new trace waits until the "stale" ranges of a stopped one close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from instrument._warnings import WarnOnce
from instrument.config import ProfilerConfig
from instrument.naming import SDK_STAGE_PREFIX
from instrument.recorders import FastRanges, Recorder, TraceSpec
from instrument.run._state import STATE

__all__ = [
    "OUTSIDE_STEP",
    "StageTracing",
    "drop_stage",
    "innermost_frame",
    "opened_by",
    "push_stage",
    "sees_every_step",
]

logger = logging.getLogger(__name__)

OUTSIDE_STEP = "outside a step"
"""The misuse kind of a stage called while no step is open (a step numbered below 1 has its own: run/_api.py)."""


class _Frame:
    """One open stage (slots, no dataclass: built once per stage call on profiled steps).

    A frame the session entered (:meth:`StageTracing.enter_stage`) may hold a range in a trace. A
    ``with profiled_stage(...)`` block timed by stage metrics off a profiled step has a bare one
    (``trace`` -1). ``owner``: the ``profiled_stage`` object of a with-block; ``started``: when it
    began and in which step, if stage metrics or the step timeline time it.
    """

    __slots__ = (
        "close_range",
        "close_window",
        "concurrent",
        "mini_batches",
        "name",
        "owner",
        "scheduled",
        "started",
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
        self.owner: object = None
        self.started: tuple[int, int] | None = None  # (perf_counter_ns, step) when metrics or the timeline time it


_OWN_SPANS = {
    what: ("stage", None, SDK_STAGE_PREFIX + what) for what in ("profiler_start", "profiler_stop", "profiler_step")
}
"""The timeline's names of the SDK's own work on the training thread (see :meth:`StageTracing.own_time`)."""
OWN_STEP_MIN_NS = 1_000_000
"""A schedule's step of the profiler is recorded as the SDK's own time when it took this long (an export, a phase
change); the µs of the others stay in the mini-batch that made them."""


_STAGES: ContextVar[tuple[object, ...]] = ContextVar("instrument_stages", default=())
"""The one stage stack: the open stages of this thread or asyncio task, innermost last (each context its own).
Each is a :class:`_Frame`, or, for a with-block that nothing records or times, the ``profiled_stage``
object itself (a marker its exit finds: no frame is built on the disabled path)."""


def push_stage(entry: object) -> None:
    """A stage of this context begins: its frame, or a with-block's marker."""
    _STAGES.set((*_STAGES.get(), entry))


def drop_stage(entry: object) -> None:
    """A stage of this context ends (one not on this context's stack is left alone)."""
    stack = _STAGES.get()
    if stack and stack[-1] is entry:
        _STAGES.set(stack[:-1])
    elif entry in stack:
        _STAGES.set(tuple(e for e in stack if e is not entry))


def innermost_frame() -> _Frame | None:
    """This context's innermost stage frame (markers are skipped: nothing recorded them)."""
    for entry in reversed(_STAGES.get()):
        if isinstance(entry, _Frame):
            return entry
    return None


def opened_by(owner: object) -> object:
    """What the with-block object ``owner`` pushed last in this context: its frame, itself (a marker), or None."""
    for entry in reversed(_STAGES.get()):
        if entry is owner or (isinstance(entry, _Frame) and entry.owner is owner):
            return entry
    return None


def sees_every_step(config: ProfilerConfig) -> bool:
    """Whether every step of the run is opened, even under a Ray controller, which opens only the profiled
    steps of a run without the timeline, stage metrics, a trigger or on-demand profiling (they need every
    step's bounds): only then is a stage with no step open a mistake (else it runs there by design, on the
    free path)."""
    return (config.timeline and config.enable) or config.metrics or config.trigger is not None or config.on_demand


class StageTracing:
    """Stage, window and trace-ownership methods of :class:`instrument.run._session.Session` (a mixin)."""

    config: ProfilerConfig
    role: str
    rank: int
    step: int | None
    step_profiled: bool
    metrics: Any
    timeline: Any  # instrument.run._timeline.TimelineWriter, or None
    finished: bool
    _failures: WarnOnce
    _backend: Recorder | None
    _fast: FastRanges | None  # the backend, on a step where decorated calls open their own ranges
    _lock: threading.RLock
    _holder: int
    _trace: int
    _owner: _Frame | None
    _owner_left: bool
    _guests: int
    _stale: int
    _never_recorded: set[str]
    # The open trace is the step's and follows the schedule (continuous mode, verl's dialect): the
    # mini-batches of every scheduled stage in the step advance it, as verl's one profiler per process.
    _scheduled_step = False

    _fail: Callable[[str, BaseException], None]
    _spec: Callable[..., TraceSpec]
    _acquire: Callable[[], int]
    _release: Callable[[int], None]

    # ------------------------------------------------------------------ the SDK's own time

    def own_time(self, what: str, started_ns: int) -> None:
        """Record the SDK's work on this thread since ``started_ns`` (``what``: ``profiler_start``, ``profiler_stop``
        or ``profiler_step``) as the step's span ``instrument:<what>``: the analysis never counts it as the user's
        stage or idle time. Outside a step nothing is recorded (no step's time holds it)."""
        timeline, step = self.timeline, self.step
        if timeline is not None and step is not None:
            span = (_OWN_SPANS[what], step, started_ns, time.perf_counter_ns(), threading.get_ident())
            timeline.pending.append(span)

    # ------------------------------------------------------------------ misuse, named once

    def misuse(self, kind: str, message: str, *args: object) -> None:
        """A mistake in the calling code: one warning per ``kind`` (repeats at debug), counted in ``failures``."""
        self._failures(kind, message, *args)
        if self.metrics is not None:
            try:
                self.metrics.failures.inc()
            except Exception:  # a counter that fails must not make the warning raise
                logger.debug("instrument: could not count a misuse in the metrics", exc_info=True)

    def leave_steps(self) -> None:
        """No step is open: decorated calls skip the hot path's shortcuts and reach the session (the cold path),
        which names a stage called outside any step. A correctly used run calls no stage here: it pays nothing."""
        if STATE.session is self and not self.finished and sees_every_step(self.config):
            STATE.spans = STATE.observers = None
            STATE.engaged = True

    def enter_steps(self) -> None:
        """A step opens: the hot path's shortcuts (the timeline's queue, the stage metrics' observers) are back."""
        if STATE.session is self and not self.finished:
            STATE.spans = None if self.timeline is None else self.timeline.pending
            STATE.observers = None if self.metrics is None else self.metrics.observers
            STATE.engaged = self.metrics is not None or self.timeline is not None

    def outside_step(self, what: str) -> None:
        """``what`` (``stage 'x'``, a window) ran while no step was open: named once."""
        self.misuse(
            OUTSIDE_STEP,
            "instrument: %s ran outside any step (role %s, rank %s): no trace records it and no step counts its "
            "time; wrap each training step in `with instrument.profile_step(step):` (or begin_step(step) / "
            "end_step()); training continues",
            what,
            self.role,
            self.rank,
        )

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

    def _stop_trace(self, what: str, of: str = "") -> None:
        """Stop the open trace (caller holds the lock); guests still inside it become stale.

        ``what`` (and ``of``, joined only on failure: no string is built per call) names the failure.
        """
        backend, owner, scheduled_step = self._backend, self._owner, self._scheduled_step
        self._trace += 1
        self._stale += self._guests + (1 if owner is not None and not self._owner_left else 0)
        self._owner, self._owner_left, self._guests, self._scheduled_step = None, False, 0, False
        if backend is None or not backend.tracing:
            return
        started = time.perf_counter_ns()
        try:
            backend.stop()
            self.own_time("profiler_stop", started)
            if self.metrics is not None:
                self.metrics.windows.inc(backend.windows_saved)
            if owner is not None and owner.windowed and backend.windows_saved == 0:
                self._report_never_recorded(owner)
            elif scheduled_step and backend.windows_saved == 0:
                self._report_step_never_recorded()
        except Exception as exc:
            self._fail(f"{what} {of}" if of else what, exc)

    # ------------------------------------------------------------------ stages and windows

    def enter_stage(self, name: str, scheduled: bool, *, concurrent: bool = False, role: str | None = None) -> _Frame:
        """A stage begins inside a profiled step; ``concurrent`` for coroutines (ranges not per thread)."""
        frame = _Frame(name, scheduled, concurrent)
        push_stage(frame)
        backend = self._backend
        if backend is None:
            return frame
        held = self._acquire()
        try:
            if backend.tracing:  # another stage's trace (or the step's): a range in it
                self._guests += 1
                frame.trace = self._trace
                frame.windowed = scheduled and self._scheduled_step  # its mini-batches advance the step's schedule
            elif self.config.discrete and self.step_profiled and self._may_start(name):
                windowed = scheduled and self.config.schedule is not None
                started = time.perf_counter_ns()
                backend.start(self._spec(name, self.config.schedule if windowed else None, role))
                self.own_time("profiler_start", started)
                frame.traced, frame.windowed, frame.trace = True, windowed, self._trace
                self._owner = frame
        except Exception as exc:
            self._fail(f"could not start stage {name!r}", exc)
        finally:
            self._release(held)
        # A windowed stage has no range of its own in a window trace (one a window cuts short states a wrong
        # duration), but for a continuous step in verl's dialect: verl keeps it, cut where the window ends.
        kept = backend.stage_range_in_windows or (self._scheduled_step and self.config.dialect == "verl")
        if frame.trace >= 0 and (not frame.windowed or kept):
            try:
                frame.close_range = backend.enter_range(name, concurrent=concurrent)
                fast, ranges = STATE.fast, self._fast
                if fast is not None and ranges is not None and name not in fast:  # the next calls open it alone
                    if not self.config.discrete:
                        fast[name] = ranges.fast_range(name, discrete=False)
                    elif frame.traced and not frame.windowed:  # and their own trace (see begin_step)
                        fast[name] = ranges.fast_range(name, discrete=True)
            except Exception as exc:
                self._fail(f"could not start stage {name!r}", exc)
        return frame

    def exit_stage(self, frame: _Frame) -> None:
        """The stage of ``frame`` ends (also when it raised)."""
        drop_stage(frame)
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
                    self._stop_trace("could not save the trace of stage", repr(owner))
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

    def _report_step_never_recorded(self) -> None:
        if "" in self._never_recorded:  # one warning per run: the same schedule misses every step alike
            return
        self._never_recorded.add("")
        logger.warning(
            "instrument: continuous steps follow the schedule %s (verl's dialect); a step's trace recorded no "
            "window, so nothing was written for it (docs/modes.md; warned once)",
            self.config.schedule,
        )

    def enter_window(self, mini_batch: int) -> tuple[_Frame | None, Callable[[], None] | None]:
        """A mini-batch begins in this context's innermost stage: record its range."""
        frame = innermost_frame()
        if frame is None and not STATE.fast and not _STAGES.get():  # no stage at all (none took the fast path)
            self.misuse(
                "window outside a stage",
                "instrument: profile_window(mini_batch=%s) ran outside any stage at step %s (role %s, rank %s): no "
                "stage's trace holds it and no schedule counts it; call it inside the @profiled_stage function (or "
                "`with profiled_stage(...):` block) whose loop it marks; training continues",
                mini_batch,
                self.step,
                self.role,
                self.rank,
            )
        backend = self._backend
        if backend is None:
            return frame, None
        if frame is None or frame.trace != self._trace:
            # A stage that opened its own range (fast path) keeps no frame: its mini-batches are ranges
            # too, in the step's trace (continuous) or as NVTX ranges (discrete, traced or not).
            if STATE.fast is None or not (backend.tracing or self.config.discrete):
                return frame, None
            frame = None
        close = None
        try:
            close = backend.enter_range(f"mini_batch{mini_batch}", concurrent=frame is not None and frame.concurrent)
        except Exception as exc:
            self._fail("could not record a mini-batch range", exc)
        if frame is not None:
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
            if frame.windowed and frame.trace == self._trace and self._backend is not None:
                held = self._acquire()
                try:
                    if frame.trace == self._trace:  # still its trace: not stopped under it meanwhile
                        started = time.perf_counter_ns()
                        self._backend.window_step()  # may export a window's trace, on this thread
                        if time.perf_counter_ns() - started >= OWN_STEP_MIN_NS:
                            self.own_time("profiler_step", started)
                finally:
                    self._release(held)
        except Exception as exc:
            self._fail("could not advance the mini-batch schedule", exc)
