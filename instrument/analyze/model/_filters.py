"""What an analysis keeps: :class:`Filters` (``--ranks``, ``--steps``, ``--stage``; the analysis, the comparison
and the ``--layout`` export choose files with the same one) over :class:`IntRanges`, sets of non-negative ints
kept as sorted, disjoint intervals.

``--ranks 0-999999999999`` is one interval, not a trillion ints: membership is a binary search and the
size follows the number of intervals the user typed, never the numbers in them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from instrument.analyze.model._report import TraceFile, label_key

__all__ = ["Filters", "IntRanges"]


class IntRanges:
    """Non-negative ints as closed intervals ``(first, last)``; ``value in ranges`` is O(log intervals).

    Iterating yields the ints one at a time (a huge interval is never held as a list): use membership,
    not ``frozenset(ranges)``, where the intervals may be large.
    """

    __slots__ = ("_firsts", "_lasts")

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[tuple[int, int]] = []
        for first, last in sorted(intervals):
            if first < 0 or last < first:
                raise ValueError(f"bad interval {first}-{last}")
            if merged and first <= merged[-1][1] + 1:  # overlapping or adjacent: one interval
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        self._firsts = [first for first, _ in merged]
        self._lasts = [last for _, last in merged]

    @classmethod
    def of(cls, values: Iterable[int]) -> IntRanges:
        """The ranges holding exactly ``values`` (kept as they are when already an ``IntRanges``)."""
        if isinstance(values, IntRanges):
            return values
        return cls((value, value) for value in values)

    @property
    def intervals(self) -> tuple[tuple[int, int], ...]:
        """The sorted, disjoint, non-adjacent ``(first, last)`` pairs."""
        return tuple(zip(self._firsts, self._lasts, strict=True))

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        at = bisect.bisect_right(self._firsts, value) - 1
        return at >= 0 and value <= self._lasts[at]

    def __iter__(self) -> Iterator[int]:
        for first, last in zip(self._firsts, self._lasts, strict=True):
            yield from range(first, last + 1)

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in zip(self._firsts, self._lasts, strict=True))

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IntRanges):
            return self.intervals == other.intervals
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.intervals)

    def __repr__(self) -> str:
        return f"IntRanges({str(self)!r})"

    def __str__(self) -> str:
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.intervals)


def _ints(values: Iterable[int] | None, name: str) -> IntRanges | None:
    if values is None:
        return None
    if isinstance(values, IntRanges):
        return values  # already intervals (``--ranks 0-999999999999``): never expanded
    out = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"'{name}' must hold non-negative ints: {value!r}")
        out.add(value)
    return IntRanges.of(out)


@dataclass(frozen=True)
class Filters:
    """What ``--ranks``, ``--steps`` and ``--stage`` keep (``None``: everything); stages as label keys."""

    ranks: IntRanges | None
    steps: IntRanges | None
    stages: frozenset[str] | None

    @classmethod
    def of(
        cls,
        ranks: Iterable[int] | None = None,
        steps: Iterable[int] | None = None,
        stages: Iterable[str] | str | None = None,
        all_ranks: bool = True,
    ) -> Filters:
        """The filters of :func:`~instrument.analyze.analyze`'s arguments; ``ValueError`` for a bad one.

        ``ranks=None`` keeps every rank unless ``all_ranks=False``, which keeps rank 0.
        """
        rank_filter = _ints(ranks, "ranks")
        if rank_filter is None and not all_ranks:
            rank_filter = IntRanges.of([0])
        if isinstance(stages, str):
            stages = [stages]
        return cls(
            ranks=rank_filter,
            steps=_ints(steps, "steps"),
            stages=None if stages is None else frozenset(label_key(s) for s in stages),
        )

    def keeps(self, trace: TraceFile) -> bool:
        """Whether ``trace`` is read at all (a file holding several steps or stages is filtered by segment)."""
        if self.ranks is not None and (trace.rank is None or trace.rank not in self.ranks):
            return False
        if self.steps is not None and not trace.inside and trace.step not in self.steps:
            return False  # a file whose steps lie inside it is filtered by segment
        # a continuous trace holds every stage: its segments are filtered after reading
        return self.stages is None or trace.continuous or trace.inside or label_key(trace.stage) in self.stages

    def keeps_stage(self, stage: str) -> bool:
        """Whether a segment of this stage counts."""
        return self.stages is None or label_key(stage) in self.stages
