"""The step timeline built from traces' step and stage ranges, for a run that wrote no timeline file.

Real torch.profiler traces: the SDK's own, written by real gloo processes where one rank's generation
sleeps eight times longer than the others' (sleeps are lower bounds: a busy machine only stretches them,
and every margin below holds while the slow rank's stage stays clearly the longest), and plain
``torch.profiler`` traces with ``ProfilerStep#N`` and ``record_function`` stages. The properties run
the pure part on exact made-up ranges.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile, record_function

import instrument as ins
from instrument import cli
from instrument.analyze import analyze
from instrument.analyze.model import TraceFile
from instrument.analyze.traces._reader import FileScan
from instrument.analyze.traces._trace_spans import FROM_TRACES_NOTE, NO_STEP_RANGES, TraceSpans
from instrument.naming import TIMELINE_SUFFIX
from tests.conftest import spawn_ranks

WORLD = 3
STEPS = 3
SLOW = 2
# The slow rank's sleep is a lower bound; the fast ranks' 50 ms (and their profiler's start, inside the step)
# may stretch on a busy box: 1.2 s leaves them more than half a second to stretch before an assertion moves.
GENERATE_S = {0: 0.05, 1: 0.05, SLOW: 1.2}
UPDATE_S = 0.05


# --------------------------------------------------------------------------- the SDK's traces, real ranks


def _rank(rank: int, save: str, rendezvous: str, discrete: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    cfg = ins.ProfilerConfig(save_path=save, all_ranks=True, contents=("cpu",), discrete=discrete)
    ins.configure(cfg, role="actor")

    @ins.profiled_stage("generate_sequences")
    def generate() -> None:
        time.sleep(GENERATE_S[rank])

    @ins.profiled_stage("update_actor")
    def update() -> None:
        time.sleep(UPDATE_S)

    for step in range(1, STEPS + 1):
        with ins.profile_step(step, last=(step == STEPS)):
            generate()
            dist.barrier()  # the fast ranks wait here, outside any stage, for the slow generation
            update()
    ins.finish()
    dist.destroy_process_group()


def _sdk_run(tmp_path: Path, discrete: bool) -> Path:
    save = tmp_path / "profile"
    spawn_ranks(_rank, (str(save), str(tmp_path / "rendezvous"), discrete), nprocs=WORLD)
    return save


def _json(directory: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main(["analyze", str(directory), "--json", "--no-png", "--quiet"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _without_timelines(save: Path) -> None:
    timelines = list(save.glob(f"*{TIMELINE_SUFFIX}"))
    assert len(timelines) == WORLD
    for path in timelines:
        path.unlink()


def _straggler(data: dict[str, Any]) -> None:
    stragglers = [f for f in data["findings"] if f["kind"] == "straggler"]
    assert [(f["role"], f["stage"], f["rank"]) for f in stragglers] == [("actor", "generate_sequences", SLOW)]
    assert sorted(stragglers[0]["steps"]) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_continuous_sdk_traces_give_idle_waits_and_the_critical_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save = _sdk_run(tmp_path, discrete=False)
    with_files = _json(save, capsys)
    assert with_files["timeline"]["source"] == "files"  # timeline files win
    assert FROM_TRACES_NOTE not in (with_files["timeline"]["clock"]["note"] or "")
    _without_timelines(save)
    data = _json(save, capsys)

    timeline = data["timeline"]
    assert timeline["clock"]["aligned"] is True  # one host: one clock
    assert timeline["source"] == "traces" and FROM_TRACES_NOTE in timeline["clock"]["note"]
    assert [s["step"] for s in timeline["steps"]] == list(range(1, STEPS + 1))
    slow_ms, fast_ms = GENERATE_S[SLOW] * 1000, GENERATE_S[0] * 1000
    for step in timeline["steps"]:
        assert step["wall_ms"] >= slow_ms + UPDATE_S * 1000
        ranks = {r["rank"]: r for r in step["ranks"]}
        assert sorted(ranks) == list(range(WORLD))
        for fast in (0, 1):
            # idle for at least half of what the slow rank generated longer, waiting for it
            assert ranks[fast]["idle_ms"] >= 0.5 * (slow_ms - fast_ms)
            cause = max(ranks[fast]["waited_for"], key=lambda w: w["ms"])
            assert (cause["role"], cause["stage"], cause["rank"]) == ("actor", "generate_sequences", SLOW)
        path = [(p["role"], p["stage"], p["rank"]) for p in step["critical_path"] if p["stage"] != "idle"]
        assert ("actor", "generate_sequences", SLOW) in path
        assert path.index(("actor", "generate_sequences", SLOW)) < max(
            i for i, part in enumerate(path) if part[1] == "update_actor"
        )
        assert sum(p["ms"] for p in step["critical_path"]) == pytest.approx(step["wall_ms"], abs=0.01)
    _straggler(data)
    assert [f["lost_ms"] for f in data["findings"]] == sorted((f["lost_ms"] for f in data["findings"]), reverse=True)
    assert data["stages"]  # the stage table as before, beside it


@pytest.mark.slow
def test_discrete_sdk_traces_give_the_traced_steps_and_the_straggler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save = _sdk_run(tmp_path, discrete=True)
    _without_timelines(save)
    data = _json(save, capsys)
    timeline = data["timeline"]
    assert timeline["clock"]["aligned"] is True
    assert [s["step"] for s in timeline["steps"]] == list(range(1, STEPS + 1))
    for step in timeline["steps"]:
        ranks = {r["rank"]: r for r in step["ranks"]}
        assert sorted(ranks) == list(range(WORLD))
        # a stage file holds no step bounds: each rank's step is its host's first to last traced stage of it,
        # so a fast rank is idle while the slow one generates
        for fast in (0, 1):
            assert ranks[fast]["idle_ms"] >= 0.5 * (GENERATE_S[SLOW] - GENERATE_S[0]) * 1000
        assert ranks[SLOW]["busy_ms"] >= GENERATE_S[SLOW] * 1000
    _straggler(data)


# --------------------------------------------------------------------------- plain torch.profiler traces


def _plain_trace(path: Path, *, steps: bool, rank: int | None = None) -> None:
    """A loop of 3 recorded steps: generate (40 ms), update_actor (10 ms), then 20 ms outside any stage."""
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1) if steps else None

    def save(prof: profile) -> None:
        prof.export_chrome_trace(str(path))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=save) as prof:
        if rank is not None:  # as torch writes it under torch.distributed
            prof.add_metadata_json("distributedInfo", json.dumps({"backend": "gloo", "rank": rank, "world_size": 2}))
        for _ in range(4):
            with record_function("generate"):
                time.sleep(0.04)
            with record_function("update_actor"):
                time.sleep(0.01)
            time.sleep(0.02)
            prof.step()


def test_a_plain_torch_trace_gives_its_profiler_steps_as_the_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _plain_trace(tmp_path / "worker0.1796.pt.trace.json", steps=True)
    data = _json(tmp_path, capsys)
    timeline = data["timeline"]
    assert FROM_TRACES_NOTE in timeline["clock"]["note"]
    assert [s["step"] for s in timeline["steps"]] == [1, 2, 3]  # ProfilerStep#1..3 (step 0 was warmup)
    for step in timeline["steps"]:
        [rank] = step["ranks"]
        assert rank["busy_ms"] >= 50 and rank["idle_ms"] >= 20  # the 20 ms outside any stage is idle
        assert step["wall_ms"] == pytest.approx(rank["busy_ms"] + rank["idle_ms"], abs=0.01)
        stages = [p["stage"] for p in step["critical_path"] if p["stage"] != "idle"]
        assert stages == ["generate", "update_actor"]
        assert step["generation_ms"] >= 40
    dominant = [f for f in data["findings"] if f["kind"] == "dominant_stage"]
    assert [f["stage"] for f in dominant] == ["generate"]


def test_plain_traces_of_two_ranks_are_two_lanes_on_one_clock(tmp_path: Path) -> None:
    for rank in (0, 1):
        _plain_trace(tmp_path / f"rank{rank}.pt.trace.json", steps=True, rank=rank)
    report = analyze(tmp_path, jobs=1)
    assert report.timeline is not None and report.timeline.clock.aligned  # same host: kineto's wall clock
    for step in report.timeline.steps:
        assert [r.rank for r in step.ranks] == [0, 1]
    # written one after the other, so the steps of rank 1 come after those of rank 0: the wall of a step
    # spans both (nothing here claims they ran together), and the filters keep to one rank
    only = analyze(tmp_path, jobs=1, ranks=[1])
    assert only.timeline is not None
    assert {r.rank for s in only.timeline.steps for r in s.ranks} == {1}
    assert report.timeline_spans is not None and len(report.timeline_spans.lanes) == 2


def test_traces_without_step_ranges_say_why_there_is_no_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _plain_trace(tmp_path / "worker0.1796.pt.trace.json", steps=False)  # no schedule: no ProfilerStep#N
    data = _json(tmp_path, capsys)
    assert data["timeline"] is None and data["findings"] == []
    assert NO_STEP_RANGES in data["timeline_note"]
    assert data["stages"]  # the stages are measured all the same


def test_a_directory_with_neither_says_why(tmp_path: Path) -> None:
    report = analyze(tmp_path, jobs=1)
    assert report.timeline is None and report.timeline_note is not None
    assert "no step timeline" in report.timeline_note and NO_STEP_RANGES not in report.timeline_note


# --------------------------------------------------------------------------- clocks, on exact timestamps

BASE = 1_790_857_026_000_000_000


def _ranked(path: Path, rank: int, host: str, base_ns: int, events: list[tuple[str, float, float]]) -> None:
    """A trace as kineto writes it: the host and the base of its µs clock before the events."""
    shift_us = (BASE - base_ns) / 1000  # the same instants, counted from another base
    header = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "host_name": host,
        "baseTimeNanoseconds": base_ns,
    }
    body = [
        {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts + shift_us, "dur": dur}
        for name, ts, dur in events
    ]
    path.write_text(json.dumps({**header, "traceEvents": body}), encoding="utf-8")


def _two_ranks(directory: Path, second_host: str) -> Path:
    """Step 1 is 100 ms on both ranks; rank 0 generates 80 ms, rank 1 generates 20 ms, then updates from
    80.5 ms on: it waits 60.5 ms for rank 0. Rank 1's file counts from a base one second earlier."""
    directory.mkdir()
    _ranked(directory / "rank0.pt.trace.json", 0, "a", BASE, [("ProfilerStep#1", 0, 100_000), ("generate", 0, 80_000)])
    steps: list[tuple[str, float, float]] = [
        ("ProfilerStep#1", 0, 100_000),
        ("generate", 0, 20_000),
        ("update_actor", 80_500, 19_500),
    ]
    _ranked(directory / "rank1.pt.trace.json", 1, second_host, BASE - 10**9, steps)
    return directory


def test_traces_of_one_host_are_put_on_one_axis_by_their_base_time(tmp_path: Path) -> None:
    report = analyze(_two_ranks(tmp_path / "one", second_host="a"), jobs=1)
    assert report.timeline is not None and report.timeline.clock.aligned
    [step] = report.timeline.steps
    assert step.wall_ms == 100.0
    rank1 = next(r for r in step.ranks if r.rank == 1)
    assert (rank1.busy_ms, rank1.idle_ms) == (39.5, 60.5)
    [wait] = rank1.waited_for
    assert (wait.role, wait.stage, wait.rank, wait.ms) == ("worker", "generate", 0, 60.5)  # no role in the traces
    assert [(p.stage, p.rank) for p in step.critical_path if p.stage != "idle"] == [
        ("generate", 0),
        ("update_actor", 1),
    ]


def test_traces_of_different_hosts_are_not_aligned_and_keep_to_durations(tmp_path: Path) -> None:
    report = analyze(_two_ranks(tmp_path / "two", second_host="b"), jobs=1)
    timeline = report.timeline
    assert timeline is not None and not timeline.clock.aligned
    assert timeline.clock.note is not None and FROM_TRACES_NOTE in timeline.clock.note
    [step] = timeline.steps
    assert step.critical_path == () and all(r.waited_for == () for r in step.ranks)
    assert {r.rank: r.idle_ms for r in step.ranks} == {0: 20.0, 1: 60.5}  # durations hold


def test_forged_clocks_and_steps_are_left_out_of_the_timeline_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _two_ranks(tmp_path / "run", second_host="a")
    forged = json.loads((directory / "rank1.pt.trace.json").read_text(encoding="utf-8"))
    forged["baseTimeNanoseconds"] = 10**30  # no clock counts from there: read as 0
    forged["traceEvents"] += [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{2**40}", "pid": 1, "tid": 1, "ts": 0, "dur": 1},
        {"ph": "X", "cat": "user_annotation", "name": "generate", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1},
    ]
    (directory / "rank1.pt.trace.json").write_text(json.dumps(forged), encoding="utf-8")
    data = _json(directory, capsys)
    assert [s["step"] for s in data["timeline"]["steps"]] == [1]
    assert cli.main(["analyze", str(directory), "--no-png", "--quiet", "--html", str(tmp_path / "a.html")]) == 0


# --------------------------------------------------------------------------- the pure part, on exact ranges

US = st.integers(min_value=0, max_value=10**9)


@st.composite
def _discrete_files(draw: st.DrawFn) -> list[tuple[TraceFile, FileScan]]:
    """Stage files of a few ranks and steps on one host, each one stage range (µs after the base)."""
    files = []
    for i in range(draw(st.integers(min_value=1, max_value=12))):
        rank = draw(st.integers(min_value=0, max_value=3))
        step = draw(st.integers(min_value=1, max_value=3))
        start = draw(US)
        length = draw(st.integers(min_value=0, max_value=10**6))
        name = draw(st.sampled_from(["generate_sequences", "update_actor"]))
        trace = TraceFile(f"/run/f{i}.json", "actor", name, step, rank, 4, source="name")
        header = {"baseTimeNanoseconds": BASE, "host_name": "h"}
        scan = FileScan([], header, 1, 0, stage_ranges=[(name, None, start, start + length)])
        files.append((trace, scan))
    return files


@settings(max_examples=60, deadline=None)
@given(_discrete_files())
def test_every_stage_range_is_one_span_inside_its_step(files: list[tuple[TraceFile, FileScan]]) -> None:
    traced = TraceSpans()
    for trace, scan in files:
        traced.add(trace, scan)
    timelines = traced.timelines()
    spans = [span for t in timelines for span in t.spans]
    stages = sorted((s.rank, s.step, s.stage, s.start_ns, s.end_ns) for s in spans if s.kind == "stage")
    assert stages == sorted(
        (t.rank, t.step, t.stage, BASE + scan.stage_ranges[0][2] * 1000, BASE + scan.stage_ranges[0][3] * 1000)
        for t, scan in files
    )
    steps = {(s.rank, s.step): s for s in spans if s.kind == "step"}
    assert len(steps) == sum(1 for s in spans if s.kind == "step")  # one step span per rank and step
    assert set(steps) == {(s[0], s[1]) for s in stages}
    for rank, step, _, start, end in stages:
        assert steps[(rank, step)].start_ns <= start <= end <= steps[(rank, step)].end_ns
    # a step's bounds are the host's, the same for every rank in it
    assert len({(s.step, s.start_ns, s.end_ns) for s in steps.values()}) == len({s.step for s in steps.values()})


def test_engine_traces_and_ranges_without_a_step_are_left_out() -> None:
    traced = TraceSpans()
    engine = TraceFile("/run/e.json", "rollout", "engine", 1, 0, 1, source="engine")
    plain = TraceFile("/run/p.json", "unknown", "trace", None, 0, 1, source="trace", inside=True)
    scan = FileScan([], {}, 1, 0, stage_ranges=[("generate", None, 0.0, 5.0)])
    traced.add(engine, scan)
    traced.add(plain, scan)  # no ProfilerStep and no step in its name: no step to put it in
    assert traced.traces == 2 and traced.timelines() == []


def test_one_process_is_one_lane_whatever_its_stages_roles() -> None:
    """A fused worker's ``role="critic"`` stage files share its pid: one lane, named after most of its stages."""

    def stage(role: str, name: str, pid: int, start: float) -> tuple[TraceFile, FileScan]:
        label = name.replace("_", "-")  # as SDK file names spell it
        path = f"/run/{role}_{label}_step1_rank0-of-1_h_pid{pid}_1796155966097457905.pt.trace.json.gz"
        header = {"baseTimeNanoseconds": BASE, "host_name": "h"}
        scan = FileScan([], header, 1, 0, stage_ranges=[(name, None, start, start + 10.0)])
        return TraceFile(path, role, name, 1, 0, 1, source="name"), scan

    traced = TraceSpans()
    for trace, scan in [
        stage("actor", "generate_sequences", 7, 0.0),
        stage("critic", "compute_values", 7, 20.0),
        stage("actor", "update_actor", 7, 40.0),
        stage("critic", "compute_values", 8, 20.0),  # another process (pid 8): a lane of its own
    ]:
        traced.add(trace, scan)
    fused, other = traced.timelines()
    assert (fused.role, fused.pid, other.role, other.pid) == ("actor", 7, "critic", 8)
    stages = [(s.role, s.stage) for s in fused.spans if s.kind == "stage"]
    assert stages == [("actor", "generate_sequences"), ("critic", "compute_values"), ("actor", "update_actor")]
    assert {s.role for s in fused.spans if s.kind == "step"} == {"actor"}
