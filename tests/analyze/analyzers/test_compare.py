"""``instrument.analyze.compare`` on pairs of runs with known durations.

Every run is built here: timeline files written with :mod:`instrument.timeline`'s encoders on a made-up
clock, and SDK-named Chrome traces with exact ``ts`` / ``dur``. Noise comes from ``random.Random(seed)``
with fixed seeds; no clock is read and nothing sleeps, so a loaded machine cannot change an outcome.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from instrument import naming
from instrument.analyze import Comparison, analyze, compare
from instrument.analyze.analyzers._compare_stats import ALPHA, judge, mann_whitney, ratio_interval
from instrument.analyze.model import Verdict
from instrument.analyze.render._compare import render_compare_text, write_compare_html
from instrument.timeline import encode_header, encode_name, encode_span, encode_thread

MS = 1_000_000  # ns
BASE_US = 5_203_029_000_000.0
STAGES_MS = {"generate_sequences": 300.0, "compute_log_prob": 100.0, "update_actor": 400.0}
MM_MS = 150.0  # aten::mm inside update_actor, the planted op
SLOW = 1.3


# --------------------------------------------------------------------------- runs with known durations


def write_timeline(
    directory: Path, role: str, rank: int, world: int, spans: list[tuple[Any, ...]], host: str = "node-a"
) -> Path:
    """One process's timeline file: ``spans`` are (kind, role, stage, step, start_ns, end_ns[, thread])."""
    header = encode_header(role=role, rank=rank, world_size=world, host=host, pid=100 + rank, mono_ns=0, wall_ns=0)
    data = bytearray(header)
    names: dict[tuple[str, str, str], int] = {}
    data += encode_thread(0, 1) + encode_thread(1, 2)
    for kind, span_role, stage, step, start, end, *thread in spans:
        key = (kind, span_role, stage)
        if key not in names:
            names[key] = len(names)
            data += encode_name(names[key], kind, span_role, stage)
        data += encode_span(names[key], thread[0] if thread else 0, step, start, end)
    base = naming.trace_basename(
        role=role,
        stage=naming.TIMELINE_STAGE,
        step=0,
        rank=rank,
        world_size=world,
        host=host,
        pid=100 + rank,
        timestamp_ns=1,
    )
    path = directory / f"{base}{naming.TIMELINE_SUFFIX}"
    path.write_bytes(bytes(data))
    return path


def timeline_run(
    directory: Path,
    *,
    seed: int,
    ranks: int = 4,
    steps: int = 12,
    slow: float = 1.0,
    noise: float = 0.03,
    stages: dict[str, float] | None = None,
    role: str = "actor",
    extra_role: tuple[str, str, float] | None = None,
) -> Path:
    """Every rank runs the stages one after another each step; update_actor's four windows split its time,
    and ``slow`` stretches update_actor by that factor, all of it in window mb2."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for rank in range(ranks):
        spans: list[tuple[Any, ...]] = []
        for step in range(1, steps + 1):
            t = step * 10_000 * MS
            begin = t
            for stage, base_ms in (stages or STAGES_MS).items():
                length = round(base_ms * MS * (1 + rng.gauss(0, noise)))
                if stage == "update_actor":
                    quarter = length // 4
                    extra = round((slow - 1) * length)
                    windows = [quarter, quarter, quarter + extra, length - 3 * quarter]
                    start = t
                    for i, w in enumerate(windows):
                        spans.append(("window", role, f"mb{i}", step, start, start + w))
                        start += w
                    length = start - t
                spans.append(("stage", role, stage, step, t, t + length))
                t += length + MS
            if extra_role is not None:
                other_role, other_stage, other_ms = extra_role
                length = round(other_ms * MS * (1 + rng.gauss(0, noise)))
                spans.append(("stage", other_role, other_stage, step, t, t + length))
                t += length
            spans.append(("step", role, "", step, begin, t))
        write_timeline(directory, role, rank, ranks, spans)
    return directory


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 7, **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def sdk_trace(directory: Path, events: list[dict[str, Any]], *, stage: str, step: int, rank: int, world: int) -> Path:
    """A gzipped Chrome trace under the SDK's name, with the header the SDK writes."""
    stamp = 1_764_000_000_000_000_000 + step * 1000 + rank
    base = naming.trace_basename(
        role="actor",
        stage=stage,
        step=step,
        rank=rank,
        world_size=world,
        host="node-a",
        pid=4242 + rank,
        timestamp_ns=stamp,
    )
    header = {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "instrument": {"role": "actor", "stage": stage, "step": step, "rank": rank},
    }
    path = directory / f"{base}.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, **header, "traceEvents": events}).encode()))
    return path


def stage_events(stage: str, ts: float, length_us: float, mm_us: float | None) -> list[dict[str, Any]]:
    """The stage's range; inside it (update_actor) aten::mm holding a 1 ms aten::copy_, an aten::add, one
    GEMM kernel and one NCCL kernel with their launches; elsewhere one aten::linear over half the stage."""
    events = [_x(stage, ts, length_us, cat="user_annotation")]
    if mm_us is None:
        return [*events, _x("aten::linear", ts + 10, length_us / 2)]
    events += [
        _x("aten::mm", ts + 10, mm_us),
        _x("aten::copy_", ts + 20, 1000.0),
        _x("aten::add", ts + 20 + mm_us, 20_000.0),
        _x("cudaLaunchKernel", ts + 30, 5.0, cat="cuda_runtime", correlation=1),
        _x("ampere_sgemm_128x64_nn", ts + 40, 30_000.0, cat="kernel", tid=7_000, correlation=1),
        _x("cudaLaunchKernel", ts + 50, 5.0, cat="cuda_runtime", correlation=2),
        _x("ncclKernel_AllReduce_RING_LL_Sum_float", ts + 30_100, 8_000.0, cat="kernel", tid=7_001, correlation=2),
    ]
    return events


def trace_run(directory: Path, *, seed: int, ranks: int = 4, steps: int = 6, slow: bool = False) -> Path:
    """One SDK trace per (step, rank, stage); in the slow run update_actor is 30% longer, all of it aten::mm."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for rank in range(ranks):
        for step in range(1, steps + 1):
            ts = BASE_US + rank * 7_000_000.0 + step * 1_000_000.0
            for stage, base_ms in STAGES_MS.items():
                scale = 1 + rng.gauss(0, 0.02)
                length = base_ms * 1000 * scale
                mm = None
                if stage == "update_actor":
                    mm = MM_MS * 1000 * scale
                    if slow:
                        extra = (SLOW - 1) * length
                        length, mm = length + extra, mm + extra
                events = stage_events(stage, ts, length, mm)
                sdk_trace(directory, events, stage=stage, step=step, rank=rank, world=ranks)
                ts += length + 100
    return directory


def by_stage(comparison: Comparison) -> dict[str, Any]:
    return {c.stage or "": c for c in comparison.changes}


# --------------------------------------------------------------------------- one planted change


def test_a_stage_slowed_by_30_percent_in_traces_is_the_only_change_and_its_op_the_top_cause(tmp_path: Path) -> None:
    base = trace_run(tmp_path / "base", seed=1)
    cand = trace_run(tmp_path / "cand", seed=2, slow=True)
    result = compare(base, cand)
    assert [c.stage for c in result.significant] == ["update_actor"]
    slowed = by_stage(result)["update_actor"]
    assert slowed.source == "traces"
    assert slowed.samples == (24, 24)
    assert slowed.change_pct == pytest.approx(30, abs=3)
    assert slowed.ci_pct is not None and slowed.ci_pct[0] < 30 < slowed.ci_pct[1]
    assert slowed.moved_ranks == ("0", "1", "2", "3")
    top = slowed.causes[0]
    assert (top.kind, top.name, top.status) == ("op", "aten::mm", "changed")
    assert top.delta_ms == pytest.approx(0.3 * 400, rel=0.05)  # the whole change, per stage instance
    assert top.baseline_ms == pytest.approx(MM_MS - 1.0, rel=0.05)  # self time: the copy_ inside it is not its own
    assert top.baseline_count == top.candidate_count == 1
    others = {c.name: c for c in slowed.causes[1:]}
    assert "aten::add" not in others  # unchanged: never a cause
    assert slowed.causes_from == "traces: 8 and 8 stage instances"
    assert slowed.kernel_comm_share == (pytest.approx(100 * 8 / 38), pytest.approx(100 * 8 / 38))
    for change in result.changes:
        if change.stage != "update_actor":
            assert change.verdict in (Verdict.NOISE, Verdict.SMALL) and not change.causes
    texts = [f.text for f in result.findings]
    assert texts[0].startswith("candidate is ") and "slower per step" in texts[0] and "6 steps each" in texts[0]
    assert re.fullmatch(
        r"update_actor \+(29|30|31)% \(\d+ \u2192 \d+ ms on all 4 ranks\): aten::mm \+1\d\d ms", texts[1]
    )
    assert texts[2] == "Nothing else changed beyond noise"


def test_a_stage_slowed_in_the_timeline_names_the_window_that_grew(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=3)
    cand = timeline_run(tmp_path / "cand", seed=4, slow=SLOW)
    result = compare(base, cand)
    assert [c.stage for c in result.significant] == ["update_actor"]
    slowed = by_stage(result)["update_actor"]
    assert (slowed.source, slowed.samples, slowed.ranks, slowed.steps) == ("timeline", (48, 48), (4, 4), (12, 12))
    assert slowed.change_pct == pytest.approx(30, abs=3)
    top = slowed.causes[0]
    assert (top.kind, top.name) == ("window", "mb2")
    assert top.delta_ms == pytest.approx(120, rel=0.05)
    assert all(abs(c.delta_ms) < 5 for c in slowed.causes[1:])
    assert slowed.causes_note == "no trace of it in either run: ops and kernels unknown"
    assert result.step.significant and result.step.source == "timeline"
    assert result.timeline is not None
    assert [r.role for r in result.timeline.roles] == ["actor"]
    path = {p.stage: p for p in result.timeline.critical_path}
    assert path["update_actor"].candidate_ms > path["update_actor"].baseline_ms * 1.25


def test_a_faster_stage_is_reported_as_faster(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=5, slow=SLOW)
    cand = timeline_run(tmp_path / "cand", seed=6)
    result = compare(base, cand)
    [faster] = result.significant
    assert faster.stage == "update_actor" and faster.change_pct is not None and faster.change_pct < -20
    assert "faster per step" in result.findings[0].text
    assert re.match(
        r"update_actor \u22122[234]% \(\d+ \u2192 \d+ ms on all 4 ranks\): mb2 \u22121\d\d ms", result.findings[1].text
    )


def test_min_change_raises_the_bar(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=7)
    cand = timeline_run(tmp_path / "cand", seed=8, slow=SLOW)
    result = compare(base, cand, min_change_pct=40)
    assert not result.significant
    assert by_stage(result)["update_actor"].verdict == Verdict.SMALL  # beyond noise, under the bar
    assert result.findings[1].text.startswith("No stage changed beyond noise")


# --------------------------------------------------------------------------- noise only


def test_noise_only_pairs_report_no_change_across_many_seeds(tmp_path: Path) -> None:
    """40 pairs of runs that differ only by noise (3% per instance): no change is ever reported, and the
    test alone (the size bar aside) calls a stage beyond noise at about its level, alpha = 1%."""
    beyond = judged = 0
    for seed in range(40):
        base = timeline_run(tmp_path / f"b{seed}", seed=2 * seed, ranks=2, steps=8)
        cand = timeline_run(tmp_path / f"c{seed}", seed=2 * seed + 1, ranks=2, steps=8)
        result = compare(base, cand)
        assert not result.significant, [f.text for f in result.findings]
        assert not result.step.significant
        judged += len(result.changes) + 1
        beyond += sum(c.beyond_noise for c in result.changes) + result.step.beyond_noise
        assert result.findings[1].text.startswith("No stage changed beyond noise")
    bound = ALPHA * judged + 3 * math.sqrt(judged * ALPHA * (1 - ALPHA))  # 160 calls: 1.6 expected, at most 5.4
    assert beyond <= bound, f"{beyond} of {judged} calls beyond noise"


@pytest.mark.parametrize(("size", "spread"), [(5, 0.05), (8, 0.2), (24, 0.03), (96, 0.1)])
def test_the_rank_sum_test_keeps_its_false_positive_rate(size: int, spread: float) -> None:
    """Pure noise, 2,000 fixed seeds a size: the share called beyond noise stays within the binomial spread
    of alpha = 1% (exact below 30 samples a side, the normal approximation above)."""
    trials = 2000
    hits = 0
    for seed in range(trials):
        rng = random.Random(seed * 7919 + size)
        x = [100 * rng.lognormvariate(0, spread) for _ in range(size)]
        y = [100 * rng.lognormvariate(0, spread) for _ in range(size)]
        hits += judge(x, y, min_change_pct=0).verdict != Verdict.NOISE
    bound = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)
    assert hits / trials <= bound, hits


def test_reported_changes_from_noise_are_rarer_still() -> None:
    """The size bar on top of the test: 3% noise, 12 steps x 8 ranks a side, 1,000 pairs: none reported."""
    for seed in range(1000):
        rng = random.Random(seed)
        x = [rng.gauss(400, 12) for _ in range(96)]
        y = [rng.gauss(400, 12) for _ in range(96)]
        assert judge(x, y).verdict != Verdict.CHANGED


# --------------------------------------------------------------------------- the test and the interval


def test_exact_p_values_of_small_samples() -> None:
    assert mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert mann_whitney([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    assert mann_whitney([1, 3, 5], [2, 4, 6]) == pytest.approx(0.7)  # U = 6 of 9: P(U >= 6) = 7/20
    assert mann_whitney([1.0] * 6, [1.0] * 6) == 1.0  # all tied: no evidence


def test_the_interval_excludes_zero_exactly_when_the_test_rejects() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        n = rng.choice([6, 12, 40])
        shift = rng.choice([1.0, 1.05, 1.2])
        x = [rng.lognormvariate(0, 0.1) for _ in range(n)]
        y = [shift * rng.lognormvariate(0, 0.1) for _ in range(n)]
        interval = ratio_interval(x, y, ALPHA)
        assert interval is not None
        rejects = mann_whitney(x, y) < ALPHA
        excludes = interval[0] > 0 or interval[1] < 0
        near = min(abs(interval[0]), abs(interval[1])) < 1e-6  # a bound on a pairwise difference of 0
        assert rejects == excludes or near, (seed, interval, mann_whitney(x, y))


def test_too_few_samples_give_no_verdict(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=9, ranks=1, steps=3)
    cand = timeline_run(tmp_path / "cand", seed=10, ranks=1, steps=3, slow=2.0)
    result = compare(base, cand)
    assert not result.significant
    assert {c.verdict for c in result.changes} == {Verdict.TOO_FEW}
    assert all(c.ci_pct is None and c.p_value is None for c in result.changes)
    texts = [f.text for f in result.findings]
    assert "too few steps (3 and 3; 5 a side needed) for a verdict" in texts[0]
    assert any(t.startswith("too few samples for a verdict (5 a side needed) on update_actor (3 and 3)") for t in texts)


# --------------------------------------------------------------------------- runs that differ in shape


def test_mismatched_runs_are_compared_where_they_overlap(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=11, ranks=4, extra_role=("critic", "compute_values", 50.0))
    fewer = {"generate_sequences": 300.0, "update_actor": 400.0, "compute_ref_log_prob": 80.0}
    cand = timeline_run(tmp_path / "cand", seed=12, ranks=2, slow=SLOW, stages=fewer)
    result = compare(base, cand)
    assert {(c.role, c.stage) for c in result.changes} == {("actor", "generate_sequences"), ("actor", "update_actor")}
    assert [c.stage for c in result.significant] == ["update_actor"]
    assert by_stage(result)["update_actor"].ranks == (2, 2)  # ranks 2 and 3 of the baseline left out
    overlap = result.overlap
    assert overlap.common_ranks == ("0", "1") and overlap.only_baseline_ranks == ("2", "3")
    assert overlap.only_baseline_roles == ("critic",)
    assert overlap.only_baseline_stages == (("actor", "compute_log_prob"), ("critic", "compute_values"))
    assert overlap.only_candidate_stages == (("actor", "compute_ref_log_prob"),)
    mismatch = [f.text for f in result.findings if f.kind == "mismatch"]
    assert mismatch == [
        "ranks differ (4 and 2): compared on the 2 ranks both ran (0-1); only in the baseline: 2-3",
        "roles not compared, only in the baseline: critic",
        "stages not compared, only in the baseline: actor compute_log_prob, critic compute_values; "
        "only in the candidate: actor compute_ref_log_prob",
    ]


def test_runs_that_share_no_rank_are_compared_across_all_their_ranks(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=13, ranks=2)
    cand = tmp_path / "cand"
    cand.mkdir()
    for path in timeline_run(tmp_path / "tmp", seed=14, ranks=4, slow=SLOW).iterdir():
        if "rank2" in path.name or "rank3" in path.name:
            path.rename(cand / path.name)
    result = compare(base, cand)
    assert [c.stage for c in result.significant] == ["update_actor"]
    assert result.notes == ("the runs share no rank: every rank of each is compared",)


def test_a_timeline_run_against_a_traced_one_is_compared_by_what_each_has(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=24)
    cand = trace_run(tmp_path / "cand", seed=25, slow=True)
    result = compare(base, cand)
    assert {c.source for c in result.changes} == {"mixed"}
    assert [c.stage for c in result.significant] == ["update_actor"]
    slowed = by_stage(result)["update_actor"]
    assert slowed.samples == (48, 24)
    assert slowed.causes_note == "no trace of it in the baseline: ops and kernels unknown"


def test_filters_choose_what_is_compared(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=15)
    cand = timeline_run(tmp_path / "cand", seed=16, slow=SLOW)
    only = compare(base, cand, stages=["generate-sequences"])
    assert [c.stage for c in only.changes] == ["generate_sequences"] and not only.significant
    some = compare(base, cand, ranks=[0, 1], steps=range(1, 7))
    assert by_stage(some)["update_actor"].samples == (12, 12)
    assert by_stage(some)["update_actor"].significant


def test_analyses_as_json_compare_like_their_directories(tmp_path: Path) -> None:
    base = trace_run(tmp_path / "base", seed=17)
    cand = trace_run(tmp_path / "cand", seed=18, slow=True)
    for name in ("base", "cand"):
        (tmp_path / f"{name}.json").write_text(analyze(tmp_path / name).to_json())
    from_json = compare(tmp_path / "base.json", tmp_path / "cand.json")
    from_dirs = compare(base, cand)
    assert [c.stage for c in from_json.significant] == ["update_actor"]
    assert [(c.stage, c.samples, c.verdict) for c in from_json.changes] == [
        (c.stage, c.samples, c.verdict) for c in from_dirs.changes
    ]
    assert from_json.changes[0].source == "json"
    assert from_json.significant[0].causes[0].name == "aten::mm"  # the files it names are still there


# --------------------------------------------------------------------------- the contract and the renderers


def test_the_json_contract(tmp_path: Path) -> None:
    base = trace_run(tmp_path / "base", seed=19)
    cand = trace_run(tmp_path / "cand", seed=20, slow=True)
    data = json.loads(compare(base, cand).to_json())
    assert data["baseline"] == str(base) and data["candidate"] == str(cand)
    assert {"baseline_ms", "candidate_ms", "change_pct", "significant"} <= set(data["step"])
    assert len(data["changes"]) == 3
    keys = {"role", "stage", "baseline_ms", "candidate_ms", "change_pct", "ci_pct", "significant", "samples", "causes"}
    for change in data["changes"]:
        assert keys <= set(change)
        assert isinstance(change["significant"], bool) and len(change["samples"]) == 2 and len(change["ci_pct"]) == 2
    deltas = [abs(c["candidate_ms"] - c["baseline_ms"]) for c in data["changes"]]
    assert deltas == sorted(deltas, reverse=True)
    cause = data["changes"][0]["causes"][0]
    assert {"kind", "name", "baseline_ms", "candidate_ms", "delta_ms"} <= set(cause)
    assert cause["kind"] in ("op", "kernel") and cause["name"] == "aten::mm"
    assert all({"kind", "text", "delta_ms"} <= set(f) for f in data["findings"])


def test_text_and_page_say_the_findings_first(tmp_path: Path) -> None:
    base = trace_run(tmp_path / "base", seed=21)
    cand = trace_run(tmp_path / "cand", seed=22, slow=True)
    result = compare(base, cand)
    text = render_compare_text(result)
    lines = text.splitlines()
    assert lines[2] == "Findings" and lines[3].startswith("1. candidate is ")
    assert text.index("Findings") < text.index("Stages") < text.index("Causes: actor update_actor +")
    assert "aten::mm" in text and "GPU time in communication kernels: 21.1% \u2192 21.1%" in text
    page = write_compare_html(result, tmp_path / "page.html")
    body = page.read_text()
    assert "<h2>Findings</h2>" in body and "aten::mm" in body and "<script" not in body


def test_import_loads_no_optional_library() -> None:
    optional = ("rich", "matplotlib", "torch", "ijson", "orjson", "ray", "plotly")
    code = f"import sys, instrument.analyze; print(sorted(m for m in {optional!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=23, ranks=1, steps=6)
    with pytest.raises(ValueError, match="'alpha' must be"):
        compare(base, base, alpha=1.5)
    with pytest.raises(ValueError, match="'min_change_pct' must be"):
        compare(base, base, min_change_pct=-1)
    with pytest.raises(FileNotFoundError, match=r"candidate .*: no such directory or file"):
        compare(base, tmp_path / "missing")
