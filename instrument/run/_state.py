"""The flags the hot path reads, one object per process (no imports: everything may import it)."""

from __future__ import annotations

from typing import Any

__all__ = ["STATE"]


class _State:
    """``recording``: a profiled step is open on this rank; ``engaged``: recording, stage metrics or the
    step timeline on (decorated calls leave the disabled path); ``session``: the run of this process, if any.

    ``spans``: with the step timeline on, the writer's queue (:class:`instrument.run._timeline.TimelineWriter`):
    decorated calls append ``(name, step, start_ns, end_ns, thread)`` to it; ``step``: the open step (0: none).

    ``fast``: on a profiled step whose recorder offers the per-call fast path
    (:class:`instrument.recorders.FastRanges`; no metrics), stage name -> its ``(enter, arg, exit)``
    range, filled by the first call of each name; read by decorated calls on ``fast_thread`` (0: any
    thread) instead of the session's bookkeeping.
    ``observers``: with stage metrics on, the same idea for unprofiled steps (time and observe).
    ``on_oom``: with ``memory.on_oom``, called as ``on_oom(exc, stage, role)`` by a stage an exception
    leaves (only then: the normal path never reads it).

    ``early``: whether a stage, window or step was called before ``configure`` (``early_first`` names the
    first; later ones take the free path again); ``configure`` or the interpreter's exit names it once.
    """

    __slots__ = (
        "early",
        "early_first",
        "engaged",
        "fast",
        "fast_thread",
        "observers",
        "on_oom",
        "recording",
        "session",
        "spans",
        "step",
    )

    recording: bool
    engaged: bool
    session: Any  # instrument.run._session.Session (not imported: no cycle)
    fast: dict[str, Any] | None  # stage -> instrument.recorders.FastRange, or None
    fast_thread: int
    observers: dict[tuple[str | None, str], Any] | None  # with stage metrics: (role, stage) -> bound observe
    on_oom: Any  # instrument.recorders.memory.OomSnapshots, or None
    spans: Any  # collections.deque of span tuples, or None
    step: int
    early: int
    early_first: str | None

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Not configured: no run, nothing recorded, no fast path, observers, OOM hook or timeline (closes nothing).

        ``engaged`` is true: the first call made before ``configure`` leaves the disabled path for the branch
        that finds no session, where it is noted (a configured run sets its own flags).
        """
        self.session = None
        self.recording = False
        self.engaged = True
        self.fast = self.observers = self.on_oom = self.spans = None
        self.fast_thread = self.step = self.early = 0
        self.early_first = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Decorated methods hold this object in their closure, and Ray pickles worker classes
        # by value: unpickling must give the receiving process's own state, not a frozen copy.
        return (_process_state, ())


STATE = _State()


def _process_state() -> _State:
    return STATE
