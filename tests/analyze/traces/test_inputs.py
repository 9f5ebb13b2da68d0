"""Every name form ``instrument analyze`` reads: rank and world from the name, else distributedInfo."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from instrument.analyze import analyze
from instrument.analyze.traces._names import from_name


def _events(ms: float) -> list[dict[str, Any]]:
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 1e5},
        {"ph": "X", "cat": "user_annotation", "name": "update_actor", "pid": 1, "tid": 1, "ts": 10, "dur": ms * 1e3},
    ]


def _write(path: Path, events: list[dict[str, Any]], **meta: Any) -> None:
    data = json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        # verl: a whole step (stages inside) and a stage of its own
        ("actor-rollout-ref_step1_rank0-of-8_pid10256_20260814122731089.json", ("actor-rollout-ref", "trace", 1, 0, 8)),
        (
            "actor-rollout-ref_train_step1_rank3-of-8_pid10256_20260814122731089.json.gz",
            ("actor-rollout-ref", "train", 1, 3, 8),
        ),
        ("critic_update_critic_step2_rank1-of-2_pid7_1.json", ("critic", "update_critic", 2, 1, 2)),
        # HTA-style
        ("rank-5.Nov_01_12_00_00.1234.pt.trace.json.gz", ("unknown", "trace", None, 5, None)),
        # vLLM and SGLang workers
        ("step2_rank1.1764000000000000001.pt.trace.json.gz", ("rollout", "engine", 2, 1, None)),
        ("dp0_pp0_tp1_dcp0_ep0_rank1.1764000000000000001.pt.trace.json.gz", ("rollout", "engine", None, 1, None)),
        ("1764000000.123-TP-3.trace.json.gz", ("rollout", "engine", None, 3, None)),  # no step: None, not 0
    ],
)
def test_name_forms(name: str, fields: tuple[Any, ...]) -> None:
    found = from_name(Path(name))
    assert found is not None
    assert (found.role, found.stage, found.step, found.rank, found.world_size) == fields


def test_unknown_and_torch_default_names_are_left_to_the_trace() -> None:
    assert from_name(Path("host_1234.1764000000000000001.pt.trace.json.gz")) is None
    assert from_name(Path("notes.json")) is None
    assert from_name(Path("actor_step1_rank8-of-8_pid1_1.json")) is None  # rank outside the world


def test_verl_torch_and_hta_names_parse_and_are_analysed(tmp_path: Path) -> None:
    _write(tmp_path / "actor-rollout-ref_step3_rank0-of-4_pid10256_20260814122731089.json", _events(2.0))
    _write(tmp_path / "actor-rollout-ref_step3_rank1-of-4_pid10257_20260814122731090.json.gz", _events(4.0))
    _write(tmp_path / "node2_4242.1764000000000000001.pt.trace.json.gz", _events(3.0), distributedInfo={"rank": 2})
    _write(tmp_path / "rank-3.json.gz", _events(9.0))
    report = analyze(tmp_path, jobs=1)
    assert report.ok, report.skipped
    rows = {(s.role, s.step, s.stage): s for s in report.stages}
    verl = rows[("actor-rollout-ref", 3, "update_actor")]
    assert [(r.rank, r.wall_ms) for r in verl.ranks] == [(0, 2.0), (1, 4.0)]
    plain = rows[("unknown", 3, "update_actor")]  # torch's default name (distributedInfo) and HTA's
    assert [(r.rank, r.wall_ms) for r in plain.ranks] == [(2, 3.0), (3, 9.0)]
    assert plain.straggler_rank == 3


def test_vllm_data_parallel_workers_get_their_place_in_the_replica(tmp_path: Path) -> None:
    for dp in (0, 1):
        for rank in (0, 1):
            name = f"dp{dp}_pp0_tp{rank}_dcp0_ep0_rank{rank}.17640000000000000{dp}{rank}.pt.trace.json.gz"
            _write(tmp_path / name, _events(1.0 + dp * 2 + rank))
    report = analyze(tmp_path, jobs=1)
    assert report.ok, report.skipped
    [engine] = report.stages
    assert [r.rank for r in engine.ranks] == [0, 1, 2, 3]


def _engine_trace(executions: int, window_us: float) -> list[dict[str, Any]]:
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "execute_model",
            "pid": 1,
            "tid": 1,
            "ts": 100 + i * 1000,
            "dur": 800,
        }
        for i in range(executions)
    ]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 1})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": window_us, "dur": 1})
    return events


def test_an_idle_engine_replica_shows_as_idle_not_as_the_straggler(tmp_path: Path) -> None:
    # replica 0 did all the work in a short window; replica 1 was idle but stopped 9 s later
    busy = "rollout_engine_step1_rank0-of-2_replica0_rank0.1764000000000000001.pt.trace.json.gz"
    idle = "rollout_engine_step1_rank1-of-2_replica1_rank0.1764000000000000002.pt.trace.json.gz"
    _write(tmp_path / busy, _engine_trace(executions=20, window_us=20_500))
    _write(tmp_path / idle, _engine_trace(executions=0, window_us=9_288_000))
    [engine] = analyze(tmp_path, jobs=1).stages
    assert engine.judged_by == "work"
    assert engine.straggler_rank == 0
    worker, idler = engine.ranks
    assert worker.work_ms == pytest.approx(16.0) and worker.iterations == 20
    assert idler.work_ms == pytest.approx(0.002) and idler.iterations == 0
    assert idler.wall_ms > worker.wall_ms  # the window, which no longer decides
