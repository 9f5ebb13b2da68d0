"""A change common to every stage (a machine that got slower or faster) is the machine's, said once, and each
stage is judged against it.

The statistics are pure and property-tested with hypothesis on exact inputs: the candidate's durations are the
baseline's times a factor (and a planted stage's times another), so the outcome does not depend on a seed. The
whole path (timeline files, ``compare``, text, JSON and page) runs on seeded synthetic runs; nothing reads the
clock.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze import compare
from instrument.analyze.analyzers._compare import RunSide, StageSamples, compare_sides
from instrument.analyze.analyzers._compare_stats import (
    ALPHA,
    MIN_CHANGE_PCT,
    MIN_SAMPLES,
    judge,
    machine_shift,
    stands_out,
)
from instrument.analyze.analyzers._compare_words import findings
from instrument.analyze.model import Method, Verdict
from instrument.analyze.render._compare import render_compare_text, write_compare_html
from tests.analyze.analyzers.test_compare import STAGES_MS, timeline_run, write_timeline

METHOD = Method(alpha=ALPHA, min_change_pct=MIN_CHANGE_PCT, min_samples=MIN_SAMPLES)
MS = 1_000_000

# a factor far enough from 1 that durations spread by at most 1% are told apart and the change is reported
factors = st.one_of(st.floats(1.1, 4.0), st.floats(0.25, 0.9))


# --------------------------------------------------------------------------- the statistic


@given(st.lists(st.floats(0.01, 100.0), min_size=3, max_size=12), st.data())
def test_one_stage_more_or_less_does_not_move_the_shift_past_its_neighbours(
    ratios: list[float], data: st.DataObject
) -> None:
    """The median of log ratios: one stage replaced by any value moves it at most to the next stage's ratio."""
    shift = machine_shift(ratios, [0] * len(ratios))
    assert shift is not None
    i = data.draw(st.integers(0, len(ratios) - 1))
    other = [*ratios[:i], data.draw(st.floats(1e-3, 1e3)), *ratios[i + 1 :]]
    moved = machine_shift(other, [0] * len(other))
    assert moved is not None
    ordered = sorted(ratios)
    lo, hi = ordered[(len(ordered) - 1) // 2 - 1], ordered[len(ordered) // 2 + 1]
    assert lo * (1 - 1e-9) <= moved.factor <= hi * (1 + 1e-9)


@given(factors, st.integers(3, 10), factors, st.data())
def test_a_uniform_factor_is_the_shift_and_one_planted_stage_does_not_move_it(
    factor: float, stages: int, planted: float, data: st.DataObject
) -> None:
    uniform = machine_shift([factor] * stages, [1 if factor > 1 else -1] * stages)
    assert uniform is not None and uniform.common and uniform.along == stages
    assert uniform.pct == pytest.approx(100 * (factor - 1), rel=1e-9) and uniform.spread_pct == 0
    i = data.draw(st.integers(0, stages - 1))
    ratios = [factor] * stages
    ratios[i] = factor * planted
    shifted = machine_shift(ratios, [1 if r > 1 else -1 for r in ratios])
    assert shifted is not None and shifted.factor == pytest.approx(factor, rel=1e-9)
    assert stands_out(factor * planted, shifted) and not stands_out(factor, shifted)


def test_no_shift_under_three_stages_nor_without_most_stages_beyond_noise() -> None:
    assert machine_shift([1.3, 1.3], [1, 1]) is None  # of two stages neither can be told from the machine
    quiet = machine_shift([1.3, 1.3, 1.3], [0, 0, 0])
    assert quiet is not None and not quiet.common  # moved, but none beyond noise: the stages' noise
    alone = machine_shift([1.3, 1.0, 1.01], [1, 0, 0])
    assert alone is not None and not alone.common  # one stage changed: its own change, not the machine
    small = machine_shift([1.02, 1.03, 1.02], [1, 1, 1])
    assert small is not None and not small.common  # under min_change: nothing to say
    shift = machine_shift([1.3, 1.3, 1.3], [1, 1, 0])
    assert shift is not None and shift.pct == pytest.approx(30.0)
    assert (shift.stages, shift.moved, shift.along, shift.spread_pct, shift.common) == (3, 3, 2, 0.0, True)
    half = machine_shift([1.3, 1.3, 1.3, 1.0, 1.0, 1.0], [1, 1, 1, 0, 0, 0])
    assert half is not None and not half.common  # three of six changed: the median averages 1.3 and 1.0


@given(st.lists(st.floats(50.0, 51.0), min_size=5, max_size=30, unique=True), factors)
def test_judged_against_the_factor_that_made_it_a_candidate_is_unchanged(base: list[float], factor: float) -> None:
    candidate = [v * factor for v in reversed(base)]
    measured = judge(base, candidate)
    assert measured.verdict == Verdict.CHANGED and measured.change_pct == pytest.approx(100 * (factor - 1))
    against = judge(base, candidate, against=factor)
    assert against.verdict == Verdict.NOISE and against.change_pct == pytest.approx(0, abs=1e-9)
    assert against.ci_pct is None or against.ci_pct[0] <= 1e-6 <= 1e-6 + against.ci_pct[1]  # None: ties, few
    assert (against.baseline_ms, against.candidate_ms) == (measured.baseline_ms, measured.candidate_ms)


# --------------------------------------------------------------------------- judged against it (pure sides)


def _side(label: str, stages: list[list[float]], scale: list[float]) -> RunSide:
    """One rank, ``len(stages[0])`` steps; stage i's duration in step j is ``stages[i][j] * scale[i]``."""
    side = RunSide(label=label, step_source="timeline")
    for i, durations in enumerate(stages):
        held = StageSamples("actor", f"stage_{i}")
        for step, ms in enumerate(durations, 1):
            held.values[(step, "0")] = ms * scale[i]
            side.step_ms[step] = side.step_ms.get(step, 0.0) + ms * scale[i]
        side.timeline[("actor", f"stage-{i}")] = held
    return side


@st.composite
def runs(draw: st.DrawFn) -> list[list[float]]:
    """3-8 stages, 5-20 steps each, durations distinct (no ties) and within 1% of each stage's own size."""
    steps = draw(st.integers(MIN_SAMPLES, 20))
    sizes = draw(st.lists(st.floats(1.0, 500.0), min_size=3, max_size=8))
    return [[size * (1 + 0.0005 * j) for j in draw(st.permutations(range(steps)))] for size in sizes]


@settings(max_examples=60, deadline=None)
@given(runs(), factors)
def test_a_uniform_factor_on_every_stage_is_one_machine_finding_and_no_stage_change(
    stages: list[list[float]], factor: float
) -> None:
    base = _side("baseline", stages, [1.0] * len(stages))
    cand = _side("candidate", [d[::-1] for d in stages], [factor] * len(stages))
    step, changes, overlap, _, machine = compare_sides(base, cand, METHOD)
    assert machine is not None and machine.common and machine.factor == pytest.approx(factor, rel=1e-9)
    assert not [c for c in changes if c.significant]
    assert all(c.machine_pct is not None and c.relative_pct == pytest.approx(0, abs=1e-6) for c in changes)
    said = findings(step, changes, overlap, None, METHOD, machine=machine)
    assert [f.kind for f in said].count("machine") == 1
    assert [f.kind for f in said if f.kind == "stage"] == []
    sign = "+" if factor > 1 else "\u2212"
    assert said[1].text.startswith(f"every stage {sign}")
    assert said[1].text.endswith("the machine, not a stage; each stage is judged against it")


@settings(max_examples=60, deadline=None)
@given(runs(), factors, factors, st.data())
def test_a_planted_stage_on_top_of_a_uniform_factor_is_that_stage_and_only_it(
    stages: list[list[float]], factor: float, planted: float, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(stages) - 1))
    scale = [factor] * len(stages)
    scale[k] *= planted
    base = _side("baseline", stages, [1.0] * len(stages))
    cand = _side("candidate", [d[::-1] for d in stages], scale)
    step, changes, overlap, _, machine = compare_sides(base, cand, METHOD)
    assert machine is not None and machine.common and machine.factor == pytest.approx(factor, rel=1e-9)
    assert [c.stage for c in changes if c.significant] == [f"stage_{k}"]
    [only] = [c for c in changes if c.significant]
    assert only.relative_pct == pytest.approx(100 * (planted - 1), rel=1e-6)
    said = findings(step, changes, overlap, None, METHOD, machine=machine)
    assert [f.kind for f in said].count("machine") == 1
    stage_words = [f.text for f in said if f.kind == "stage"]
    assert len(stage_words) == 1 and stage_words[0].startswith(f"stage_{k} ") and "beyond the machine" in stage_words[0]
    if step.significant and step.delta_ms * only.delta_ms > 0:  # the stage moved the step its way: named first
        assert f": stage_{k} " in said[0].text


def test_a_stage_that_moved_with_the_machine_but_further_within_the_stages_spread_is_the_machines() -> None:
    """Six stages moved by 1.20-1.34 (a loaded machine slows each by its own factor): none stands out."""
    rng = random.Random(5)
    stages = [[size * rng.uniform(0.995, 1.005) for _ in range(20)] for size in (300, 100, 50, 20, 8, 2)]
    scale = [1.20, 1.22, 1.26, 1.28, 1.31, 1.34]
    step, changes, overlap, _, machine = compare_sides(
        _side("baseline", stages, [1.0] * 6), _side("candidate", stages, scale), METHOD
    )
    assert machine is not None and machine.common and 26 <= machine.pct <= 29
    assert not [c for c in changes if c.significant]
    assert {c.verdict for c in changes} <= {Verdict.MACHINE, Verdict.NOISE, Verdict.SMALL}
    said = findings(step, changes, overlap, None, METHOD, machine=machine)
    assert said[-1].text.startswith("No stage changed beyond noise against the machine-wide shift")


# --------------------------------------------------------------------------- the whole path


def machine_run(directory: Path, *, seed: int, factor: float = 1.0, slow: float = 1.0, steps: int = 12) -> Path:
    """:func:`timeline_run` with every stage ``factor`` times as long (a machine), ``update_actor`` ``slow``."""
    return timeline_run(
        directory, seed=seed, steps=steps, slow=slow, stages={k: v * factor for k, v in STAGES_MS.items()}
    )


def test_a_slower_machine_is_said_once_in_text_json_and_page(tmp_path: Path) -> None:
    base = machine_run(tmp_path / "base", seed=31)
    cand = machine_run(tmp_path / "cand", seed=32, factor=1.27)
    result = compare(base, cand)
    assert not result.significant
    assert result.machine is not None and result.machine.common and result.machine.pct == pytest.approx(27, abs=2)
    texts = [f.text for f in result.findings]
    assert re.fullmatch(
        r"candidate is 2[67]% slower per step \(0.8\d \u2192 1.0\d s, 12 steps each, beyond noise\)", texts[0]
    )
    assert re.fullmatch(
        r"every stage \+2[678]% \(3 of 3 beyond noise\): the machine, not a stage; each stage is judged against it",
        texts[1],
    )
    assert texts[2].startswith("No stage changed beyond noise against the machine-wide shift (3 stages compared")
    text = render_compare_text(result)
    assert text.count("the machine, not a stage") == 1 and "vs machine" in text
    page = write_compare_html(result, tmp_path / "page.html").read_text()
    assert page.count("the machine, not a stage") == 1 and "vs machine" in page
    data = json.loads(result.to_json())
    assert data["machine"]["common"] is True and data["machine"]["change_pct"] == pytest.approx(27, abs=2)
    assert data["machine"]["stages"] == data["machine"]["moved"] == data["machine"]["along"] == 3
    for change in data["changes"]:
        assert change["machine_pct"] == data["machine"]["change_pct"] and abs(change["relative_pct"]) < 3
        assert change["verdict"] != "changed" and len(change["relative_ci_pct"]) == 2


def test_a_planted_stage_on_a_slower_machine_is_named_first_with_its_window(tmp_path: Path) -> None:
    base = machine_run(tmp_path / "base", seed=33)
    cand = machine_run(tmp_path / "cand", seed=34, factor=1.27, slow=1.3)
    result = compare(base, cand)
    assert [c.stage for c in result.significant] == ["update_actor"]
    slowed = result.significant[0]
    assert slowed.relative_pct == pytest.approx(30, abs=3) and slowed.change_pct == pytest.approx(65, abs=5)
    texts = [f.text for f in result.findings]
    assert texts[0].startswith("candidate is ") and ": update_actor +" in texts[0] and ", mb2 +" in texts[0]
    assert texts[1].startswith("every stage +") and "the machine, not a stage" in texts[1]
    assert re.match(
        r"update_actor \+(2[789]|3[0-3])% beyond the machine \(\+6\d% measured, \d+ \u2192 \d+ ms on all 4", texts[2]
    )
    assert texts[3] == "Nothing else changed beyond noise"


def test_a_faster_machine_and_no_machine_are_told_apart(tmp_path: Path) -> None:
    base = machine_run(tmp_path / "base", seed=35)
    faster = compare(base, machine_run(tmp_path / "fast", seed=36, factor=0.7))
    assert faster.machine is not None and faster.machine.common and faster.machine.pct == pytest.approx(-30, abs=2)
    assert faster.findings[1].text.startswith("every stage \u221230%")
    same = compare(base, machine_run(tmp_path / "same", seed=37))
    assert same.machine is not None and not same.machine.common
    assert all(c.machine_pct is None and c.relative_pct is None for c in same.changes)
    assert not any(f.kind == "machine" for f in same.findings)
    assert json.loads(same.to_json())["machine"]["common"] is False


def test_seeded_pairs_on_a_slower_machine_report_no_stage(tmp_path: Path) -> None:
    """40 seeded pairs, 2 ranks x 8 steps, 3% noise per instance, the candidate's machine 10-60% slower with
    each stage off its factor by up to 2% (so none moved 5% more than another): no stage reported, the machine
    said in each (docs/compare.md gives the counts; judged against the baseline itself, every stage of every pair
    was reported)."""
    rng = random.Random(2024)
    reported = machine_said = 0
    for seed in range(40):
        factor = rng.uniform(1.1, 1.6)
        stages = {k: v * factor * rng.uniform(0.98, 1.02) for k, v in STAGES_MS.items()}
        base = timeline_run(tmp_path / f"b{seed}", seed=2 * seed, ranks=2, steps=8)
        cand = timeline_run(tmp_path / f"c{seed}", seed=2 * seed + 1, ranks=2, steps=8, stages=stages)
        result = compare(base, cand)
        reported += len(result.significant)
        machine_said += sum(f.kind == "machine" for f in result.findings)
    assert reported == 0
    assert machine_said == 40


def test_runs_from_different_machines_say_so(tmp_path: Path) -> None:
    base = machine_run(tmp_path / "base", seed=38)
    cand = tmp_path / "cand"
    cand.mkdir()
    rng = random.Random(39)
    for rank in range(4):
        spans: list[tuple[Any, ...]] = []
        for step in range(1, 13):
            t = begin = step * 10_000 * MS
            for stage, ms in STAGES_MS.items():
                length = round(ms * MS * (1 + rng.gauss(0, 0.03)))
                spans.append(("stage", "actor", stage, step, t, t + length))
                t += length
            spans.append(("step", "actor", "", step, begin, t))
        write_timeline(cand, "actor", rank, 4, spans, host=f"node-{'bc'[rank % 2]}")
    result = compare(base, cand)
    assert result.overlap.hosts == (("node-a",), ("node-b", "node-c"))
    assert [f.text for f in result.findings if f.kind == "mismatch"] == [
        "the machines differ (baseline on node-a; candidate on node-b, node-c): a change may be the hardware's"
    ]
    hosts = json.loads(result.to_json())["overlap"]["hosts"]
    assert hosts == {"baseline": ["node-a"], "candidate": ["node-b", "node-c"]}
    same = compare(base, base)
    assert not same.overlap.machines_differ and not [f for f in same.findings if f.kind == "mismatch"]


def test_the_sdks_own_stages_are_never_compared(tmp_path: Path) -> None:
    """Spans named ``instrument:<what>`` (the SDK's own time) stay out of the stage deltas and the shift."""
    sides = []
    for name, seed, start_ms in (("base", 40, 5.0), ("cand", 41, 900.0)):
        directory = tmp_path / name
        directory.mkdir()
        rng = random.Random(seed)
        spans: list[tuple[Any, ...]] = []
        for step in range(1, 9):
            t = begin = step * 10_000 * MS
            spans.append(("stage", "actor", "instrument:profiler_start", step, t, t + round(start_ms * MS)))
            t += round(start_ms * MS)
            for stage, ms in STAGES_MS.items():
                length = round(ms * MS * (1 + rng.gauss(0, 0.03)))
                spans.append(("stage", "actor", stage, step, t, t + length))
                t += length
            spans.append(("step", "actor", "", step, begin, t))
        write_timeline(directory, "actor", 0, 1, spans)
        sides.append(directory)
    result = compare(*sides)
    assert sorted(c.stage or "" for c in result.changes) == sorted(STAGES_MS)
    assert not result.significant and math.isfinite(result.step.baseline_ms)


def test_a_stage_from_nothing_under_a_machine_wide_shift_is_reported_not_divided_by() -> None:
    stages = [[size * (1 + 0.0005 * j) for j in range(8)] for size in (300.0, 100.0, 50.0)]
    base = _side("baseline", [*stages, [0.0] * 8], [1.0] * 4)
    cand = _side("candidate", [*stages, [5.0 + 0.01 * j for j in range(8)]], [1.5, 1.5, 1.5, 1.0])
    _, changes, _, _, machine = compare_sides(base, cand, METHOD)
    assert machine is not None and machine.common and machine.stages == 3  # the empty stage has no ratio
    assert [c.stage for c in changes if c.significant] == ["stage_3"]
