"""``Report.from_dict``: the one reader of ``instrument analyze --json``, the inverse of ``Report.to_dict``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze import Report, analyze, compare
from instrument.analyze.model import (
    ClockInfo,
    Finding,
    MemoryFile,
    RankStats,
    RankTimeline,
    RoleTimeline,
    Skipped,
    StageStats,
    StepTimeline,
    TimelineReport,
    TimeShare,
)
from tests.analyze.analyzers.test_compare import timeline_run, trace_run

PROPERTY = settings(max_examples=60, deadline=None)
names = st.text("abcdefgh_-", min_size=1, max_size=8)
ms = st.floats(0, 1e6).map(lambda v: round(v, 3))  # at the precision --json keeps (µs)
small = st.integers(0, 10_000)
maybe_int = st.none() | small


@st.composite
def rank_stats(draw: st.DrawFn, step: int | None, role: str, stage: str) -> RankStats:
    return RankStats(
        step=step,
        role=role,
        stage=stage,
        rank=draw(maybe_int),
        replica=draw(maybe_int),
        wall_ms=draw(ms),
        basis=draw(st.sampled_from(["stage", "mini_batches", "span"])),
        minibatch_ms=draw(ms),
        mini_batches=draw(small),
        cpu_ms=draw(ms),
        kernel_ms=draw(st.none() | ms),
        kernels=draw(small),
        events=draw(small),
        files=tuple(draw(st.lists(names, max_size=2))),
        windows=tuple(draw(st.lists(st.tuples(small, small), max_size=2))),
        partial=draw(st.booleans()),
        worker=draw(st.none() | names),
        comm_ms=draw(ms),
        work_ms=draw(st.none() | ms),
        iterations=draw(small),
        tokens=draw(small),
    )


@st.composite
def stage_stats(draw: st.DrawFn) -> StageStats:
    step, role, stage = draw(maybe_int), draw(names), draw(names)
    return StageStats(
        step=step,
        role=role,
        stage=stage,
        ranks=tuple(draw(st.lists(rank_stats(step, role, stage), min_size=1, max_size=3))),
        median_ms=draw(ms),
        max_ms=draw(ms),
        min_ms=draw(ms),
        straggler=draw(st.none() | names),
        straggler_rank=draw(maybe_int),
        ratio=draw(st.none() | st.floats(0, 100).map(lambda v: round(v, 4))),
        minibatch_ms=draw(ms),
        cpu_ms=draw(ms),
        kernel_ms=draw(st.none() | ms),
        events=draw(st.floats(0, 1e6)),
        judged_by=draw(st.sampled_from(["wall", "work"])),
        median_work_ms=draw(ms),
        lost_ms=draw(ms),
        below_floor=draw(st.none() | names),
    )


share = st.builds(TimeShare, st.none() | names, names, maybe_int, ms)
role_share = st.builds(TimeShare, st.none() | names, names, st.none(), ms)  # a role's causes carry no rank
shares = st.lists(share, max_size=3).map(tuple)


@st.composite
def step_timelines(draw: st.DrawFn) -> StepTimeline:
    roles = draw(st.lists(names, unique=True, max_size=3))
    return StepTimeline(
        step=draw(small),
        wall_ms=draw(ms),
        critical_path=draw(shares),
        roles={
            r: RoleTimeline(
                r,
                draw(st.integers(1, 9)),
                draw(ms),
                draw(ms),
                tuple(replace(s, rank=None) for s in draw(st.lists(share))),
            )
            for r in roles
        },
        ranks=tuple(
            draw(st.lists(st.builds(RankTimeline, small, names, ms, ms, st.lists(share).map(tuple)), max_size=3))
        ),
        generation_ms=draw(ms),
    )


timelines = st.builds(
    TimelineReport,
    st.builds(ClockInfo, st.booleans(), st.none() | ms, st.none() | names),
    st.lists(step_timelines(), max_size=3).map(tuple),
    st.lists(
        st.builds(
            Finding,
            names,
            names,
            ms,
            st.none() | names,
            st.none() | names,
            maybe_int,
            st.lists(small, max_size=3).map(tuple),
            st.none() | st.tuples(names, names),
        ),
        max_size=3,
    ).map(tuple),
    small,
    st.sampled_from(["files", "traces"]),
)
reports = st.builds(
    Report,
    directory=names,
    stages=st.lists(stage_stats(), max_size=3).map(tuple),
    skipped=st.lists(st.builds(Skipped, names, names), max_size=2).map(tuple),
    files=small,
    bytes=small,
    events=small,
    elapsed_s=ms,
    jobs=st.integers(1, 8),
    memory=st.lists(
        st.builds(
            MemoryFile,
            names,
            st.sampled_from(["snapshot", "timeline"]),
            names,
            names,
            small,
            small,
            st.none() | st.tuples(small, small),
            small,
            maybe_int,
            names,
        ),
        max_size=2,
    ).map(tuple),
    gpu=st.lists(st.fixed_dictionaries({"rank": small, "step": st.none()}), max_size=2).map(tuple),
    timeline=st.none() | timelines,
    timeline_note=st.none() | names,
)


@PROPERTY
@given(report=reports)
def test_from_dict_is_the_inverse_of_to_dict(report: Report) -> None:
    """For values at the precision ``--json`` keeps: what it writes reads back as itself."""
    saved = json.loads(report.to_json())
    assert Report.from_dict(saved).to_dict() == saved


@pytest.mark.parametrize("kind", ["traces", "timeline"])
def test_a_real_analysis_reads_back_as_itself(tmp_path: Path, kind: str) -> None:
    """Percentages are made again from the µs kept, so their last digit may move; everything else is the same."""
    run = (trace_run if kind == "traces" else timeline_run)(tmp_path / "run", seed=3)
    saved = analyze(run).to_dict()
    back = Report.from_dict(json.loads(json.dumps(saved))).to_dict()
    for before, after in zip(_percentages(saved), _percentages(back), strict=True):
        assert after == pytest.approx(before, abs=0.011)
    assert back == saved


def _percentages(data: dict[str, Any]) -> list[float]:
    """Pops the percentages derived from milliseconds, in order."""
    found = []
    for step in (data["timeline"] or {}).get("steps", []):
        found.append(step.pop("generation_pct"))
        found.extend(role.pop("idle_pct") for role in step["roles"].values())
    return found


def test_a_saved_analysis_compares_as_the_live_one_it_came_from(tmp_path: Path) -> None:
    """The saved JSON holds no timeline spans: a live report without them compares the same, by one reader."""
    runs = [timeline_run(tmp_path / "base", seed=5), timeline_run(tmp_path / "cand", seed=6, slow=1.3)]
    live = [replace(analyze(run), timeline_spans=None) for run in runs]
    paths = []
    for report, name in zip(live, ("base", "cand"), strict=True):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(report.to_json())
    from_live, from_files = compare(*live).to_dict(), compare(*paths).to_dict()
    for said in (from_live, from_files):
        said.pop("baseline"), said.pop("candidate"), said.pop("elapsed_s")
        for change in said["changes"]:
            change.pop("source")
    assert from_live == from_files
    assert from_live["step"]["change_pct"] > 0  # the slow run was compared, not two empty ones


GOOD: dict[str, Any] = {
    "directory": "x",
    "stages": [{"role": "a", "stage": "b", "step": 1, "per_rank": [{"rank": 0, "wall_ms": 9}]}],
}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"stages": [{"step": "1"}]}, "a stage's 'step' must be an int or null (got '1')"),
        ({"stages": [{"role": "a", "stage": 3, "per_rank": []}]}, "a stage's 'role' and 'stage' must be strings"),
        ({"stages": [{"role": "a", "stage": "b", "per_rank": [{"wall_ms": "9"}]}]}, "'wall_ms' must be a number"),
        ({"stages": [{"role": "a", "stage": "b", "per_rank": [{"rank": True, "wall_ms": 1}]}]}, "a rank must be"),
        ({"timeline": []}, "'timeline' must be an object or null"),
        ({"timeline": {"steps": [{"step": 1}]}}, "a step's 'wall_ms' is missing"),
        ({"timeline": {"steps": [{"step": 1, "wall_ms": 5, "roles": {"a": 1}}]}}, "must be an object (got 1)"),
        ({"timeline": {"steps": []}, "findings": [{"kind": "x", "text": "t", "lost_ms": float("inf")}]}, "number"),
        ({"memory": [{"path": "m"}]}, "a memory file's 'kind' is missing"),
        ({"skipped": "all"}, "'skipped' must be a list of objects"),
    ],
)
def test_what_is_not_an_analysis_is_named(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        Report.from_dict({**GOOD, **change})


@pytest.mark.parametrize("data", [[1, 2], {"traceEvents": []}, {"stages": []}, {"directory": "x", "stages": {}}])
def test_no_directory_and_stages_is_no_analysis(data: Any) -> None:
    with pytest.raises(ValueError, match="no 'directory' and 'stages' in it"):
        Report.from_dict(data)


def test_keys_of_an_older_or_newer_writer_are_tolerated() -> None:
    report = Report.from_dict({**GOOD, "a_key_of_tomorrow": 1})
    assert report.stages[0].ranks[0].wall_ms == 9.0 and report.stages[0].ranks[0].basis == "stage"
    assert report.timeline is None and report.memory == ()
