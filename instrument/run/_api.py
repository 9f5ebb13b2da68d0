"""Public entry points: ``configure``, ``profiled_stage``, ``profile_window``, ``profile_step``, ``finish``.

The disabled path is the product's hot path: on an unprofiled step or rank a decorated call
costs one plain closure and one attribute read (``benchmarks/overhead.py`` measures it).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from instrument import naming
from instrument.config import ProfilerConfig
from instrument.run._info import RunInfo
from instrument.run._session import Session, start_session
from instrument.run._stages import _STAGES, _Frame, drop_stage, push_stage
from instrument.run._state import STATE

__all__ = [
    "begin_step",
    "configure",
    "current_run",
    "end_step",
    "finish",
    "profile_step",
    "profile_window",
    "profiled_stage",
]

_F = TypeVar("_F", bound=Callable[..., Any])

_STEP_BELOW_ONE = "step below 1"
"""The misuse kind of ``profile_step(0)``: its own, so it is named even after a stage ran outside a step."""
_refused: list[Session] = []
"""The session whose step below 1 is open (not opened): its stages are that one mistake, not another."""


def configure(config: ProfilerConfig, *, role: str, rank: int | None = None, world_size: int | None = None) -> RunInfo:
    """Start a run for this process; rank and world size are detected when not given.

    Raises ``ValueError`` naming a selected rank outside the world. After this call nothing
    the SDK does raises into training. Call again after :func:`finish` for a new run.
    Returns a read-only :class:`RunInfo`.
    """
    return RunInfo(start_session(config, role=role, rank=rank, world_size=world_size))


def _left_with(exc: BaseException, name: str, role: str | None) -> None:
    """An exception leaves a stage: the out-of-memory snapshot decides (never raises: ``STATE.on_oom`` catches)."""
    on_oom = STATE.on_oom
    if on_oom is not None:
        on_oom(exc, name, role)


def current_run() -> RunInfo | None:
    """The run of this process, or ``None`` before ``configure``."""
    session = STATE.session
    return None if session is None else RunInfo(session)


def begin_step(step: int) -> bool:
    """Open RL step ``step`` — what ``profile_step`` does on entry, for code that cannot use a ``with`` block.

    Returns whether this process records the step. Pair it with :func:`end_step`.
    """
    _check_step(step)
    session = STATE.session
    if session is None:
        _before_configure("begin_step")
        return False
    if not _open_step(session, step):
        return False
    return bool(session.step_profiled)


def end_step(*, last: bool = False, failed: bool = False) -> None:
    """Close the open step — what ``profile_step`` does on exit.

    ``last=True`` runs the finish hook after it; ``failed=True`` (the step is unwinding from an
    error) runs it without waiting for the other ranks.
    """
    _refused.clear()
    session = STATE.session
    if session is not None:
        session.end_step(last=last, failed=failed)
        session.leave_steps()


def _open_step(session: Session, step: int) -> bool:
    """Open step ``step`` of the run (a step below 1 is named once and not opened); whether it opened."""
    if step < 1:
        session.misuse(
            _STEP_BELOW_ONE,
            "instrument: profile_step(%d): RL steps count from 1 (steps=(1, 5) are the first and the fifth), so "
            "step %d was not opened and nothing in it is recorded; number them from 1, "
            "`for step in range(1, n + 1)`; training continues",
            step,
            step,
        )
        _refused[:] = [session]
        return False
    _refused.clear()
    session.enter_steps()
    session.begin_step(step)
    return True


def _before_configure(what: str, stage: str | None = None) -> None:
    """A call before ``configure()`` (the no-session branch): counted, named by ``configure()`` or at exit."""
    state = STATE
    if not state.early:
        state.early_first = what if stage is None else f"{what} {stage!r}"
    state.early += 1
    state.engaged = False  # the first is enough to name it: the calls after it take the free path again


def finish() -> list[str]:
    """End the run: close open traces, wait for exports, run the finish hook; idempotent.

    Returns the paths of the files written. Also runs at interpreter exit.
    """
    session = STATE.session
    return [] if session is None else session.finish()


def _check_step(step: int) -> None:
    # A wrong type is a bug at the call, found at the first step; a number below 1 is named once and skipped.
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"'step' must be an int (1-based RL step): {step!r}")


class profiled_stage:  # noqa: N801 - reads as a function at call sites, like contextlib's helpers
    """Mark a stage of work: ``@profiled_stage("update_actor", scheduled=True)`` or ``with profiled_stage("gen"):``.

    ``scheduled=True`` marks an update stage whose ``profile_window`` calls advance the schedule.
    ``role="critic"`` names the stage's traces after another role than the process's: a single
    process that runs several verl roles (a fused trainer) keeps them apart. Works on functions,
    methods, static and class methods and ``async def`` coroutines.
    """

    __slots__ = ("_free", "_key", "_span", "name", "role", "scheduled")

    def __init__(self, name: str, *, scheduled: bool = False, role: str | None = None) -> None:
        # ``with profiled_stage("x"):`` builds one per block: a name and role checked before skip the checks
        try:
            key = _CHECKED.get((name, role))
        except TypeError:  # unhashable: not a name; the checks say what it is
            key = None
        if key is None:
            key = _check_stage(name, role)
        if scheduled is not True and scheduled is not False:
            raise TypeError(f"'scheduled' must be true or false: {scheduled!r}")
        self.name = name
        self.scheduled = scheduled
        self.role = role
        self._key = key  # the stage's name in the step timeline
        self._free = [True]  # the timeline shortcut's one slot: popped by the block that holds it (atomic)
        self._span: tuple[Any, int, int] | None = None  # that block's (timeline queue, step, start)

    def __repr__(self) -> str:
        role = "" if self.role is None else f", role={self.role!r}"
        return f"profiled_stage({self.name!r}, scheduled={self.scheduled}{role})"

    # -- as a context manager

    def __enter__(self) -> profiled_stage:
        # The decorator's shortcut on an unprofiled step with the step timeline on: two clock reads and one
        # append, no frame. The start is kept in the object's one slot (a context variable's set, the stage
        # stack's, would cost as much again) by the first block to take it whose context has no stage open;
        # one object may be entered by several threads or tasks at once, and each other block pushes its
        # own (self, queue, step, start) on its context's stage stack. Off a profiled step (and untimed) the
        # object itself is pushed, as a marker; on a profiled step or with stage metrics, a frame.
        state = STATE
        if state.engaged:
            spans = state.spans
            if spans is not None and not state.recording and state.observers is None:
                stack = _STAGES.get()
                if not stack:
                    try:
                        self._free.pop()
                    except IndexError:  # held by another thread or task
                        pass
                    else:
                        self._span = (spans, state.step, perf_counter_ns())
                        return self
                _STAGES.set((*stack, (self, spans, state.step, perf_counter_ns())))
                return self
            session = state.session
            if session is None:
                _before_configure("stage", self.name)
            else:
                frame, started = _stage_begins(session, self.name, self.scheduled, self.role)
                if frame is None:  # timed by stage metrics, not recorded
                    frame = _Frame(self.name, self.scheduled)
                    push_stage(frame)
                frame.owner, frame.started = self, started
                return self
        push_stage(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack = _STAGES.get()
        entry = _opened_by(self, stack) if stack else None
        if entry is None:  # nothing of this object's open in this context: its block holds the slot
            span = self._span
            if span is not None:
                self._span = None
                self._free.append(True)
                span[0].append((self._key, span[1], span[2], perf_counter_ns(), get_ident()))
            if exc is not None:
                _left_with(exc, self.name, self.role)
            return
        try:
            session = STATE.session
            if type(entry) is tuple:  # the shortcut's, on the stack
                drop_stage(entry)
                entry[1].append((self._key, entry[2], entry[3], perf_counter_ns(), get_ident()))
            elif isinstance(entry, _Frame) and session is not None:
                _stage_ends(session, self._key, entry, entry.started)  # drops it
            else:
                drop_stage(entry)
        finally:  # the stage has closed, as in a decorated call; then the error goes on, unchanged
            if exc is not None:
                _left_with(exc, self.name, self.role)

    # -- as a decorator

    @overload
    def __call__(self, func: staticmethod[Any, Any]) -> staticmethod[Any, Any]: ...
    @overload
    def __call__(self, func: classmethod[Any, Any, Any]) -> classmethod[Any, Any, Any]: ...
    @overload
    def __call__(self, func: _F) -> _F: ...

    def __call__(self, func: Any) -> Any:
        if isinstance(func, staticmethod):
            return staticmethod(self(func.__func__))
        if isinstance(func, classmethod):
            return classmethod(self(func.__func__))
        if not callable(func):
            raise TypeError(f"profiled_stage({self.name!r}) decorates a callable, not {func!r}")
        return _wrap(func, self.name, self.scheduled, self.role)


_CHECKED: dict[tuple[str, str | None], tuple[str, str | None, str]] = {}
"""(name, role) checked -> the stage's timeline key; bounded, so stage names made per call cannot grow it."""
_CHECKED_MAX = 4096


def _check_stage(name: Any, role: Any) -> tuple[str, str | None, str]:
    """A stage's name and role checked (the error names the field); their timeline key, remembered."""
    if callable(name):
        raise TypeError(
            'profiled_stage needs a stage name: write @profiled_stage("update_actor"), '
            f"not @profiled_stage (got {getattr(name, '__qualname__', name)!r})"
        )
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"'name' must be a non-empty stage name such as 'update_actor': {name!r}")
    naming.check_label("name", name)  # fails now, not at the first profiled step
    if role is not None:
        naming.check_label("role", role)
    key = ("stage", role, name)
    if len(_CHECKED) < _CHECKED_MAX:
        _CHECKED[name, role] = key
    return key


def _opened_by(owner: profiled_stage, stack: tuple[object, ...]) -> object:
    """What the with-block object ``owner`` pushed last on ``stack``: a shortcut's tuple, its frame, itself, or
    None (:func:`instrument.run._stages.opened_by`, and the tuples only this module pushes). Its blocks nest
    inside the one holding its slot (that one began with no stage open), so the last is the one ending."""
    for entry in reversed(stack):
        if type(entry) is tuple and entry[0] is owner:
            return entry
        if entry is owner or (isinstance(entry, _Frame) and entry.owner is owner):
            return entry
    return None


def _wrap(func: Callable[..., Any], name: str, scheduled: bool, role: str | None) -> Callable[..., Any]:  # noqa: PLR0915
    # Only plain values in the closure: Ray pickles worker classes by value. One function on purpose (PLR0915):
    # every call out of the wrapper would cost the hot path.
    state = STATE
    key = ("stage", role, name)  # the stage's name in the step timeline
    metric = (role, name)  # and in the stage metrics
    if inspect.iscoroutinefunction(func):
        return _wrap_coroutine(func, name, scheduled, role)

    @functools.wraps(func)
    def stage(*args: Any, **kwargs: Any) -> Any:
        # Python >= 3.11 enters a try block for free (zero-cost exceptions; 3.10 pays one cheap block
        # setup): the disabled path costs what it did; only an exception leaving the stage reaches the
        # OOM snapshot's hook. The disabled check and the two shortcuts stay inline (each Python call
        # would cost the hot path); the rest is the body every form shares (_stage_begins/_stage_ends).
        try:
            if not state.engaged:
                return func(*args, **kwargs)
            spans = state.spans
            if spans is not None and not state.recording and state.observers is None:
                # The step timeline on an unprofiled step (the common engaged case): two clock reads, one append.
                step = state.step
                started = perf_counter_ns()
                try:
                    return func(*args, **kwargs)
                finally:
                    spans.append((key, step, started, perf_counter_ns(), get_ident()))
            fast = state.fast
            if fast is not None and (not state.fast_thread or state.fast_thread == get_ident()):
                entry = fast.get(name)
                if entry is not None:  # (enter, arg, exit), a range and nothing else: decided once per step
                    step = state.step
                    entry[0](entry[1])
                    started = perf_counter_ns()
                    try:
                        return func(*args, **kwargs)
                    finally:
                        entry[2]()
                        if spans is not None:
                            spans.append((key, step, started, perf_counter_ns(), get_ident()))
            observers = state.observers
            if observers is not None and not state.recording:
                observe = observers.get(metric)
                if observe is not None:  # stage metrics on an unprofiled step: time, observe and the timeline
                    step = state.step
                    started = perf_counter_ns()
                    try:
                        return func(*args, **kwargs)
                    finally:
                        ended = perf_counter_ns()
                        observe((ended - started) / 1e9)
                        if spans is not None:
                            spans.append((key, step, started, ended, get_ident()))
            session = state.session
            if session is None:  # not configured: the first call is named once, at configure() or at exit
                _before_configure("stage", name)
                return func(*args, **kwargs)
            frame, began = _stage_begins(session, name, scheduled, role)
            try:
                return func(*args, **kwargs)
            finally:
                _stage_ends(session, key, frame, began)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one; the hook checks the class
            if state.on_oom is not None:
                _left_with(exc, name, role)
            raise  # bare: the same object and traceback

    return stage


def _wrap_coroutine(func: Callable[..., Any], name: str, scheduled: bool, role: str | None) -> Callable[..., Any]:
    state = STATE
    key = ("stage", role, name)

    @functools.wraps(func)
    async def stage_coroutine(*args: Any, **kwargs: Any) -> Any:
        try:  # free until something raises (zero-cost exceptions, Python >= 3.11): the OOM snapshot's hook
            if not state.engaged:
                return await func(*args, **kwargs)
            session = state.session
            if session is None:
                _before_configure("stage", name)
                return await func(*args, **kwargs)
            frame, started = _stage_begins(session, name, scheduled, role, concurrent=True)
            try:
                return await func(*args, **kwargs)  # the range covers the awaited work
            finally:
                _stage_ends(session, key, frame, started)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            if state.on_oom is not None:
                _left_with(exc, name, role)
            raise  # bare: the same object and traceback

    return stage_coroutine


def _stage_begins(
    session: Session, name: str, scheduled: bool, role: str | None, *, concurrent: bool = False
) -> tuple[_Frame | None, tuple[int, int] | None]:
    """A stage begins past the disabled check (any form): its frame on a profiled step; when it starts (and
    in which step) if metrics or the step timeline time it."""
    if STATE.recording:
        frame = session.enter_stage(name, scheduled, concurrent=concurrent, role=role)
    else:
        frame = None
        if session.step is None and session not in _refused:  # no step open (and no step below 1 refused)
            session.outside_step(f"stage {name!r}")
    return frame, ((perf_counter_ns(), STATE.step) if session.engaged else None)


def _spans(session: Session) -> Any:
    """The timeline's queue: the hot path's copy, or (no step open: the hot path's is cleared) the run's own."""
    spans = STATE.spans
    if spans is None and session.timeline is not None and not session.finished:
        spans = session.timeline.pending
    return spans


def _stage_ends(session: Session, key: tuple[str, str | None, str], frame: _Frame | None, began: Any) -> None:
    """The stage of :func:`_stage_begins` ends (also when it raised): observe its time, record its span in the
    timeline, close its frame. ``key``: the stage's ``(kind, role, name)``."""
    if began is not None:
        started, step = began
        ended = perf_counter_ns()
        if session.metrics is not None:
            session.observe_stage(key[2], (ended - started) / 1e9, role=key[1])
        spans = _spans(session)
        if spans is not None:
            spans.append((key, step, started, ended, get_ident()))
    if frame is not None:
        session.exit_stage(frame)


class _Window:
    """The context manager ``profile_window`` returns on profiled steps, with stage metrics or the timeline on."""

    __slots__ = ("_close", "_frame", "_recording", "_session", "_started", "_step", "mini_batch")

    def __init__(self, session: Session, mini_batch: int) -> None:
        self._session = session
        self.mini_batch = mini_batch
        self._recording = STATE.recording
        self._step = STATE.step
        self._frame: Any = None
        self._close: Any = None
        self._started = 0

    def __enter__(self) -> _Window:
        if self._recording:
            self._frame, self._close = self._session.enter_window(self.mini_batch)
        self._started = perf_counter_ns()
        return self

    def __exit__(self, *exc_info: object) -> None:
        ended = perf_counter_ns()
        if self._session.metrics is not None:
            self._session.observe_stage("mini_batch", (ended - self._started) / 1e9)
        spans = _spans(self._session)
        if spans is not None:
            spans.append((("window", None, f"mb{self.mini_batch}"), self._step, self._started, ended, get_ident()))
        if self._recording:
            self._session.exit_window(self._frame, self._close)


class _Idle:
    """The shared, do-nothing context manager of unprofiled steps and ranks.

    Its ``__enter__`` and ``__exit__`` are C callables, set below, not Python methods: this is the
    hot path of every mini-batch, and two Python calls would double its cost. ``__enter__``
    returns the object itself; ``__exit__`` is ``"".format``, which ignores its three arguments and
    returns ``""`` (false: exceptions pass through unchanged).
    """

    __slots__ = ()

    if TYPE_CHECKING:  # what type checkers (ours and users') see

        def __enter__(self) -> _Idle: ...
        def __exit__(self, *exc_info: object) -> None: ...


_IDLE = _Idle()
_Idle.__enter__ = itertools.repeat(_IDLE).__next__  # type: ignore[assignment,method-assign]
_Idle.__exit__ = "".format  # type: ignore[assignment,method-assign]


def profile_window(*, mini_batch: int) -> _Window | _Idle:
    """Mark one optimizer update (``mini_batch`` counts from 0); in a scheduled stage it advances the schedule."""
    if not STATE.engaged:
        return _IDLE
    session = STATE.session
    if session is None:
        _before_configure("profile_window")
        return _IDLE
    return _Window(session, mini_batch)


class profile_step:  # noqa: N801 - a context manager read as a verb
    """Open and close profiling for RL step ``step``: ``with profile_step(step, last=(step == n)):``.

    Profiling happens only if the step and this rank are selected. ``last=True`` runs the finish
    hook after this step, even if it is not profiled.
    """

    __slots__ = ("last", "step")

    def __init__(self, step: int, *, last: bool = False) -> None:
        _check_step(step)
        self.step = step
        self.last = bool(last)

    def __enter__(self) -> profile_step:
        session = STATE.session
        if session is None:
            _before_configure("profile_step")
        else:
            _open_step(session, self.step)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        end_step(last=self.last, failed=exc_type is not None)
