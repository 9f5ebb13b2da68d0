"""The SDK's own time (stages named ``instrument:<what>``) is its own: never the user's stage time or idle, its own
column and finding, left out of slow steps and stragglers; causes (a straggler) before their effects (idle, slow
steps); one quantity per finding. Every input is built with exact durations: no clock is read, nothing sleeps.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze import analyze, compare
from instrument.analyze.analyzers._findings import INSTRUMENT_KIND
from instrument.analyze.analyzers._timeline import analyze_timeline
from instrument.analyze.model import TimelineReport
from instrument.naming import SDK_STAGE_PREFIX, check_label
from instrument.timeline import Span
from tests.analyze.analyzers.test_timeline import stage, step_span, write_timelines
from tests.analyze.test_analyze import _x, sdk_trace

START = SDK_STAGE_PREFIX + "profiler_start"
STOP = SDK_STAGE_PREFIX + "profiler_stop"
EXPORT = SDK_STAGE_PREFIX + "profiler_step"


def traced_loop(steps: int = 5, traced: int = 3, start_ms: float = 4000.0) -> list[Span]:
    """One actor rank, one 10 ms update_actor a step with no code between; step ``traced`` starts the profiler
    (``start_ms``) before the stage, exports 30 ms inside it (a schedule's step) and stops for 50 ms after it."""
    spans = []
    for step in range(1, steps + 1):
        t = step * 100_000.0
        if step == traced:
            spans += [
                step_span("actor", 0, t, t + start_ms + 40 + 50, step),
                stage("actor", START, 0, t, t + start_ms, step),
                stage("actor", "update_actor", 0, t + start_ms, t + start_ms + 40, step),
                stage("actor", EXPORT, 0, t + start_ms + 5, t + start_ms + 35, step),
                stage("actor", STOP, 0, t + start_ms + 40, t + start_ms + 90, step),
            ]
        else:
            spans += [step_span("actor", 0, t, t + 10, step), stage("actor", "update_actor", 0, t, t + 10, step)]
    return spans


def test_profiler_start_export_and_stop_are_instruments_not_the_users() -> None:
    report = analyze_timeline(traced_loop(), aligned=True)
    step = report.steps[2]
    assert step.traced and not any(s.traced for i, s in enumerate(report.steps) if i != 2)
    assert step.wall_ms == pytest.approx(4090)
    assert step.instrument_ms == pytest.approx(4000 + 30 + 50)  # start, the export inside the stage, stop
    assert step.user_wall_ms == pytest.approx(10)
    [row] = step.ranks
    assert (row.busy_ms, row.idle_ms, row.instrument_ms) == pytest.approx((10, 0, 4080))
    actor = step.roles["actor"]
    assert (actor.busy_ms, actor.idle_ms, actor.instrument_ms, actor.idle_pct) == pytest.approx((10, 0, 4080, 0))
    path = {(p.stage, p.ms) for p in step.critical_path}
    assert path == {(START, 4000.0), ("update_actor", 10.0), (EXPORT, 30.0), (STOP, 50.0)}
    kinds = [f.kind for f in report.findings]
    assert "slow_step" not in kinds and "bubble" not in kinds  # the user's steps are all 10 ms, never idle
    assert kinds[-1] == INSTRUMENT_KIND
    said = report.findings[-1]
    assert said.steps == (3,) and "step 3 was traced" in said.text and "not your code" in said.text
    assert said.lost_ms == pytest.approx(4080 / 5)


def test_the_sdks_time_is_said_last_however_large() -> None:
    report = analyze_timeline(traced_loop(start_ms=60_000.0), aligned=True)
    assert report.findings[0].kind != INSTRUMENT_KIND and report.findings[-1].kind == INSTRUMENT_KIND


def test_a_rank_waiting_for_anothers_profiler_start_is_not_idle() -> None:
    """Rank 1 waits 500 ms for rank 0's profiler to start before the collective-bound stage both run."""
    spans = []
    for step in range(1, 4):
        t = step * 10_000.0
        start = 500.0 if step == 2 else 0.0
        spans += [step_span("actor", 0, t, t + start + 20, step), step_span("actor", 1, t, t + start + 20, step)]
        if start:
            spans.append(stage("actor", START, 0, t, t + start, step))
        spans += [stage("actor", "update_actor", r, t + start, t + start + 20, step) for r in (0,)]
        spans.append(stage("actor", "update_actor", 1, t + start, t + start + 20, step))
        spans.append(stage("actor", "compute_log_prob", 1, t, t + 1, step))  # rank 1 goes idle after 1 ms
    report = analyze_timeline(spans, aligned=True)
    rows = {row.rank: row for row in report.steps[1].ranks}
    assert rows[1].idle_ms == pytest.approx(0)
    assert rows[1].instrument_ms == pytest.approx(499)
    assert [(w.stage, w.rank) for w in rows[1].waited_for] == [(START, 0)]  # what it waited on, still said
    assert report.steps[1].roles["actor"].idle_ms == pytest.approx(0)
    assert all(f.kind in ("dominant_stage", INSTRUMENT_KIND) for f in report.findings)


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(3, 7), traced=st.data(), start=st.floats(1.0, 10_000.0))
def test_a_traced_step_is_never_a_slow_step_or_a_straggler_for_the_sdks_time(
    steps: int, traced: st.DataObject, start: float
) -> None:
    which = traced.draw(st.integers(1, steps))
    report = analyze_timeline(traced_loop(steps, which, start), aligned=True)
    assert [f.kind for f in report.findings if f.kind in ("slow_step", "straggler", "bubble")] == []
    assert [s.step for s in report.steps if s.traced] == [which]
    for s in report.steps:
        assert sum(p.ms for p in s.critical_path) == pytest.approx(s.wall_ms, abs=1e-6)


def test_a_user_label_cannot_take_the_sdks_prefix() -> None:
    with pytest.raises(ValueError, match="must not start with 'instrument:'"):
        check_label("name", "instrument:profiler_start")


# --------------------------------------------------------------------------- causes before effects


def straggling(steps: int = 4) -> list[Span]:
    """Rollout ranks 2-3 generate 100 ms (rank 3: 300 ms); actor ranks 0-1 then update for 100 ms."""
    spans = []
    for step in range(1, steps + 1):
        t = step * 10_000.0
        for rank in range(4):
            role = "actor" if rank < 2 else "rollout"
            spans.append(step_span(role, rank, t, t + 400, step))
            if role == "rollout":
                spans.append(stage(role, "generate_sequences", rank, t, t + (300 if rank == 3 else 100), step))
            else:
                spans.append(stage(role, "update_actor", rank, t + 300, t + 400, step))
    return spans


def findings(report: TimelineReport) -> dict[str, list[str]]:
    said: dict[str, list[str]] = {}
    for f in report.findings:
        said.setdefault(f.kind, []).append(f.text)
    return said


def test_the_straggler_is_first_and_carries_the_idle_it_caused() -> None:
    report = analyze_timeline(straggling(), aligned=True)
    first = report.findings[0]
    assert (first.kind, first.role, first.stage, first.rank) == ("straggler", "rollout", "generate_sequences", 3)
    # it added 200 ms to each step, made both actor ranks wait 200 ms more than its peers' pace would have, and
    # its peer (done early, waiting for the step to end) 200 ms
    assert first.lost_ms == pytest.approx(200 + 2 * 200 + 200)
    assert "actor ranks 0\u20131 wait 300 ms each for it, 200 ms of it its delay" in first.text
    actor_bubble = [f for f in report.findings if f.kind == "bubble" and f.role == "actor"]
    assert actor_bubble == [] or "besides waiting for the straggler above" in actor_bubble[0].text
    if actor_bubble:  # the 100 ms a step its peers' pace would have cost them: 25% of 400
        assert "idle 25%" in actor_bubble[0].text


def test_a_slow_step_made_by_a_straggler_is_the_stragglers_finding() -> None:
    spans = straggling(5)
    # step 4: rank 3 is 900 ms instead of 300: the step is 1,000 ms against 400; the straggler explains it all
    spans = [s for s in spans if s.step != 4]
    t = 40_000.0
    for rank in range(4):
        role = "actor" if rank < 2 else "rollout"
        spans.append(step_span(role, rank, t, t + 1000, 4))
        if role == "rollout":
            spans.append(stage(role, "generate_sequences", rank, t, t + (900 if rank == 3 else 100), 4))
        else:
            spans.append(stage(role, "update_actor", rank, t + 900, t + 1000, 4))
    report = analyze_timeline(spans, aligned=True)
    assert report.findings[0].kind == "straggler"
    assert "slow_step" not in findings(report)


def test_a_dominant_stages_share_and_ms_are_of_one_median() -> None:
    report = analyze_timeline(straggling(), aligned=True)
    [dominant] = [f for f in report.findings if f.kind == "dominant_stage"]
    walls = statistics.median(s.user_wall_ms for s in report.steps)
    assert f"is {100 * dominant.lost_ms / walls:.0f}% of it ({dominant.lost_ms:.3g} ms a step" in dominant.text


def test_a_driver_is_never_idle() -> None:
    spans = straggling()
    for step in range(1, 5):  # a controller holding each step open, running no stage of its own
        spans.append(step_span("controller", 0, step * 10_000.0 - 5, step * 10_000.0 + 405, step))
    report = analyze_timeline(spans, aligned=True)
    for step in report.steps:
        controller = step.roles["controller"]
        assert controller.driver and controller.idle_ms == 0 and controller.idle_pct == 0
        assert controller.waited_for  # what it waited on
    assert all(f.role != "controller" for f in report.findings)


def test_compare_leaves_the_sdks_time_out_of_steps_stages_and_the_path(tmp_path: Path) -> None:
    """The same 10 ms loop, untraced against traced on step 3 (4 s of profiler start, export and stop)."""
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    write_timelines(tmp_path / "a", traced_loop(traced=0), {0: 0})
    write_timelines(tmp_path / "b", traced_loop(), {0: 0})
    comparison = compare(tmp_path / "a", tmp_path / "b")
    assert comparison.step.verdict != "changed"  # 10 ms steps on both sides, the traced one too
    assert not any(change.stage.startswith(SDK_STAGE_PREFIX) for change in comparison.changes)
    assert comparison.timeline is not None
    assert not any(part.stage.startswith(SDK_STAGE_PREFIX) for part in comparison.timeline.critical_path)


def test_a_stage_filter_chooses_what_is_shown_and_never_makes_idle(tmp_path: Path) -> None:
    """--stage update_actor on the straggling layout: the actor and rollout ranks' idle is what it is unfiltered
    (before, the rollout's generation filtered out was the rollout ranks' idle), and only that stage's findings."""
    write_timelines(tmp_path, straggling(), {r: 0 for r in range(4)})
    whole = analyze(tmp_path).timeline
    shown = analyze(tmp_path, stages=["update_actor"]).timeline
    assert whole is not None and shown is not None
    for a, b in zip(whole.steps, shown.steps, strict=True):
        assert {name: role.idle_ms for name, role in a.roles.items()} == {
            name: role.idle_ms for name, role in b.roles.items()
        }
    assert {f.stage for f in shown.findings} <= {None, "update_actor"}
    assert any(f.stage == "generate_sequences" for f in whole.findings)


def test_an_older_timeline_without_the_sdks_spans_is_analysed_as_before_and_said_once(tmp_path: Path) -> None:
    """Timeline files with no instrument:* span beside a trace of step 3: that step is marked traced, and one note
    says its profiler time counts as stage and idle time there."""
    write_timelines(tmp_path, straggling(), {r: 0 for r in range(4)})
    sdk_trace(tmp_path, [_x("update_actor", 5e6, 1e5)], stage="update_actor", step=3, rank=0, world=4)
    report = analyze(tmp_path)
    assert report.timeline is not None
    assert [s.step for s in report.timeline.steps if s.traced] == [3]
    said = [n.reason for n in report.notes if "older instrument" in n.reason]
    assert len(said) == 1 and "traced steps (3)" in said[0]
