"""The column helpers of one step's analysis agree with the plain rules they stand for (pure; random inputs)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze.analyzers._findings import _waits_for
from instrument.analyze.analyzers._timeline import _peer_median
from instrument.analyze.analyzers._timeline_step import (
    _attribute,
    _columns,
    _index_disjoint,
    _index_general,
    _index_ordered,
    _ms_sums,
)
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


@PROPERTY
@given(
    lanes_=st.lists(
        st.tuples(st.sampled_from(["actor", "rollout"]), st.integers(0, 9), st.integers(0, 99), st.integers(0, 99)),
        max_size=5,
    ),
    waits=st.data(),
)
def test_lanes_added_as_columns_are_the_lanes_added_one_by_one(
    lanes_: list[tuple[str, int, int, int]], waits: st.DataObject
) -> None:
    lanes_.sort()
    rows = [
        waits.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 9), st.integers(1, 99)), max_size=4))
        for _ in lanes_
    ]
    causes = [("actor", "update"), (None, "unattributed"), ("rollout", "generate"), ("", "x")]
    one_by_one, at_once = RankTable(causes), RankTable(causes)
    one_by_one.add_numbered(7, "ref", 1, 1, [0], [3], [5])  # a lane there before
    at_once.add_numbered(7, "ref", 1, 1, [0], [3], [5])
    for (role, rank, busy, idle), waits_ in zip(lanes_, rows, strict=True):
        one_by_one.add_numbered(rank, role, busy, idle, *([list(c) for c in zip(*waits_, strict=True)] or [[], [], []]))
    flat = [w for waits_ in rows for w in waits_]
    bounds = [0]
    for waits_ in rows:
        bounds.append(bounds[-1] + len(waits_))
    at_once.add_lanes(
        [rank for _, rank, _, _ in lanes_],
        [role for role, _, _, _ in lanes_],
        [busy for _, _, busy, _ in lanes_],
        [idle for _, _, _, idle in lanes_],
        bounds,
        [c for c, _, _ in flat],
        [k for _, k, _ in flat],
        [ns for _, _, ns in flat],
    )
    assert at_once == one_by_one
    assert (at_once.roles, list(at_once.role), list(at_once.at)) == (
        one_by_one.roles,
        list(one_by_one.role),
        list(one_by_one.at),
    )


@PROPERTY
@given(pairs=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 10**12)), max_size=30))
def test_ms_sums_add_in_the_order_given(pairs: list[tuple[int, int]]) -> None:
    expected: dict[int, float] = {}
    for kid, ns in pairs:
        expected[kid] = expected.get(kid, 0.0) + ns / 1_000_000
    got = _ms_sums([kid for kid, _ in pairs], [ns for _, ns in pairs])
    assert list(got.items()) == list(expected.items())  # the same floats, the same order


@st.composite
def indexes(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, int, int, int, int]], ...]:
    """1-3 roles' role indexes (sorted entries, as a step makes them) over lanes 0-5, times on a coarse grid."""
    roles = []
    for _ in range(draw(st.integers(1, 3))):
        entries = []
        for _ in range(draw(st.integers(0, 8))):
            a, lane = draw(st.integers(0, 40)), draw(st.integers(0, 5))
            b, thread, kid = a + draw(st.integers(1, 15)), draw(st.integers(0, 1)), draw(st.integers(0, 3))
            entries.append((b, -lane, -a, -thread, a, lane, kid * 7 + lane))
        roles.append(sorted(set(entries)))
    return tuple(roles)


def latest(entries: Sequence[tuple[int, ...]], low: int, high: int, before: int, lane: int) -> tuple[int, ...] | None:
    """The rule, by a scan: the latest-ending entry in [low, high] that started before ``before``, not on ``lane``."""
    fits = [e for e in entries if low <= e[0] <= high and e[4] < before and e[5] != lane]
    return max(fits) if fits else None


@PROPERTY
@given(
    roles=indexes(),
    gaps=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20), st.integers(0, 5)), min_size=1, max_size=10),
    unc=st.integers(0, 5),
    tol=st.integers(0, 10),
)
def test_the_gaps_of_a_role_are_attributed_as_one_by_one(
    roles: tuple[list[tuple[int, int, int, int, int, int, int]], ...],
    gaps: list[tuple[int, int, int]],
    unc: int,
    tol: int,
) -> None:
    unattributed, width = 4 * 7 + 6, 100
    own, others = roles[0], roles[1:]
    a_s, b_s, lanes_ = [a for a, _, _ in gaps], [a + d for a, d, _ in gaps], [li for _, _, li in gaps]
    waited: dict[int, int] = {}
    columns = [_columns([e[0] for e in entries], list(entries), unattributed) for entries in roles]
    _attribute(a_s, b_s, lanes_, columns[1:], columns[0], unc, unc + tol, width, unattributed, waited)
    expected: dict[int, int] = {}
    for a, b, li in zip(a_s, b_s, lanes_, strict=True):
        low, high = max(b - unc - tol, a - unc), b + unc
        found = [e for e in (latest(entries, low, high, b, -1) for entries in others) if e is not None]
        best = max(found) if found else latest(own, low, high, b, li)
        key = li * width + (unattributed if best is None else best[6])
        expected[key] = expected.get(key, 0) + b - a
    assert waited == expected


@PROPERTY
@given(
    lanes_=st.lists(
        st.tuples(
            st.sampled_from(["actor", "rollout"]),
            st.integers(0, 5),
            st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 10**9)), max_size=5),
        ),
        max_size=6,
    ),
    targets=st.lists(st.tuples(causes, st.integers(-1, 6), st.booleans()), max_size=5),
)
def test_the_stragglers_waits_read_from_the_columns_are_the_rows_waits(
    lanes_: list[tuple[str, int, list[tuple[int, int, int]]]],
    targets: list[tuple[tuple[str | None, str], int, bool]],
) -> None:
    table = RankTable([("actor", "update"), (None, "unattributed"), ("rollout", "generate"), ("", "x")])
    for role, rank, waits in lanes_:
        ranks = [-1 if table.causes[c][0] is None else k for c, k, _ in waits]
        table.add_numbered(rank, role, 1, 2, [c for c, _, _ in waits], ranks, [ns for _, _, ns in waits])
    wanted = {
        (role, stage, rank): ((role, rank), {3} if on_step else {4})
        for (role, stage), rank, on_step in targets
        if role is not None
    }
    expected: dict[tuple[str, int], dict[str, dict[tuple[int, int], float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    for row in table:  # the rule as stragglers reads a step's rows
        for cause_role, cause_stage, cause_rank, ms in row.waits():
            if cause_role is None or cause_rank is None:
                continue
            found = wanted.get((cause_role, cause_stage, cause_rank))
            if found is not None and 3 in found[1]:
                expected[found[0]][row.role][(row.rank, 3)] += ms
    got: dict[tuple[str, int], dict[str, dict[tuple[int, int], float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    _waits_for(table, 3, wanted, got, defaultdict(lambda: defaultdict(lambda: defaultdict(float))))
    assert {k: {r: dict(v) for r, v in by.items()} for k, by in got.items()} == {
        k: {r: dict(v) for r, v in by.items()} for k, by in expected.items()
    }
