"""The column helpers of one step's analysis agree with the plain rules they stand for (pure; random inputs)."""

from __future__ import annotations

import statistics
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze.analyzers._timeline import _peer_median
from instrument.analyze.analyzers._timeline_step import _index_disjoint, _index_general, _index_ordered
from instrument.analyze.model import RankTable

PROPERTY = settings(max_examples=200, deadline=None)


@st.composite
def lanes(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, int]], list[bool]]:
    """A lane's stages as sorted (start, -end, thread, stage number) rows: sequential, nested, touching or
    overlapping; and which stage numbers are generation."""
    stages = draw(st.integers(1, 5))
    rows = []
    t = draw(st.integers(-(10**12), 10**12))
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.integers(-30, 60))
        rows.append((t, -(t + draw(st.integers(1, 80))), draw(st.integers(0, 2)), draw(st.integers(0, stages - 1))))
    rows.sort()
    return rows, draw(st.lists(st.booleans(), min_size=stages, max_size=stages))


@PROPERTY
@given(lane=lanes(), index=st.integers(0, 6), extra=st.integers(1, 5))
def test_a_lane_of_disjoint_stages_is_indexed_as_the_general_loop_does(
    lane: tuple[list[tuple[int, int, int, int]], list[bool]], index: int, extra: int
) -> None:
    rows, generation = lane
    count = index + extra
    general = _index_general(rows, generation, index, count)
    fast = _index_disjoint(rows, generation, index, count)
    starts, ends = [a for a, _, _, _ in rows], [-b for _, b, _, _ in rows]
    disjoint = all(ends[i] < starts[i + 1] for i in range(len(rows) - 1))
    assert (fast is not None) == disjoint
    if fast is not None:
        assert [list(part) if isinstance(part, tuple) else part for part in fast] == list(general)
        threads, kids = [r[2] for r in rows], [r[3] for r in rows]
        assert _index_ordered(starts, ends, threads, kids, generation, index, count) == fast


@PROPERTY
@given(values=st.lists(st.integers(1, 50), min_size=2, max_size=12))
def test_a_peer_median_is_the_median_of_the_others(values: list[int]) -> None:
    values.sort()
    medians = [_peer_median(values, i) for i in range(len(values))]
    assert medians == [statistics.median(values[:i] + values[i + 1 :]) for i in range(len(values))]
    assert all(a >= b for a, b in pairwise(medians))  # what the straggler search relies on


causes = st.sampled_from([("actor", "update"), ("rollout", "generate"), (None, "unattributed"), ("", "x")])


@PROPERTY
@given(
    numbered=st.booleans(),
    lanes_=st.lists(st.lists(st.tuples(causes, st.integers(-1, 9), st.integers(0, 10**13)), max_size=5), max_size=4),
)
def test_waits_in_ms_read_from_the_columns_are_the_waits(
    numbered: bool, lanes_: list[list[tuple[tuple[str | None, str], int, int]]]
) -> None:
    table = RankTable([("actor", "update"), (None, "unattributed"), ("rollout", "generate"), ("", "x")])
    for rank, waits in enumerate(lanes_):
        if numbered:
            ids = [table.causes.index(cause) for cause, _, _ in waits]
            ranks = [-1 if cause[0] is None else k for cause, k, _ in waits]
            table.add_numbered(rank, "actor", 1, 2, ids, ranks, [ns for _, _, ns in waits])
        else:
            rows = [(role, stage, None if role is None else k, ns) for (role, stage), k, ns in waits]
            table.add(rank, "actor", 1, 2, rows)
    for lane in range(len(table)):
        expected = [(role, stage, rank, ns / 1_000_000) for role, stage, rank, ns in table.waits(lane)]
        assert list(table.waits_ms(lane)) == expected
