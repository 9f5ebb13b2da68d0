"""The step timeline from plain torch traces judges a stage by its work, as the stage table does: the time a rank's
CPU waited in a collective inside a stage is idle there (waiting for the slow rank), not the stage's time; and a
process whose traces name no role is torch's ``worker``, never "unknown". Exact ``ts`` / ``dur``; no clock read."""

from __future__ import annotations

from pathlib import Path

import pytest

from instrument.analyze import analyze
from instrument.analyze.traces._trace_spans import WORKER_ROLE, _working
from tests.analyze.analyzers.test_stragglers import SLOW, WORLD, _gloo_set


def test_a_collective_wait_inside_a_stage_is_idle_and_the_slow_rank_is_the_timelines_straggler(tmp_path: Path) -> None:
    report = analyze(_gloo_set(tmp_path / "gloo", steps=3), jobs=1)
    timeline = report.timeline
    assert timeline is not None and timeline.source == "traces"
    stage = next(s for s in report.stages if s.stage == "update_actor")
    assert stage.straggler_rank == SLOW  # the stage table, by work
    first = timeline.findings[0]
    assert (first.kind, first.role, first.stage, first.rank) == ("straggler", WORKER_ROLE, "update_actor", SLOW)
    for step in timeline.steps:
        assert set(step.roles) == {WORKER_ROLE}
        rows = {row.rank: row for row in step.ranks}
        # a waiter works 10.1 + 5 ms of the 40 ms stage, and waits 21 ms in the collective for the slow rank
        assert rows[0].busy_ms == pytest.approx(19.0, abs=0.01)
        waits = {(w.stage, w.rank) for w in rows[0].waited_for}
        assert ("update_actor", SLOW) in waits
        assert rows[SLOW].busy_ms == pytest.approx(39.0, abs=0.01)
    assert all(WORKER_ROLE in f.text or f.role is None for f in timeline.findings)
    assert not any("unknown" in f.text for f in timeline.findings) and len(report.stages[0].ranks) == WORLD


def test_a_range_without_its_waits() -> None:
    waits = ([2.0, 5.0, 9.0], [3.0, 6.0, 12.0])
    assert _working(0.0, 10.0, waits) == [(0.0, 2.0), (3.0, 5.0), (6.0, 9.0)]
    assert _working(3.0, 4.0, waits) == [(3.0, 4.0)]
    assert _working(2.0, 3.0, waits) == []  # all of it a wait
    assert _working(0.0, 1.0, ([], [])) == [(0.0, 1.0)]


def test_traces_of_no_named_host_days_apart_are_not_on_one_clock() -> None:
    """HTA's trace_diff pair: two jobs 8.5 days apart, no host_name in either: one clock would make each step
    last 8.5 days (735,003,902.8 ms, said before); apart, each is judged by its durations only."""
    timeline = analyze(Path(__file__).parents[2] / "data" / "hta" / "trace_diff", jobs=1).timeline
    assert timeline is not None and not timeline.clock.aligned
    assert all(step.wall_ms < 1000 for step in timeline.steps)
