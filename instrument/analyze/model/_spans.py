"""The spans an analysis keeps for drawing: one process's timeline spans on the report's axis as columns
(:class:`TimelineLane`), and all of them (:class:`TimelineSpans`): what the page, the picture and the merged trace
draw, never in ``--json``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from instrument.timeline import SpanColumns, SpanTable

if TYPE_CHECKING:
    from instrument.timeline import Span

__all__ = ["SpanRow", "TimelineLane", "TimelineSpans"]


def _column(code: str, values: Sequence[int]) -> array[int]:
    """``values`` as an array of ``code``: the same array when it is one already (columns read are not changed)."""
    return values if isinstance(values, array) and values.typecode == code else array(code, values)


SpanRow = tuple[str, str, str, int, int, int, int]
"""One span of a :class:`TimelineLane`: kind, role, stage, step, start ns, end ns, thread index."""


@dataclass(frozen=True)
class TimelineLane:
    """One process's timeline spans on the report's axis (ns since its first span), as columns.

    Columns, not :class:`~instrument.timeline.Span` objects: at 4,096 ranks a report holds millions of
    spans, 24 bytes each here against ~150 as objects. Span ``i`` is ``names[name[i]]`` (kind, role,
    stage) with ``step[i]``, ``start_ns[i]``, ``end_ns[i]`` and ``thread[i]`` (the file's thread index)."""

    role: str
    rank: int
    host: str
    pid: int
    names: tuple[tuple[str, str, str], ...]
    name: array[int]
    step: array[int]
    start_ns: array[int]
    end_ns: array[int]
    thread: array[int]

    @classmethod
    def of(
        cls,
        *,
        role: str,
        rank: int,
        host: str,
        pid: int,
        spans: Iterable[Span] | SpanColumns | SpanTable,
        shift_ns: int = 0,
    ) -> TimelineLane:
        """The lane of one process's spans, each moved by ``-shift_ns``.

        Columns (a :class:`SpanColumns`, or a :class:`SpanTable` of one part) are copied as columns, no Span
        made; their name, step and thread columns are shared, not copied, where they already fit."""
        if isinstance(spans, SpanTable) and len(spans.parts) == 1:
            columns, part_shift = spans.parts[0]
            return cls._of_columns(role, rank, host, pid, columns, shift_ns + part_shift)
        if isinstance(spans, SpanColumns):
            return cls._of_columns(role, rank, host, pid, spans, shift_ns)
        index: dict[tuple[str, str, str], int] = {}
        name, step, start, end, thread = array("H"), array("I"), array("q"), array("q"), array("H")
        for span in spans:
            key = (span.kind, span.role, span.stage)
            name.append(index.setdefault(key, len(index)))
            step.append(span.step)
            start.append(span.start_ns - shift_ns)
            end.append(span.end_ns - shift_ns)
            thread.append(span.thread)
        return cls(role, rank, host, pid, tuple(index), name, step, start, end, thread)

    @classmethod
    def _of_columns(
        cls, role: str, rank: int, host: str, pid: int, columns: SpanColumns, shift_ns: int
    ) -> TimelineLane:
        # The lane its Span values give (names in the order first used), no Span made.
        index: dict[tuple[str, str, str], int] = {}
        remap = {n: index.setdefault(columns.names[n], len(index)) for n in dict.fromkeys(columns.name)}
        if all(n == m for n, m in remap.items()):
            name = _column("H", columns.name)
        else:
            name = array("H", map(remap.__getitem__, columns.name))
        start = array("q", [s - shift_ns for s in columns.start_ns] if shift_ns else columns.start_ns)
        end = array("q", map(int.__add__, start, columns.duration_ns))
        step, thread = _column("I", columns.step), _column("H", columns.thread)
        return cls(role, rank, host, pid, tuple(index), name, step, start, end, thread)

    @property
    def label(self) -> str:
        """``actor rank 3``."""
        return f"{self.role} rank {self.rank}"

    def __len__(self) -> int:
        return len(self.name)

    def rows(self) -> Iterator[SpanRow]:
        """Every span as (kind, role, stage, step, start ns, end ns, thread), in the file's order."""
        names = self.names
        columns = (self.name, self.step, self.start_ns, self.end_ns, self.thread)
        for n, step, start, end, thread in zip(*columns, strict=True):
            kind, role, stage = names[n]
            yield kind, role, stage, step, start, end, thread


@dataclass(frozen=True)
class TimelineSpans:
    """The spans the step analysis kept, per process on one axis: what the page, the picture and the merged
    trace draw (never in ``--json``).

    ``aligned`` false: the hosts' clocks are not aligned, and each host was shifted so that its first step
    starts with the reference host's (``note`` says so): durations are right, cross-host timing is not."""

    lanes: tuple[TimelineLane, ...]  # by (role, rank, pid)
    aligned: bool
    note: str | None = None

    @property
    def spans(self) -> int:
        """How many spans the lanes hold."""
        return sum(len(lane) for lane in self.lanes)
