"""``instrument analyze`` on traces with known durations, on real torch.profiler traces written
through the public API, and on damaged ones.

Every figure asserted comes from a trace built here with exact ``ts`` / ``dur`` (:func:`sdk_trace`):
the tests never measure the clock, so a loaded machine cannot change their outcome.  The SDK's own
torch traces are checked for what they hold (files, ranks, stages, windows), not for how long
their stages took.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import instrument as ins
import instrument.testing
from instrument import cli, naming
from instrument.analyze import Report, analyze, render_text, write_png
from instrument.analyze.traces import _reader as reader
from instrument.manifest import Manifest, TraceRecord, read_manifests

WORLD = 3
STEPS = 2
STRAGGLER = 2
HOST = "node-a"
BASE_US = 5_203_029_000_000.0  # a real trace's clock: differences of such timestamps must stay exact
# Stage ranges in microseconds, as the traces hold them.
GENERATE_US = 15_000.0
GENERATE_STRAGGLER_US = 90_000.0
LOG_PROB_US = 50_000.0
MINI_BATCH_US = 4_000.0
OP_US = 1_000.0  # one aten::mm per stage, with an aten::addmm nested inside (counted once)
EVENTS_PER_STAGE = 4  # the stage range, aten::mm, aten::addmm and the profiler's own span


# --------------------------------------------------------------------------- traces with known durations


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": tid, "ts": ts, "dur": dur}


def _op(ts: float) -> list[dict[str, Any]]:
    """``OP_US`` of CPU op time: aten::mm with aten::addmm inside it."""
    return [_x("aten::mm", ts, OP_US), _x("aten::addmm", ts + 100.0, OP_US / 2)]


def _chrome(events: list[dict[str, Any]], **meta: Any) -> bytes:
    return json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}).encode()


def sdk_trace(
    directory: Path,
    events: list[dict[str, Any]],
    *,
    stage: str,
    step: int,
    rank: int,
    world: int = WORLD,
    role: str = "actor",
    window: tuple[int, int] | None = None,
    host: str = HOST,
    manifest: Manifest | None = None,
) -> Path:
    """A gzipped chrome trace under the SDK's name, with the header the SDK writes, listed in ``manifest``."""
    span = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)
    everything = [
        {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
        *events,
        _x("PyTorch Profiler (0)", span[0] - 10.0, span[1] - span[0] + 20.0, cat="Trace", tid=0),
    ]
    base = naming.trace_basename(
        role=role,
        stage=stage,
        step=step,
        rank=rank,
        world_size=world,
        host=host,
        pid=4242 + rank,
        timestamp_ns=1_764_000_000_000_000_000 + step * 1000 + rank,
        window=window,
    )
    path = directory / f"{base}.pt.trace.json.gz"
    header = {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "instrument": {"role": role, "stage": stage, "step": step, "rank": rank},
    }
    path.write_bytes(gzip.compress(_chrome(everything, **header)))
    if manifest is not None:
        manifest.append(
            TraceRecord(
                path=path.name,
                role=role,
                stage=stage,
                step=step,
                rank=rank,
                world_size=world,
                window=window,
                partial=False,
                bytes=path.stat().st_size,
                tool="torch",
            )
        )
    return path


def known_run(directory: Path, *, world: int = WORLD, steps: int = STEPS, hosts: tuple[str, ...] = (HOST,)) -> Path:
    """Per rank and step: generate_sequences (15 ms, the straggler 90 ms), compute_log_prob (50 ms) and
    update_actor's window mb1-2 (two 4 ms mini-batches); rank r runs on ``hosts[r % len(hosts)]``."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(directory)
    try:
        for rank in range(world):
            host = hosts[rank % len(hosts)]
            for step in range(1, steps + 1):
                t0 = BASE_US + rank * 7_000_000.0 + step * 1_000_000.0  # clocks of ranks differ; durations count
                generate = GENERATE_STRAGGLER_US if rank == STRAGGLER else GENERATE_US
                put = functools.partial(
                    sdk_trace, directory, step=step, rank=rank, world=world, host=host, manifest=manifest
                )
                put([_x("generate_sequences", t0, generate), *_op(t0 + 10.0)], stage="generate_sequences")
                t1 = t0 + 200_000.0
                put([_x("compute_log_prob", t1, LOG_PROB_US), *_op(t1 + 10.0)], stage="compute_log_prob")
                t2 = t1 + 100_000.0  # mini_batch1, a 2 ms gap, mini_batch2: the gap is no stage time
                windows = [_x("mini_batch1", t2, MINI_BATCH_US), _x("mini_batch2", t2 + 6_000.0, MINI_BATCH_US)]
                put([*windows, *_op(t2 + 10.0)], stage="update_actor", window=(1, 2))
    finally:
        manifest.close()
    return directory


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield known_run(tmp_path_factory.mktemp("analyze") / "profile")


@pytest.fixture(scope="module")
def report(traces: Path) -> Report:
    return analyze(traces, jobs=1)


def _stage(report: Report, name: str, step: int | None) -> Any:
    return next(s for s in report.stages if s.stage == name and s.step == step)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- numbers


def test_a_stage_of_50_ms_reports_50_ms_on_every_rank(report: Report) -> None:
    for step in range(1, STEPS + 1):
        stage = _stage(report, "compute_log_prob", step)
        assert [r.rank for r in stage.ranks] == list(range(WORLD))
        for rank in stage.ranks:
            assert rank.basis == "stage"
            assert rank.wall_ms == LOG_PROB_US / 1000
            assert rank.cpu_ms == OP_US / 1000  # aten::addmm lies inside aten::mm: counted once
            assert rank.kernel_ms is None  # a CPU-only run has no GPU kernels
            assert rank.events == EVENTS_PER_STAGE
        assert (stage.median_ms, stage.max_ms, stage.min_ms) == (50.0, 50.0, 50.0)
        assert stage.ratio == 1.0
        assert stage.straggler_rank == 0  # a tie: the lowest rank


def test_the_straggler_rank_is_found_and_sorted_first(report: Report) -> None:
    for step in range(1, STEPS + 1):
        stage = _stage(report, "generate_sequences", step)
        assert stage.straggler_rank == STRAGGLER
        assert stage.straggler == str(STRAGGLER)
        assert stage.ratio == GENERATE_STRAGGLER_US / GENERATE_US  # 90 ms over the median 15 ms: 6.0
        assert (stage.max_ms, stage.median_ms, stage.min_ms) == (90.0, 15.0, 15.0)
    assert [(s.stage, s.step) for s in report.stages[:2]] == [("generate_sequences", 1), ("generate_sequences", 2)]
    lost = [s.lost_ms for s in report.stages]  # the time lost to the straggler orders the rows, not the ratio
    assert lost == sorted(lost, reverse=True) and lost[0] == (90.0 - 15.0) * (WORLD - 1)


def test_window_traces_are_measured_by_their_mini_batches(report: Report) -> None:
    stage = _stage(report, "update_actor", 1)
    assert stage.windows == ((1, 2),)
    for rank in stage.ranks:
        assert rank.basis == "mini_batches"
        assert rank.mini_batches == 2
        assert rank.wall_ms == rank.minibatch_ms == 2 * MINI_BATCH_US / 1000  # the 2 ms gap left out
    assert stage.minibatch_ms == 8.0


def test_json_matches_the_manifest(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli([str(traces), "--json", "--no-png"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    records = list(read_manifests(traces))
    assert data["files"] == len(records) == WORLD * STEPS * 3
    assert data["steps"] == sorted({r.step for r in records}) == list(range(1, STEPS + 1))
    assert data["ranks"] == sorted({r.rank for r in records}) == list(range(WORLD))
    assert data["skipped"] == []
    assert data["png"] is None
    listed = sorted(f for s in data["stages"] for r in s["per_rank"] for f in r["files"])
    assert [Path(f).name for f in listed] == sorted(Path(r.path).name for r in records)
    worst = data["stages"][0]
    assert (worst["stage"], worst["straggler_rank"], worst["straggler_ratio"]) == ("generate_sequences", STRAGGLER, 6.0)
    assert worst["max_ms"] == max(r["wall_ms"] for r in worst["per_rank"]) == 90.0


def test_table_png_and_html(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, page = tmp_path / "a.png", tmp_path / "a.html"
    rc, out, _ = _cli([str(traces), "--png", str(png), "--html", str(page)], capsys)
    assert rc == 0
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text(encoding="utf-8")
    assert '<img src="data:image/png;base64,' in text
    assert "generate_sequences" in text
    for header in ("median ms", "max ms", "slowest", "max/med", "cpu op ms"):
        assert header in out
    assert "update_actor [mb1-2]" in out
    assert "6.00" in out  # the straggler's max/med
    assert f"picture  {png}" in out


def test_default_png_goes_into_the_directory(tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(traces, copy)
    rc, _, _ = _cli([str(copy)], capsys)
    assert rc == 0
    assert (copy / "instrument-analysis.png").stat().st_size > 10_000
    rc, _, _ = _cli([str(copy), "--json"], capsys)  # the picture is no trace: nothing skipped
    assert rc == 0


def test_filters(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _cli(
        [str(traces), "--json", "--no-png", "--ranks", "0,2", "--steps", "2", "--stage", "compute-log-prob"], capsys
    )
    assert rc == 0
    data = json.loads(out)
    assert [(s["step"], s["stage"]) for s in data["stages"]] == [(2, "compute_log_prob")]
    assert [r["rank"] for r in data["stages"][0]["per_rank"]] == [0, 2]
    assert data["files"] == 2
    two = analyze(traces, stages=["update_actor", "generate_sequences"], steps=[1], jobs=1)
    assert sorted(s.stage for s in two.stages) == ["generate_sequences", "update_actor"]
    assert analyze(traces, all_ranks=False, jobs=1).ranks == (0,)


def test_every_reader_gives_the_same_numbers(traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_loads", lambda: None)  # the streaming (ijson) path
    streamed = analyze(traces, jobs=1)
    monkeypatch.setattr(reader, "_loads", lambda: json.loads)  # small files decoded whole (orjson when installed)
    whole = analyze(traces, jobs=1)
    monkeypatch.setattr(reader, "_loads", lambda: None)
    monkeypatch.setattr(reader, "_have_ijson", lambda: False)  # without ijson: the standard library
    stdlib = analyze(traces, jobs=1)
    expected = [s.to_dict()["per_rank"] for s in streamed.stages]
    assert expected == [s.to_dict()["per_rank"] for s in whole.stages]
    assert expected == [s.to_dict()["per_rank"] for s in stdlib.stages]
    assert _stage(streamed, "compute_log_prob", 1).ranks[0].wall_ms == 50.0


def test_worker_processes_give_the_same_numbers(traces: Path, report: Report) -> None:
    parallel = analyze(traces, jobs=2)
    assert parallel.jobs == 2
    assert [s.to_dict() for s in parallel.stages] == [s.to_dict() for s in report.stages]


def test_continuous_traces_are_split_into_stages(tmp_path: Path) -> None:
    for rank, log_prob in ((0, LOG_PROB_US), (1, 80_000.0)):
        t0 = BASE_US + rank * 3_000_000.0
        t1, t2 = t0 + 20_000.0, t0 + 200_000.0
        events = [
            _x("generate_sequences", t0, GENERATE_US),
            _x("compute_log_prob", t1, log_prob),
            *_op(t1 + 1_000.0),
            _x("my_inner_range", t1 + 10_000.0, 1_000.0),  # the user's own range inside a stage: a CPU op
            _x("update_actor", t2, 20_000.0),
            *(_x(f"mini_batch{i}", t2 + 1_000.0 + 4_000.0 * i, 3_000.0) for i in range(4)),
        ]
        sdk_trace(tmp_path, events, stage=naming.CONTINUOUS_STAGE, step=1, rank=rank, world=2)
    result = analyze(tmp_path, jobs=1)
    assert result.ok and result.files == 2
    assert sorted({s.stage for s in result.stages}) == ["compute_log_prob", "generate_sequences", "update_actor"]
    log_prob_stage = _stage(result, "compute_log_prob", 1)
    assert [r.wall_ms for r in log_prob_stage.ranks] == [50.0, 80.0]
    assert [r.cpu_ms for r in log_prob_stage.ranks] == [2.0, 2.0]  # aten::mm 1 ms + the inner range 1 ms
    assert log_prob_stage.straggler_rank == 1
    assert log_prob_stage.ratio == pytest.approx(80.0 / 65.0)  # the median of two ranks is their mean
    update = _stage(result, "update_actor", 1)
    for rank in update.ranks:
        assert (rank.basis, rank.mini_batches, rank.minibatch_ms, rank.wall_ms) == ("stage", 4, 12.0, 20.0)
    assert [r.wall_ms for r in _stage(result, "generate_sequences", 1).ranks] == [15.0, 15.0]
    only = analyze(tmp_path, stages=["compute_log_prob"], jobs=1)
    assert [s.stage for s in only.stages] == ["compute_log_prob"]


# --------------------------------------------------------------------------- the SDK's own torch traces


def _matmul() -> None:
    torch.randn(32, 32) @ torch.randn(32, 32)


class Worker:
    """Stages that do a little CPU work; how long they take is never asserted."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self) -> None:
        _matmul()

    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self) -> None:
        _matmul()

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, n: int) -> None:
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                _matmul()


def _run_ranks(save_path: Path, *, discrete: bool = True, world: int = WORLD, steps: int = STEPS) -> None:
    """One process plays every rank in turn: configure(rank=r) is what a real rank would call."""
    for rank in range(world):
        instrument.testing.reset()
        cfg = ins.ProfilerConfig(
            save_path=str(save_path),
            all_ranks=True,
            contents=("cpu",),
            discrete=discrete,
            schedule=ins.Schedule(wait=1, active=2) if discrete else None,
        )
        ins.configure(cfg, role="actor", rank=rank, world_size=world)
        worker = Worker(rank)
        for step in range(1, steps + 1):
            with ins.profile_step(step, last=(step == steps)):
                worker.generate_sequences()
                worker.compute_log_prob()
                worker.update_actor(4)
        ins.finish()
    instrument.testing.reset()


def test_the_sdks_own_traces_are_read_as_their_manifest_says(tmp_path: Path) -> None:
    _run_ranks(tmp_path, world=2, steps=2)
    result = analyze(tmp_path, jobs=1)
    records = [r for r in read_manifests(tmp_path) if not r.path.endswith(naming.TIMELINE_SUFFIX)]  # traces only
    assert result.ok and result.files == len(records) == 2 * 2 * 3
    assert (result.steps, result.ranks, result.roles) == ((1, 2), (0, 1), ("actor",))
    assert sorted((s.step, s.stage) for s in result.stages) == [
        (step, stage) for step in (1, 2) for stage in ("compute_log_prob", "generate_sequences", "update_actor")
    ]
    for stage in result.stages:
        assert [r.rank for r in stage.ranks] == [0, 1]
        assert stage.max_ms == max(r.wall_ms for r in stage.ranks)
        for rank in stage.ranks:
            assert rank.wall_ms > 0 and rank.cpu_ms > 0 and rank.events > 0
            assert rank.kernel_ms is None  # a CPU-only run has no GPU kernels
            if stage.stage == "update_actor":
                assert (rank.basis, rank.mini_batches, rank.windows) == ("mini_batches", 2, ((1, 2),))
                assert rank.wall_ms == pytest.approx(rank.minibatch_ms, rel=1e-9)  # mini-batches do not overlap
            else:
                assert rank.basis == "stage"


def test_the_sdks_own_continuous_traces_are_split_into_stages(tmp_path: Path) -> None:
    _run_ranks(tmp_path, discrete=False, world=2, steps=1)
    result = analyze(tmp_path, jobs=1)
    assert result.ok and result.files == 2
    assert sorted({s.stage for s in result.stages}) == ["compute_log_prob", "generate_sequences", "update_actor"]
    for rank in _stage(result, "compute_log_prob", 1).ranks:
        assert rank.wall_ms > 0 and rank.cpu_ms > 0
    update = _stage(result, "update_actor", 1)
    assert all(r.mini_batches == 4 and r.basis == "stage" for r in update.ranks)
    assert all(r.minibatch_ms <= r.wall_ms for r in update.ranks)  # the mini-batches lie inside the stage


# --------------------------------------------------------------------------- bad files


def test_damaged_files_are_named_and_the_rest_is_analysed(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(traces, damaged)
    files = sorted(damaged.glob("*.pt.trace.json.gz"))
    truncated = files[0]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    not_json = damaged / "actor_compute-log-prob_step7_rank0-of-3_h_pid1_1.pt.trace.json"
    not_json.write_text("this is not JSON {", encoding="utf-8")
    no_rank = damaged / "mystery.pt.trace.json"
    no_rank.write_bytes(_chrome([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]))
    original = files[3]
    duplicate = damaged / original.name.replace("_pid", "_pid9")
    shutil.copy(original, duplicate)

    rc, out, err = _cli([str(damaged), "--json", "--no-png"], capsys)
    assert rc == 1
    lines = [line for line in err.strip().splitlines() if "skipped " in line]
    assert len(lines) == 3, err
    assert f"note: {no_rank}: no ProfilerStep#N range and no user annotation" in err  # read, but say why
    reasons = {Path(line.split("skipped ", 1)[1].split(": ", 1)[0]).name: line for line in lines}
    assert "truncated gzip" in reasons[truncated.name]
    assert "not JSON" in reasons[not_json.name]
    assert "duplicate" in reasons[duplicate.name] and original.name in reasons[duplicate.name]
    data = json.loads(out)
    assert data["files"] == WORLD * STEPS * 3  # the file no one gives a rank is read, not dropped
    assert len(data["skipped"]) == 3
    assert {s["stage"] for s in data["stages"]} == {"compute_log_prob", "generate_sequences", "update_actor", "trace"}
    whole = next(s for s in data["stages"] if s["stage"] == "trace")
    assert whole["per_rank"][0]["worker"] == "mystery" and whole["per_rank"][0]["rank"] is None
    assert whole["straggler"] is None and whole["below_floor"] == "under 5 ms"  # a 2 µs row names no one


def test_bad_arguments_and_directories_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli([str(tmp_path / "missing")], capsys)
    assert rc == 2 and "not a directory" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", str(tmp_path), "--ranks", "zero"])
    assert exc.value.code == 2
    rc, out, err = _cli([str(tmp_path), "--no-png"], capsys)  # empty: no trace, said on stderr (issue 27)
    assert rc == 2 and out == "" and "no trace to analyse" in err
    with pytest.raises(ValueError, match="ranks"):
        analyze(tmp_path, ranks=[-1])


# --------------------------------------------------------------------------- engine traces


def _engine_events(kernel_us: float) -> list[dict[str, Any]]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 1010.0, "dur": 20.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1012.0, "dur": 3.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 1100.0, "dur": kernel_us},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    ]


def test_relocated_vllm_engine_traces_are_recognised(tmp_path: Path) -> None:
    for rank, kernel in ((0, 4000.0), (1, 19000.0)):  # above the straggler floor (2 ms)
        name = f"rollout_engine_step2_rank{rank}-of-2_replica0_step2_rank{rank}.1764000000000000001.pt.trace.json.gz"
        (tmp_path / name).write_bytes(gzip.compress(_chrome(_engine_events(kernel))))
    frontend = "rollout_frontend_step2_replica0_step2_node1_4242.async_llm.1764000000000000003.pt.trace.json.gz"
    (tmp_path / frontend).write_bytes(gzip.compress(_chrome(_engine_events(10.0)[:1])))
    # a plain trace whose name says nothing: its distributedInfo gives the rank
    (tmp_path / "worker.json").write_bytes(_chrome(_engine_events(5.0), distributedInfo={"rank": 1, "world_size": 2}))

    result = analyze(tmp_path, jobs=1)
    assert result.ok, result.skipped
    engine = _stage(result, "engine", 2)
    assert [r.rank for r in engine.ranks] == [0, 1]
    assert engine.straggler_rank == 1
    assert all(r.basis == "span" for r in engine.ranks)
    assert engine.ranks[1].wall_ms == pytest.approx((1100 + 19000 - 1000) / 1000)
    assert engine.ranks[1].kernel_ms == pytest.approx(19.0)
    assert engine.ranks[0].cpu_ms == pytest.approx(0.05)  # aten::addmm lies inside aten::mm: counted once
    assert [r.label for r in _stage(result, "frontend", 2).ranks] == ["replica0"]
    assert [r.rank for r in _stage(result, "trace", None).ranks] == [1]


def test_manifest_records_of_relocated_traces_are_used(tmp_path: Path) -> None:
    name = "rollout_engine_step3_rank-unknown-of-4_replica1_mystery.pt.trace.json.gz"
    (tmp_path / name).write_bytes(gzip.compress(_chrome(_engine_events(1.0))))
    (tmp_path / "instrument-manifest-h-pid1.jsonl").write_text(
        json.dumps(
            {
                "path": f"/elsewhere/{name}",  # written on another machine: matched by file name
                "role": "rollout",
                "stage": "engine",
                "step": 3,
                "rank": -1,
                "world": 4,
                "window": None,
                "partial": False,
                "bytes": 1,
                "tool": "vllm",
            }
        )
        + "\n",
        encoding="utf-8",
    )
    result = analyze(tmp_path, jobs=1)
    assert [(s.path, s.reason) for s in result.skipped] == [
        (str(tmp_path / name), "no rank: relocated as rank-unknown")
    ]


# --------------------------------------------------------------------------- imports


def test_importing_analyze_loads_no_renderer_or_torch() -> None:
    code = (
        "import sys, instrument, instrument.analyze, instrument.cli; instrument.cli._build_parser(); "
        "print(','.join(m for m in ('rich', 'matplotlib', 'torch', 'ijson') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == ""


def test_a_long_run_is_drawn_as_the_mean_of_steps(report: Report, tmp_path: Path) -> None:
    many = replace(report, stages=tuple(replace(s, step=step) for step in range(1, 16) for s in report.stages))
    assert len(many.stages) > 40  # more rows than the heatmap shows one by one
    assert write_png(many, tmp_path / "many.png").stat().st_size > 10_000
    assert "15 steps" in render_text(many)
