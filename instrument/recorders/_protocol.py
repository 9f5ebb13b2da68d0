"""What a recorder is to the session: the values it receives and the calls it answers (no imports of recorders)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from instrument.manifest import TraceRecord
from instrument.naming import TraceIdentity
from instrument.schedule import ScheduleLike

__all__ = ["FastRange", "FastRanges", "FastScope", "Publish", "Recorder", "RecorderFactory", "Report", "TraceSpec"]

Publish = Callable[[TraceRecord], None]
"""Called by a recorder (from any thread) for each complete file it saved in ``save_path``."""
Report = Callable[[str, BaseException], None]
"""Called by a recorder for a failure it absorbed: what failed, and the exception."""


@dataclass(frozen=True, kw_only=True)
class TraceSpec(TraceIdentity):
    """What one trace is of (its identity: the values its file name and manifest line are made from),
    where it goes and what it records. ``window`` and ``partial`` are the recorder's to fill in per file.

    Options of one recorder are not here: its factory receives them (``register(..., options=)``).
    """

    save_path: str
    contents: tuple[str, ...]
    schedule: ScheduleLike | None = None


class Recorder(Protocol):
    """What the session drives. Built by its factory (see :func:`instrument.recorders.register`);
    only the session calls it, under its lock."""

    tool: str
    stage_range_in_windows: bool  # whether a windowed stage also gets a stage range

    @property
    def windows_saved(self) -> int: ...  # traces (or capture ranges) saved since the last start
    @property
    def tracing(self) -> bool: ...
    def on_step(self, role: str, step: int) -> None: ...
    def start(self, spec: TraceSpec) -> None: ...
    def window_step(self) -> None: ...
    def stop(self) -> None: ...
    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]: ...
    def flush(self) -> None: ...  # block until every file saved so far is published
    def close(self) -> None: ...  # stop, flush, release threads and folders


RecorderFactory = Callable[..., Recorder]
"""Builds a recorder: ``factory(publish, report)``, or ``factory(publish, report, options=...)`` when its
registration names options (a recorder class is a factory)."""

FastRange = tuple[Callable[[Any], object], Any, Callable[[], object]]
"""``(enter, arg, exit)``: a decorated call runs ``enter(arg)``, then itself, then ``exit()`` (also when it
raised). Plain callables, so the call pays for no wrapper of ours (an NVTX push and pop, say)."""

FastScope = Literal["any thread", "step thread"]
"""Where decorated calls may open their own ranges: on any thread (the ranges belong to no trace, such as
NVTX push/pop), or only on the thread that began the step (the ranges lie in its trace)."""


@runtime_checkable
class FastRanges(Protocol):
    """Optional part of a recorder: on a step where a stage needs nothing but a range, decorated calls open it
    themselves (the per-call fast path) instead of going through the session. Implement both methods to offer it.

    The session asks :meth:`fast_ranges` once per profiled step without stage metrics, then :meth:`fast_range`
    once per stage name and step, when that stage's first call went through the session. In continuous mode
    the range lies in the step's trace; in discrete mode it stands for the stage's own trace (NVTX: a capture
    range and a range), and is asked only of a stage that opened its trace and has no schedule.
    """

    def fast_ranges(self, *, discrete: bool) -> FastScope | None:
        """Whether decorated calls may open their ranges themselves on steps of this mode, and where (``None``: no)."""
        ...

    def fast_range(self, name: str, *, discrete: bool) -> FastRange | None:
        """How a decorated call of stage ``name`` opens its range, or ``None``: its calls go through the session."""
        ...
