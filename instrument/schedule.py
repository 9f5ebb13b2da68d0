"""Schedule math for mini-batch profiling windows (pure; standard library only).

A scheduled stage counts its ``profile_window`` calls from 0; the profiler's
step number during mini-batch ``i`` is ``i``.  :func:`action_at` answers what
``torch.profiler.schedule`` would answer for that step, :func:`window_of` says
which recorded window a step belongs to, and :func:`plan` lists the windows a
stage with ``num_mini_batches`` mini-batches really saves, the last one marked
``partial`` when the loop ends inside it.  :func:`window_series` answers the same
by arithmetic, as a lazy sequence, for loops too long to list.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

__all__ = [
    "Action",
    "ScheduleLike",
    "Window",
    "WindowSeries",
    "action_at",
    "first_recorded",
    "plan",
    "recorded",
    "window_of",
    "window_series",
]


class Action(enum.Enum):
    """What the profiler does during one step; names and values match ``torch.profiler.ProfilerAction``."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class ScheduleLike(Protocol):
    """Anything with the fields of :class:`instrument.Schedule`."""

    @property
    def skip_first(self) -> int: ...
    @property
    def wait(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def active(self) -> int: ...
    @property
    def repeat(self) -> int: ...
    @property
    def skip_first_wait(self) -> bool: ...


@dataclass(frozen=True)
class Window:
    """Mini-batches ``first..last`` (inclusive) saved as one trace; ``partial`` if the loop ended inside it."""

    first: int
    last: int
    partial: bool = False

    @property
    def size(self) -> int:
        """Number of mini-batches in the window."""
        return self.last - self.first + 1


def _cycle_position(step_num: int, schedule: ScheduleLike) -> tuple[int, int] | None:
    """Return ``(shifted_step, cycle_length)``, or ``None`` outside every cycle."""
    if isinstance(step_num, bool) or not isinstance(step_num, int):
        raise TypeError(f"'step_num' must be an int: {step_num!r}")
    if step_num < 0:
        raise ValueError(f"'step_num' must be >= 0: {step_num}")
    if step_num < schedule.skip_first:
        return None
    shifted = step_num - schedule.skip_first
    if schedule.skip_first_wait:
        shifted += schedule.wait
    cycle = schedule.wait + schedule.warmup + schedule.active
    if schedule.repeat > 0 and shifted >= schedule.repeat * cycle:
        return None
    return shifted, cycle


def action_at(step_num: int, schedule: ScheduleLike) -> Action:
    """Return the profiler action for ``step_num`` (0-based), exactly as ``torch.profiler.schedule``."""
    position = _cycle_position(step_num, schedule)
    if position is None:
        return Action.NONE
    shifted, cycle = position
    offset = shifted % cycle
    if offset < schedule.wait:
        return Action.NONE
    if offset < schedule.wait + schedule.warmup:
        return Action.WARMUP
    return Action.RECORD if offset < cycle - 1 else Action.RECORD_AND_SAVE


def recorded(step_num: int, schedule: ScheduleLike) -> bool:
    """Whether mini-batch ``step_num`` is recorded (RECORD or RECORD_AND_SAVE)."""
    return action_at(step_num, schedule) in (Action.RECORD, Action.RECORD_AND_SAVE)


def window_of(step_num: int, schedule: ScheduleLike) -> tuple[int, int]:
    """Return the full ``(first, last)`` window that the recorded step ``step_num`` belongs to.

    Raises ``ValueError`` when ``step_num`` is not recorded by ``schedule``.
    """
    action = action_at(step_num, schedule)
    if action not in (Action.RECORD, Action.RECORD_AND_SAVE):
        raise ValueError(f"step {step_num} is not recorded by {schedule!r} (action {action.name})")
    position = _cycle_position(step_num, schedule)
    assert position is not None  # recorded steps lie inside a cycle
    shifted, cycle = position
    cycle_start = step_num - shifted % cycle
    first = cycle_start + schedule.wait + schedule.warmup
    return first, cycle_start + cycle - 1


def first_recorded(schedule: ScheduleLike) -> int:
    """The first mini-batch the schedule records (if the loop is long enough)."""
    return schedule.skip_first + (0 if schedule.skip_first_wait else schedule.wait) + schedule.warmup


@dataclass(frozen=True)
class WindowSeries(Sequence[Window]):
    """The windows of :func:`plan` without listing them: window ``k`` starts at ``start + k * cycle``.

    Indexing and ``total`` cost O(1) however long the loop, so a plan over 10**8
    mini-batches with ``repeat=0`` stays cheap; ``len()`` works while ``total``
    fits a machine integer.
    """

    start: int
    cycle: int
    active: int
    end: int
    total: int

    def _at(self, k: int) -> Window:
        first = self.start + k * self.cycle
        last = first + self.active - 1
        return Window(first, last) if last < self.end else Window(first, self.end - 1, partial=True)

    @overload
    def __getitem__(self, index: int) -> Window: ...
    @overload
    def __getitem__(self, index: slice) -> list[Window]: ...
    def __getitem__(self, index: int | slice) -> Window | list[Window]:
        positions = range(self.total)  # a range does the index arithmetic, big ints included
        if isinstance(index, slice):
            return [self._at(k) for k in positions[index]]
        return self._at(positions[index])

    def __len__(self) -> int:
        return self.total

    def __bool__(self) -> bool:
        return self.total > 0

    def __iter__(self) -> Iterator[Window]:
        return (self._at(k) for k in range(self.total))


def window_series(num_mini_batches: int, schedule: ScheduleLike) -> WindowSeries:
    """The windows a stage of ``num_mini_batches`` mini-batches saves, computed, not enumerated.

    Equal, item by item, to :func:`plan`: every cycle records ``active`` mini-batches
    starting ``first_recorded`` + a whole number of cycles, up to ``repeat`` cycles
    (``0``: unbounded) and as far as the loop goes; the last window is ``partial``
    when the loop ends inside it.
    """
    if isinstance(num_mini_batches, bool) or not isinstance(num_mini_batches, int):
        raise TypeError(f"'num_mini_batches' must be an int: {num_mini_batches!r}")
    if num_mini_batches < 0:
        raise ValueError(f"'num_mini_batches' must be >= 0: {num_mini_batches}")
    cycle = schedule.wait + schedule.warmup + schedule.active
    start = first_recorded(schedule)
    # Windows start at start, start + cycle, ...: those starting before the loop ends are saved.
    total = 0 if num_mini_batches <= start else (num_mini_batches - start - 1) // cycle + 1
    if schedule.repeat > 0:
        total = min(total, schedule.repeat)
    return WindowSeries(start=start, cycle=cycle, active=schedule.active, end=num_mini_batches, total=total)


def plan(num_mini_batches: int, schedule: ScheduleLike) -> list[Window]:
    """List the windows a stage of ``num_mini_batches`` mini-batches saves, in order.

    This is what ``torch.profiler.profile(schedule=...)`` hands to ``on_trace_ready``
    when ``step()`` follows every mini-batch and ``stop()`` follows the loop; a
    window cut short by the end of the loop is ``partial``.  A window that would
    hold no mini-batch is not listed (the backend writes nothing for it).
    """
    if isinstance(num_mini_batches, bool) or not isinstance(num_mini_batches, int):
        raise TypeError(f"'num_mini_batches' must be an int: {num_mini_batches!r}")
    if num_mini_batches < 0:
        raise ValueError(f"'num_mini_batches' must be >= 0: {num_mini_batches}")
    windows: list[Window] = []
    cycle = schedule.wait + schedule.warmup + schedule.active
    # The first recorded step, then jump cycle by cycle: O(windows), not O(mini-batches).
    step = first_recorded(schedule)
    while step < num_mini_batches and recorded(step, schedule):
        first, last = window_of(step, schedule)
        if last < num_mini_batches:
            windows.append(Window(first, last))
        else:
            windows.append(Window(first, num_mini_batches - 1, partial=True))
        step = first + cycle
    return windows
