"""The analysis of a step's timeline: busy and idle, who waited for whom, the critical path, stragglers, findings.

Every input is built with exact durations (ns on one made-up clock): no clock is read and nothing sleeps.
The properties run on random layouts; the examples check the numbers of a known layout.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze.analyzers._timeline import (
    IDLE,
    UNALIGNED_NOTE,
    UNATTRIBUTED,
    WAIT_TOLERANCE_NS,
    analyze_timeline,
)
from instrument.analyze.model import RankTable, RankTimeline, TimelineLane, TimelineReport, TimeShare, findings_text
from instrument.analyze.traces._timelines import align, find_timelines
from instrument.naming import TIMELINE_SUFFIX
from instrument.timeline import (
    Span,
    SpanColumns,
    SpanTable,
    encode_clock,
    encode_header,
    encode_name,
    encode_span,
    encode_thread,
)

MS = 1_000_000
PROPERTY = settings(max_examples=60, deadline=None)


def stage(role: str, name: str, rank: int, start_ms: float, end_ms: float, step: int = 1, thread: int = 0) -> Span:
    return Span("stage", role, name, step, rank, round(start_ms * MS), round(end_ms * MS), thread)


def step_span(role: str, rank: int, start_ms: float, end_ms: float, step: int = 1) -> Span:
    return Span("step", role, "", step, rank, round(start_ms * MS), round(end_ms * MS))


def disaggregated(steps: int = 6, slow_ms: float = 450.0, handoff_ms: float = 1.0) -> list[Span]:
    """Actor ranks 0-3 wait outside any stage while rollout ranks 4-7 generate; rank 7 is the slow one.

    Per step (800 ms): rollout 4-6 generate 300 ms, rank 7 ``slow_ms``; the actor ranks start
    compute_log_prob ``handoff_ms`` after rank 7 ends, then update_actor until 800 ms.
    """
    spans = []
    for step in range(1, steps + 1):
        base = step * 10_000.0
        resume = base + slow_ms + handoff_ms
        for rank in range(8):
            role = "actor" if rank < 4 else "rollout"
            spans.append(step_span(role, rank, base, base + 800, step))
            if role == "rollout":
                end = base + (slow_ms if rank == 7 else 300)
                spans.append(stage(role, "generate_sequences", rank, base, end, step))
            else:
                spans.append(stage(role, "compute_log_prob", rank, resume, resume + 100, step))
                spans.append(stage(role, "update_actor", rank, resume + 100, base + 800, step))
    return spans


def by_rank(report: TimelineReport, step_index: int = 0) -> dict[int, Any]:
    return {row.rank: row for row in report.steps[step_index].ranks}


# --------------------------------------------------------------------------- a known layout


def test_disaggregated_layout_idle_waits_critical_path_and_straggler() -> None:
    report = analyze_timeline(disaggregated(), aligned=True)
    assert [s.step for s in report.steps] == [1, 2, 3, 4, 5, 6]
    first = report.steps[0]
    assert first.wall_ms == pytest.approx(800)
    rows = by_rank(report)
    for actor in range(4):
        assert rows[actor].busy_ms == pytest.approx(349)
        assert rows[actor].idle_ms == pytest.approx(451)
        [wait] = rows[actor].waited_for
        assert (wait.role, wait.stage, wait.rank, wait.ms) == ("rollout", "generate_sequences", 7, 451.0)  # exact ns
    for peer in (4, 5, 6):  # done early: waiting for the step's end, for what its critical path ran meanwhile
        assert rows[peer].idle_ms == pytest.approx(500)
        waits = [(w.role, w.stage, w.rank, w.ms) for w in rows[peer].waited_for]
        # rank 7's generation while the path runs there, then the stage that ended the step
        assert waits == [("actor", "update_actor", 0, 350.0), ("rollout", "generate_sequences", 7, 150.0)]
    assert [(p.role, p.stage, p.rank, p.ms) for p in first.critical_path] == [
        ("rollout", "generate_sequences", 7, 450.0),
        ("actor", IDLE, 0, 1.0),
        ("actor", "compute_log_prob", 0, 100.0),
        ("actor", "update_actor", 0, 249.0),
    ]
    actors = first.roles["actor"]
    assert (actors.ranks, actors.busy_ms, actors.idle_ms) == (4, 4 * 349.0, 4 * 451.0)
    assert actors.idle_pct == pytest.approx(100 * 451 / 800)
    assert first.generation_ms == pytest.approx(450)

    kinds = {f.kind: f for f in report.findings}
    straggler = kinds["straggler"]
    assert (straggler.role, straggler.stage, straggler.rank) == ("rollout", "generate_sequences", 7)
    assert straggler.steps == (1, 2, 3, 4, 5, 6)
    # what it added to each step (150 ms) and the idle its delay caused the four actor ranks (150 ms each)
    # and its three peers, done early, wait 150 ms each for it too
    assert straggler.lost_ms == pytest.approx(150 + 4 * 150 + 3 * 150)
    assert "150 ms of it its delay; rollout ranks 4\u20136 wait 150 ms each for it" in straggler.text
    assert "(1.05 s of idle rank-time it caused a step)" in straggler.text
    assert "1.5\u00d7" in straggler.text and "6 of 6 steps" in straggler.text
    assert "actor ranks 0\u20133 wait 451 ms each" in straggler.text
    bubbles = {f.role: f for f in report.findings if f.kind == "bubble"}
    assert bubbles["actor"].waiting_for == ("rollout", "generate_sequences")
    # the straggler's finding says the 150 ms a step its delay caused; the bubble says only the rest (301 ms)
    assert "idle 38% of their step time besides waiting for the straggler above" in bubbles["actor"].text
    assert "rollout generate_sequences" in bubbles["actor"].text
    dominant = kinds["dominant_stage"]
    assert (dominant.role, dominant.stage, dominant.lost_ms) == ("rollout", "generate_sequences", 450.0)
    assert dominant.text.startswith("step 800 ms (median of 6): rollout generate_sequences is 56% of it")
    assert [f.lost_ms for f in report.findings] == sorted((f.lost_ms for f in report.findings), reverse=True)
    assert findings_text(report, limit=2) == [f.text for f in report.findings[:2]]


@PROPERTY
@given(
    actors=st.integers(1, 6),
    rollouts=st.integers(2, 6),
    factor=st.floats(1.4, 3.0),
    handoff_ms=st.floats(0.0, 3.0),
    data=st.data(),
)
def test_disaggregated_layouts_name_the_slow_rollout_rank(
    actors: int, rollouts: int, factor: float, handoff_ms: float, data: st.DataObject
) -> None:
    """Any size, jitter of a few % on every stage: the margins (1.4x against 1.2x, 3 ms against 5 ms) hold."""
    slow = actors + data.draw(st.integers(0, rollouts - 1))
    jitter = st.floats(0.97, 1.03)
    spans = []
    for step in (1, 2, 3):
        base = step * 100_000.0
        ends = {r: base + 200 * (factor if r == slow else data.draw(jitter)) for r in range(actors, actors + rollouts)}
        resume = max(ends.values()) + handoff_ms
        end = resume + 300
        for r in range(actors + rollouts):
            role = "actor" if r < actors else "rollout"
            spans.append(step_span(role, r, base, end, step))
            if role == "rollout":
                spans.append(stage(role, "generate_sequences", r, base, ends[r], step))
            else:
                mid = resume + 100 * data.draw(jitter)
                spans += [
                    stage(role, "compute_log_prob", r, resume, mid, step),
                    stage(role, "update_actor", r, mid, end, step),
                ]
    report = analyze_timeline(spans, aligned=True)
    for timeline in report.steps:
        path = [(p.role, p.stage, p.rank) for p in timeline.critical_path]
        assert path[0] == ("rollout", "generate_sequences", slow)
        assert path[-1][:2] == ("actor", "update_actor")
        for row in timeline.ranks[:actors]:
            assert [(w.role, w.stage, w.rank) for w in row.waited_for] == [("rollout", "generate_sequences", slow)]
    [straggler] = [f for f in report.findings if f.kind == "straggler"]
    assert (straggler.role, straggler.stage, straggler.rank, straggler.steps) == (
        "rollout",
        "generate_sequences",
        slow,
        (1, 2, 3),
    )
    said = "waits" if actors == 1 else "wait"  # one rank waits X for it; several wait X each
    assert "actor rank" in straggler.text and f" {said} " in straggler.text and "for it" in straggler.text


def test_idle_with_no_other_rank_to_wait_for_is_said_to_be_the_ranks_own_code() -> None:
    """One process, 40 ms of each 100 ms step between its stages: nothing on another rank explains it."""
    spans = []
    for step in (1, 2, 3):
        t = (step - 1) * 100
        spans += [step_span("actor", 0, t, t + 100, step), stage("actor", "generate", 0, t, t + 30, step)]
        spans.append(stage("actor", "update_actor", 0, t + 70, t + 100, step))
    (bubble,) = [f for f in analyze_timeline(spans, aligned=True).findings if f.kind == "bubble"]
    assert bubble.text == (
        "actor ranks are idle 40% of their step time (40 ms a step each), in their own code between profiled "
        "stages (no other rank's stage ended as they resumed)"
    )
    assert bubble.waiting_for is None


def test_a_driver_holding_the_step_open_is_no_bubble() -> None:
    spans = [step_span("controller", 99, 0, 110)]
    for rank in (0, 1):
        spans += [step_span("actor", rank, 0, 100), stage("actor", "update_actor", rank, 0, 100)]
    report = analyze_timeline(spans, aligned=True)
    assert by_rank(report)[99].busy_ms == 0.0
    assert [f for f in report.findings if f.kind == "bubble"] == []
    assert report.steps[0].critical_path[-1].role == "controller"  # the 10 ms it held the step open


def test_json_contract() -> None:
    doc = json.loads(
        json.dumps(analyze_timeline(disaggregated(), aligned=True, clock_uncertainty_ns=250_000).to_json())
    )
    assert doc["timeline"]["clock"] == {"aligned": True, "max_uncertainty_ms": 0.25, "note": None}
    step = doc["timeline"]["steps"][0]
    assert {"step", "wall_ms", "critical_path", "roles", "ranks"} <= set(step)
    assert set(step["critical_path"][0]) == {"role", "stage", "rank", "ms"}
    assert {"ranks", "busy_ms", "idle_ms", "idle_pct"} <= set(step["roles"]["actor"])
    assert {"rank", "role", "busy_ms", "idle_ms", "waited_for"} <= set(step["ranks"][0])
    assert set(step["ranks"][0]["waited_for"][0]) == {"role", "stage", "rank", "ms"}
    assert sum(p["ms"] for p in step["critical_path"]) == pytest.approx(step["wall_ms"], abs=0.01)
    for finding in doc["findings"]:
        assert {"kind", "text", "lost_ms", "role", "stage", "rank", "steps"} <= set(finding)
        assert isinstance(finding["steps"], list)
    assert [f["lost_ms"] for f in doc["findings"]] == sorted((f["lost_ms"] for f in doc["findings"]), reverse=True)


def test_unaligned_clocks_keep_to_durations() -> None:
    report = analyze_timeline(disaggregated(), aligned=False, clock_uncertainty_ns=250_000)
    assert report.clock.aligned is False and report.clock.max_uncertainty_ms is None
    assert report.clock.note == UNALIGNED_NOTE
    first = report.steps[0]
    assert first.critical_path == ()
    assert all(row.waited_for == () for row in first.ranks)
    assert by_rank(report)[0].idle_ms == pytest.approx(451)
    straggler = next(f for f in report.findings if f.kind == "straggler")
    assert straggler.rank == 7 and "wait" not in straggler.text
    assert all(f.waiting_for is None for f in report.findings)


def test_a_handoff_later_than_the_tolerance_is_unattributed() -> None:
    tolerance_ms = WAIT_TOLERANCE_NS / MS
    near = analyze_timeline(disaggregated(steps=1, handoff_ms=0.8 * tolerance_ms), aligned=True)
    far = analyze_timeline(disaggregated(steps=1, handoff_ms=4 * tolerance_ms), aligned=True)
    assert by_rank(near)[0].waited_for[0].rank == 7
    [wait] = by_rank(far)[0].waited_for
    assert (wait.role, wait.stage, wait.rank) == (None, UNATTRIBUTED, None)
    assert sum(p.ms for p in far.steps[0].critical_path) == pytest.approx(far.steps[0].wall_ms)
    assert far.steps[0].critical_path[0] == replace(far.steps[0].critical_path[0], role="actor", stage=IDLE)


def test_clock_uncertainty_lets_a_resume_precede_the_producers_end() -> None:
    # On the aligned axis the actor resumes 0.2 ms *before* rank 7 ended: only the uncertainty explains it.
    spans = disaggregated(steps=1, handoff_ms=-0.2)
    exact = by_rank(analyze_timeline(spans, aligned=True))[0].waited_for[0]
    loose = by_rank(analyze_timeline(spans, aligned=True, clock_uncertainty_ns=300_000))[0].waited_for[0]
    assert exact.rank != 7
    assert (loose.role, loose.stage, loose.rank) == ("rollout", "generate_sequences", 7)


def test_another_roles_stage_is_preferred() -> None:
    spans = [
        step_span("actor", 0, 0, 100),
        step_span("actor", 1, 0, 100),
        step_span("ref", 2, 0, 100),
        stage("actor", "update_actor", 0, 50, 100),
        stage("actor", "compute_log_prob", 1, 0, 50),  # a peer ends as rank 0 resumes ...
        stage("ref", "compute_ref_log_prob", 2, 0, 49.5),  # ... and so does another role, a little earlier
    ]
    [wait] = by_rank(analyze_timeline(spans, aligned=True))[0].waited_for
    assert (wait.role, wait.stage, wait.rank) == ("ref", "compute_ref_log_prob", 2)


def test_nested_and_concurrent_stages_count_once() -> None:
    spans = [
        step_span("actor", 0, 0, 100),
        stage("actor", "update_actor", 0, 10, 60),
        stage("actor", "forward", 0, 20, 30),  # nested
        stage("actor", "prefetch", 0, 50, 70, thread=2),  # another thread, overlapping
        step_span("actor", 1, 0, 100),
        stage("actor", "update_actor", 1, 10, 100),
    ]
    report = analyze_timeline(spans, aligned=True)
    row = by_rank(report)[0]
    assert (row.busy_ms, row.idle_ms) == (60.0, 40.0)
    path = report.steps[0].critical_path
    assert [p.stage for p in path] == [IDLE, "update_actor"]
    assert "forward" not in {p.stage for p in path}


def test_a_fused_process_naming_a_stage_after_another_role_is_one_lane() -> None:
    spans = [
        step_span("actor_rollout_ref", 0, 0, 100),
        stage("actor_rollout_ref", "generate_sequences", 0, 0, 60),
        stage("critic", "compute_values", 0, 60, 90),
    ]
    [row] = analyze_timeline(spans, aligned=True).steps[0].ranks
    assert (row.role, row.busy_ms, row.idle_ms) == ("actor_rollout_ref", 90.0, 10.0)


def test_a_rank_without_a_step_span_spans_its_stages() -> None:
    spans = [
        step_span("actor", 0, 0, 100),
        stage("rollout", "generate", 1, 20, 50),
        stage("rollout", "generate", 1, 60, 80),
    ]
    report = analyze_timeline(spans, aligned=True)
    row = by_rank(report)[1]
    assert (row.busy_ms, row.idle_ms) == (50.0, 10.0)
    assert report.steps[0].wall_ms == pytest.approx(100)


def test_bad_spans_are_counted_and_left_out() -> None:
    spans = [step_span("actor", 0, 0, 10), step_span("actor", 1, 5, 1), Span("mystery", "actor", "x", 1, 0, 0, 1)]
    report = analyze_timeline(spans, aligned=True)
    assert report.skipped_spans == 2
    assert [row.rank for row in report.steps[0].ranks] == [0]
    with pytest.raises(ValueError, match="uncertainty"):
        analyze_timeline(spans, aligned=True, clock_uncertainty_ns=-1)


def test_no_spans_no_steps() -> None:
    report = analyze_timeline([], aligned=True)
    assert report.steps == () and report.findings == ()
    assert report.to_json()["timeline"]["steps"] == []


# --------------------------------------------------------------------------- stragglers and findings


def peers(durations_by_step: Sequence[Sequence[float]], stage_name: str = "update_actor") -> list[Span]:
    """One role, one stage per rank and step, each rank's step span exactly its stage plus 10 ms."""
    spans = []
    for step, durations in enumerate(durations_by_step, start=1):
        base = step * 100_000.0
        for rank, ms in enumerate(durations):
            spans.append(step_span("actor", rank, base, base + max(durations) + 10, step))
            spans.append(stage("actor", stage_name, rank, base, base + ms, step))
    return spans


def stragglers(report: TimelineReport) -> list[int | None]:
    return [f.rank for f in report.findings if f.kind == "straggler"]


def test_a_straggler_must_be_slow_on_most_steps() -> None:
    assert stragglers(analyze_timeline(peers([[100, 100, 150]] + [[100, 100, 100]] * 2), aligned=True)) == []
    assert stragglers(analyze_timeline(peers([[100, 100, 150]] * 2 + [[100, 100, 100]]), aligned=True)) == [2]
    assert stragglers(analyze_timeline(peers([[100, 100, 150]]), aligned=True)) == [2]  # the only step there is


def test_small_or_near_peers_are_not_stragglers() -> None:
    assert stragglers(analyze_timeline(peers([[1, 1, 1.9]] * 3), aligned=True)) == []  # under 2 ms
    # 10x its peers, but under 1% of a step stretched by another stage
    tiny = [*peers([[3, 3, 30]] * 3, "log"), *peers([[5000] * 3] * 3, "update_actor")]
    assert stragglers(analyze_timeline(tiny, aligned=True)) == []
    assert stragglers(analyze_timeline(peers([[100, 100, 115]] * 3), aligned=True)) == []  # 1.15x


@PROPERTY
@given(
    ranks=st.integers(3, 8),
    steps=st.integers(2, 6),
    factor=st.floats(1.5, 3.0),
    data=st.data(),
)
def test_a_planted_slow_rank_is_named(ranks: int, steps: int, factor: float, data: st.DataObject) -> None:
    slow = data.draw(st.integers(0, ranks - 1))
    jitter = st.floats(-0.05, 0.05)
    durations = [
        [50.0 * factor if r == slow else 50.0 * (1 + data.draw(jitter)) for r in range(ranks)] for _ in range(steps)
    ]
    report = analyze_timeline(peers(durations), aligned=True)
    assert stragglers(report) == [slow]
    finding = next(f for f in report.findings if f.kind == "straggler")
    assert finding.steps == tuple(range(1, steps + 1))
    assert f"on {steps} of {steps} steps" in finding.text


def test_a_slow_step_is_found_with_what_grew() -> None:
    spans = []
    for step in range(1, 6):
        base = step * 10_000.0
        gen = 900.0 if step == 4 else 300.0
        spans += [
            step_span("rollout", 0, base, base + gen + 100, step),
            stage("rollout", "generate", 0, base, base + gen, step),
        ]
        spans += [stage("rollout", "update_weights", 0, base + gen, base + gen + 100, step)]
    report = analyze_timeline(spans, aligned=True)
    slow = next(f for f in report.findings if f.kind == "slow_step")
    assert slow.steps == (4,)
    assert slow.lost_ms == pytest.approx(600 / 5)
    assert "step 4 took 1 s, 2.5\u00d7 the median step (400 ms)" in slow.text
    assert "rollout generate (+600 ms)" in slow.text


# --------------------------------------------------------------------------- properties of random layouts


@st.composite
def layouts(draw: st.DrawFn) -> list[Span]:
    """1-3 roles of 1-3 ranks each (global ranks), 1-3 steps; stages nested, overlapping, sticking out of the
    step span or on a rank with no step span; times on a coarse grid so that ends often coincide."""
    spans = []
    rank = 0
    for role in ("actor", "rollout", "ref")[: draw(st.integers(1, 3))]:
        for _ in range(draw(st.integers(1, 3))):
            for step in range(1, draw(st.integers(1, 3)) + 1):
                base = step * 1000
                has_step = draw(st.booleans()) or (step == 1 and rank == 0)
                if has_step:
                    a = draw(st.integers(0, 20))
                    spans.append(step_span(role, rank, base + a, base + a + draw(st.integers(0, 100)), step))
                for _ in range(draw(st.integers(0 if has_step else 1, 4))):
                    a = draw(st.integers(-5, 110))
                    name = draw(st.sampled_from(["generate_sequences", "update_actor", "compute_log_prob"]))
                    spans.append(stage(role, name, rank, base + a, base + a + draw(st.integers(0, 60)), step))
                    spans[-1] = replace(spans[-1], thread=draw(st.integers(0, 1)))
            rank += 1
    return spans


def union_ms(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, b in sorted(intervals):
        a = max(start, reach)
        if b > a:
            total += b - a
            reach = b
    return total


@PROPERTY
@given(spans=layouts(), uncertainty=st.sampled_from([0, 500_000, 5 * MS]))
def test_busy_idle_waits_and_critical_path_add_up(spans: list[Span], uncertainty: int) -> None:
    report = analyze_timeline(spans, aligned=True, clock_uncertainty_ns=uncertainty)
    for timeline in report.steps:
        mine = [s for s in spans if s.step == timeline.step]
        starts, ends = [], []
        for row in timeline.ranks:
            windows = [s for s in mine if s.kind == "step" and (s.role, s.rank) == (row.role, row.rank)]
            stages = [s for s in mine if s.kind == "stage" and s.rank == row.rank]
            lo = windows[0].start_ns if windows else min(s.start_ns for s in stages)
            hi = windows[0].end_ns if windows else max(s.end_ns for s in stages)
            starts.append(lo)
            ends.append(hi)
            busy = union_ms([(max(s.start_ns, lo) / MS, min(s.end_ns, hi) / MS) for s in stages])
            assert row.busy_ms == pytest.approx(busy, abs=1e-6)
            assert row.busy_ms + row.idle_ms == pytest.approx((hi - lo) / MS, abs=1e-6)
            assert sum(w.ms for w in row.waited_for) == pytest.approx(row.idle_ms, abs=1e-6)
        assert timeline.wall_ms == pytest.approx((max(ends) - min(starts)) / MS, abs=1e-6)
        assert all(part.ms > 0 for part in timeline.critical_path)
        assert sum(part.ms for part in timeline.critical_path) == pytest.approx(timeline.wall_ms, abs=1e-6)
        for name, role in timeline.roles.items():
            rows = [row for row in timeline.ranks if row.role == name]
            assert role.ranks == len(rows)
            assert role.busy_ms == pytest.approx(sum(row.busy_ms for row in rows), abs=1e-6)
            if role.driver:  # it ran no stage in the run: it holds the step open, never idle
                assert role.idle_ms == 0 and role.busy_ms == 0
            else:
                assert role.idle_ms == pytest.approx(sum(row.idle_ms for row in rows), abs=1e-6)
        assert 0 <= timeline.generation_ms <= timeline.wall_ms + 1e-9


@PROPERTY
@given(spans=layouts(), seed=st.integers(0, 2**32), shift=st.integers(-(10**15), 10**15), aligned=st.booleans())
def test_order_and_a_common_shift_change_nothing(spans: list[Span], seed: int, shift: int, aligned: bool) -> None:
    expected = analyze_timeline(spans, aligned=aligned, clock_uncertainty_ns=100_000).to_json()
    shuffled = spans[:]
    random.Random(seed).shuffle(shuffled)
    moved = [replace(s, start_ns=s.start_ns + shift, end_ns=s.end_ns + shift) for s in shuffled]
    assert analyze_timeline(shuffled, aligned=aligned, clock_uncertainty_ns=100_000).to_json() == expected
    assert analyze_timeline(moved, aligned=aligned, clock_uncertainty_ns=100_000).to_json() == expected


@PROPERTY
@given(spans=layouts())
def test_unaligned_has_no_waits_and_no_path(spans: list[Span]) -> None:
    report = analyze_timeline(spans, aligned=False)
    aligned = analyze_timeline(spans, aligned=True)
    for timeline, same in zip(report.steps, aligned.steps, strict=True):
        assert timeline.critical_path == ()
        assert all(row.waited_for == () for row in timeline.ranks)
        assert [(r.rank, r.busy_ms, r.idle_ms) for r in timeline.ranks] == [
            (r.rank, r.busy_ms, r.idle_ms) for r in same.ranks
        ]
        assert timeline.wall_ms <= same.wall_ms + 1e-9


causes = st.one_of(
    st.just((None, UNATTRIBUTED, None)),
    st.tuples(st.sampled_from(["actor", "rollout"]), st.sampled_from(["update_actor", "generate"]), st.integers(0, 9)),
)


@PROPERTY
@given(
    lanes=st.lists(
        st.tuples(
            st.integers(0, 99), st.integers(0, 10**13), st.lists(st.tuples(causes, st.integers(0, 10**13)), max_size=4)
        ),
        max_size=5,
    )
)
def test_lanes_and_waits_stored_as_columns_read_as_the_values(
    lanes: list[tuple[int, int, list[tuple[Any, int]]]],
) -> None:
    table = RankTable()
    plain = []
    for rank, busy, waits in lanes:
        rows = [(role, stage, who, ns) for (role, stage, who), ns in waits]
        table.add(rank, "actor" if rank % 2 else "rollout", busy, 2 * busy, rows)
        shares = tuple(TimeShare(role, stage, who, ns / MS) for role, stage, who, ns in rows)
        plain.append(RankTimeline(rank, "actor" if rank % 2 else "rollout", busy / MS, 2 * busy / MS, shares))
    assert table == tuple(plain) and list(table) == plain and len(table) == len(plain)
    assert table[1:3] == tuple(plain[1:3]) and (not plain or table[-1] == plain[-1])
    for compact, row in zip(table, plain, strict=True):
        assert compact.waited_for == row.waited_for and hash(compact) == hash(row)
        assert (
            compact.to_json() == row.to_json() == {**row.to_json(), "waited_for": [w.to_json() for w in row.waited_for]}
        )
        assert [w[3] for w in compact.waits()] == [w.ms for w in row.waited_for]
        assert pickle.loads(pickle.dumps(compact)) == row and repr(compact) == repr(row)
        with pytest.raises(AttributeError):
            compact.rank = 4


@PROPERTY
@given(spans=layouts(), shift=st.integers(-(10**12), 10**12), data=st.data())
def test_a_lane_copied_from_columns_is_the_lane_of_their_spans(
    spans: list[Span], shift: int, data: st.DataObject
) -> None:
    rank = data.draw(st.sampled_from(sorted({s.rank for s in spans})))
    own = [s for s in spans if s.rank == rank]
    columns = SpanColumns.of(own, rank).take(data.draw(st.permutations(range(len(own)))))  # names not first-used
    expected = TimelineLane.of(role="actor", rank=rank, host="h", pid=1, spans=list(columns), shift_ns=shift)
    assert TimelineLane.of(role="actor", rank=rank, host="h", pid=1, spans=columns, shift_ns=shift) == expected
    part = SpanTable([(columns, 5)])  # a part of the analysis's table: its own shift, then the lane's
    moved = TimelineLane.of(role="actor", rank=rank, host="h", pid=1, spans=part, shift_ns=shift - 5)
    assert moved == expected
    assert [row[4] for row in expected.rows()] == [s.start_ns - shift for s in columns]


# --------------------------------------------------------------------------- columns, files and clocks


def write_timelines(directory: Path, spans: list[Span], offsets: dict[int, int]) -> None:
    """One timeline file per rank as the run writes them, rank r on host ``node{r}`` whose clock is
    ``offsets[r]`` ahead of rank 0's (and says so in a clock estimate)."""
    for rank in sorted({s.rank for s in spans}):
        own = [s for s in spans if s.rank == rank]
        role = next((s.role for s in own if s.kind == "step"), own[0].role)
        data = bytearray(
            encode_header(role=role, rank=rank, world_size=9, host=f"node{rank}", pid=rank, mono_ns=0, wall_ns=0)
        )
        if rank:
            data += encode_clock(offsets[rank], 1_000, "barrier")
        names: dict[tuple[str, str, str], int] = {}
        for s in own:
            key = (s.kind, s.role, s.stage)
            if key not in names:
                names[key] = len(names)
                data += encode_name(names[key], *key)
            data += encode_thread(s.thread, 1000 + s.thread)  # defined again before each span: read the same
            data += encode_span(names[key], s.thread, s.step, s.start_ns + offsets[rank], s.end_ns + offsets[rank])
        (directory / f"r{rank}{TIMELINE_SUFFIX}").write_bytes(bytes(data))


@PROPERTY
@given(spans=layouts(), offsets=st.lists(st.integers(-(10**12), 10**12), min_size=9, max_size=9), aligned=st.booleans())
def test_files_read_and_aligned_give_the_report_of_the_span_values(
    tmp_path_factory: pytest.TempPathFactory, spans: list[Span], offsets: list[int], aligned: bool
) -> None:
    shift = dict(enumerate(offsets)) | {0: 0}
    directory = tmp_path_factory.mktemp("t")
    write_timelines(directory, spans, shift)
    timelines, skipped = find_timelines(directory)
    assert skipped == []
    on_axis = align(timelines)
    assert on_axis.aligned and len(on_axis.spans) == sum(len(t.spans) for t in timelines) == len(spans)
    for rank in shift:  # each file's spans in its order, put back on rank 0's clock
        assert [s for s in on_axis.spans if s.rank == rank] == [s for s in spans if s.rank == rank]
    expected = analyze_timeline(spans, aligned=aligned, clock_uncertainty_ns=1_000)
    assert analyze_timeline(on_axis.spans, aligned=aligned, clock_uncertainty_ns=1_000) == expected
    assert analyze_timeline(SpanTable.of(spans), aligned=aligned, clock_uncertainty_ns=1_000) == expected
    assert analyze_timeline(iter(spans), aligned=aligned, clock_uncertainty_ns=1_000) == expected


def test_a_host_without_a_clock_estimate_is_not_aligned_and_keeps_its_own_clock(tmp_path: Path) -> None:
    spans = disaggregated(steps=2)
    write_timelines(tmp_path, spans, dict.fromkeys(range(8), 0))
    (tmp_path / f"r9{TIMELINE_SUFFIX}").write_bytes(
        encode_header(role="ref", rank=9, world_size=9, host="far", pid=9, mono_ns=0, wall_ns=0)
        + encode_name(0, "step", "ref", "")
        + encode_span(0, 0, 1, 5 * 10**15, 5 * 10**15 + 800 * MS)
    )
    timelines, _ = find_timelines(tmp_path)
    on_axis = align(timelines)
    assert not on_axis.aligned and on_axis.max_uncertainty_ns is None
    assert on_axis.spans[-1] == Span("step", "ref", "", 1, 9, 5 * 10**15, 5 * 10**15 + 800 * MS)
    report = analyze_timeline(on_axis.spans, aligned=on_axis.aligned)
    assert report.steps[0].wall_ms == pytest.approx(800) and report.clock.note == UNALIGNED_NOTE


def write_process(
    directory: Path, spans: list[Span], *, rank: int, host: str, clock_ns: int, estimate: tuple[int, int] | None
) -> None:
    """Rank ``rank``'s spans as its process on ``host`` writes them: on a clock ``clock_ns`` ahead of the
    reference's, with its recorded estimate (offset, uncertainty), if any."""
    own = [s for s in spans if s.rank == rank]
    role = next(s.role for s in own if s.kind == "step")
    data = bytearray(encode_header(role=role, rank=rank, world_size=9, host=host, pid=rank, mono_ns=0, wall_ns=0))
    if estimate is not None:
        data += encode_clock(*estimate, "store round trip")
    names: dict[tuple[str, str, str], int] = {}
    for s in own:
        key = (s.kind, s.role, s.stage)
        if key not in names:
            names[key] = len(names)
            data += encode_name(names[key], *key)
        data += encode_span(names[key], 0, s.step, s.start_ns + clock_ns, s.end_ns + clock_ns)
    (directory / f"r{rank}{TIMELINE_SUFFIX}").write_bytes(bytes(data))


def test_a_timeline_with_its_own_estimate_is_shifted_by_it_when_the_lowest_rank_is_missing(tmp_path: Path) -> None:
    # Rank 0 measured every offset (host "a"), but its timeline is not in the set: the lowest rank here,
    # rank 1, is on host "b", whose clock is 7 s ahead. Each process is shifted by its own estimate (rank 2 on
    # rank 0's host recorded 0 ± 0); rank 5 recorded none and takes its host-mate rank 1's (one clock a host).
    spans = [s for s in disaggregated(steps=2) if s.rank != 0]
    hosts = {1: ("b", 7 * 10**9), 2: ("a", 0), 3: ("c", -3 * 10**9), 5: ("b", 7 * 10**9)}
    for rank in range(1, 8):
        host, clock = hosts.get(rank, (f"h{rank}", rank * 10**9 + 17))
        estimate = None if rank == 5 else (clock, 0 if host == "a" else 2_000 + rank)
        write_process(tmp_path, spans, rank=rank, host=host, clock_ns=clock, estimate=estimate)
    timelines, _ = find_timelines(tmp_path)
    on_axis = align(timelines)
    assert on_axis.aligned and on_axis.max_uncertainty_ns == 2_007
    assert sorted(on_axis.spans) == sorted(spans)
    expected = analyze_timeline(spans, aligned=True, clock_uncertainty_ns=2_007)
    assert analyze_timeline(on_axis.spans, aligned=True, clock_uncertainty_ns=2_007) == expected
    assert by_rank(expected)[1].waited_for[0].rank == 7  # rank 1 waits for the slow rollout rank, as with rank 0


def test_without_estimates_only_the_lowest_ranks_host_is_on_the_axis(tmp_path: Path) -> None:
    spans = disaggregated(steps=1)
    for rank in range(8):  # a run that measured no offset: ranks 0-3 on one host, 4-7 on another
        write_process(tmp_path, spans, rank=rank, host="a" if rank < 4 else "b", clock_ns=0, estimate=None)
    timelines, _ = find_timelines(tmp_path)
    assert not align(timelines).aligned
    assert align([t for t in timelines if t.host == "b"]).aligned  # one host: one clock
