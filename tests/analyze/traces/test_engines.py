"""Rollout engines judged by their work, on real vLLM traces (tests/data/vllm, see its NOTICE.md).

A vLLM worker annotates each engine step ``execute_context_{n}({tokens})_generation_{m}({tokens})``;
the analyzer takes their union as the engine's work, counts them as iterations and sums their tokens.
A replica profiled while idle leaves a window with nothing in it: work 0, never the slowest.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from instrument.analyze import analyze, render_text
from instrument.analyze.traces._names import from_name
from instrument.analyze.traces._reader import scan_file
from instrument.analyze.traces._steps import EXECUTE, Segment, step_tokens

DATA = Path(__file__).parents[2] / "data" / "vllm"
BUSY = DATA / "busy" / "rank0.1796061723530724090.pt.trace.json.gz"
IDLE = DATA / "idle" / "rank0.1796061723156736983.pt.trace.json.gz"
DETAILED = DATA / "detailed" / "rank0.1796061809233131303.pt.trace.json.gz"

# Read once from the files with a plain script (NOTICE.md): steps that scheduled tokens, their tokens
# (prefill + decode) and the sum of their durations (the ranges never overlap); the profiling windows.
BUSY_ITERATIONS, BUSY_TOKENS, BUSY_WORK_MS, BUSY_WINDOW_MS = 24, 48, 126.524, 246.579
IDLE_WINDOW_MS = 3009.068


def _segment(path: Path) -> Segment:
    trace = from_name(path)
    assert trace is not None and trace.tool == "vllm" and trace.stage == "engine"
    [segment] = scan_file(trace).segments
    return segment


def _relocated(directory: Path, source: Path, rank: int, world: int, replica: int) -> Path:
    """``source`` under the name the SDK gives a relocated engine trace (``instrument.rollout._profiler``)."""
    target = directory / f"rollout_engine_step1_rank{rank}-of-{world}_replica{replica}_{source.name}"
    shutil.copyfile(source, target)
    return target


def test_real_vllm_steps_are_the_work_iterations_and_tokens() -> None:
    segment = _segment(BUSY)
    assert segment.basis == "span"
    assert segment.wall_us / 1e3 == pytest.approx(BUSY_WINDOW_MS, abs=0.01)
    assert segment.iterations == BUSY_ITERATIONS
    assert segment.tokens == BUSY_TOKENS
    assert segment.work_us is not None
    assert segment.work_us / 1e3 == pytest.approx(BUSY_WORK_MS, abs=0.01)


def test_real_vllm_detailed_annotations_give_the_same_kind_of_numbers() -> None:
    # detailed_trace_annotation: execute_{tokens}_context_{n}(sq{t}sk...)_generation_{m}(sq{t}sk...)
    segment = _segment(DETAILED)
    names = _names(DETAILED)
    assert any(name.startswith("execute_") and "(sq" in name for name in names)
    said = [step_tokens(name) for name in names if EXECUTE.match(name)]
    assert all(tokens is not None for tokens in said)
    assert segment.iterations == sum(1 for tokens in said if tokens) == BUSY_ITERATIONS  # same requests
    assert segment.tokens == sum(tokens or 0 for tokens in said) == BUSY_TOKENS
    assert segment.work_us is not None and 0 < segment.work_us < segment.wall_us


def test_real_idle_vllm_replica_is_idle() -> None:
    segment = _segment(IDLE)
    assert segment.wall_us / 1e3 == pytest.approx(IDLE_WINDOW_MS, abs=0.01)
    assert (segment.work_us, segment.iterations, segment.tokens) == (0.0, 0, 0)


def test_idle_replica_with_the_longer_window_is_not_the_slowest(tmp_path: Path) -> None:
    _relocated(tmp_path, BUSY, rank=0, world=2, replica=0)
    _relocated(tmp_path, IDLE, rank=1, world=2, replica=1)
    report = analyze(tmp_path, jobs=1)
    assert report.ok, report.skipped
    [engine] = report.stages
    assert engine.judged_by == "work"
    assert engine.straggler_rank == 0
    busy, idle = engine.ranks
    assert idle.wall_ms > 10 * busy.wall_ms  # the window, which does not decide
    assert busy.work_ms == pytest.approx(BUSY_WORK_MS, abs=0.01) and busy.iterations == BUSY_ITERATIONS
    assert idle.work_ms == 0.0 and idle.iterations == 0
    per_rank = json.loads(json.dumps(engine.to_dict()))["per_rank"]
    assert [(r["rank"], r["work_ms"], r["iterations"]) for r in per_rank] == [
        (0, round(BUSY_WORK_MS, 3), BUSY_ITERATIONS),
        (1, 0.0, 0),
    ]


def test_a_replica_that_only_ran_empty_steps_is_idle(tmp_path: Path) -> None:
    # Derived from the real busy trace: only its steps that scheduled no token (vLLM skips the model in
    # them) and the profiler's own span are kept.
    trace = _load(BUSY)
    kept = [e for e in trace["traceEvents"] if _empty_step(e) or e.get("cat") == "Trace" or e.get("ph") == "M"]
    assert sum(1 for e in kept if _empty_step(e)) == 3
    path = tmp_path / BUSY.name
    path.write_bytes(gzip.compress(json.dumps({**trace, "traceEvents": kept}).encode()))
    segment = _segment(path)
    assert (segment.work_us, segment.iterations, segment.tokens) == (0.0, 0, 0)


def test_sglang_batches_from_python_stacks_are_iterations(tmp_path: Path) -> None:
    """A stand-in: SGLang cannot run on this machine. Its scheduler annotates nothing; with stacks (its
    default) every batch is a ``python_function`` range ``…/scheduler.py(N): run_batch`` around the
    worker's ``forward_batch_generation`` (names from sgl-project/sglang's source)."""
    events: list[dict[str, Any]] = []
    for i in range(5):
        ts = 1_000.0 + i * 10_000
        events += [
            _python("python/sglang/srt/managers/scheduler.py(1820): run_batch", ts, 4_000),
            _python("python/sglang/srt/managers/tp_worker.py(240): forward_batch_generation", ts + 100, 3_000),
            _python("python/sglang/srt/managers/scheduler.py(900): recv_requests", ts + 5_000, 50),
        ]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 60_000.0, "dur": 1})
    path = tmp_path / "1764000000.123-TP-0.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    segment = _segment_sglang(path)
    assert segment.iterations == 5
    assert segment.work_us == pytest.approx(5 * 4_000)
    assert segment.tokens == 0  # SGLang's trace does not say


@pytest.mark.parametrize(
    ("name", "an_execution"),
    [
        ("execute_context_(2)_generation_0(0)", False),
        ("execute_context_1(2", True),  # a step range all the same; its tokens are not said
        ("execute_context_1(" + "9" * 5000, True),
        ("x" * 10_000 + "): run_batch_", False),
        ("gpu_model_runner: forward", False),  # inside a step (VLLM_CUSTOM_SCOPES_FOR_PROFILING)
        ("): execute_modelx", False),
    ],
)
def test_names_that_only_look_like_engine_steps_say_no_tokens(name: str, an_execution: bool) -> None:
    assert step_tokens(name) is None
    assert bool(EXECUTE.match(name)) is an_execution


def test_a_step_claiming_huge_token_counts_is_read_without_error(tmp_path: Path) -> None:
    name = "execute_context_1(" + "9" * 40 + ")_generation_0(0)"
    events = [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}]
    path = tmp_path / "rank0.1764000000000000001.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    segment = _segment(path)
    assert segment.tokens == int("9" * 40) and segment.iterations == 1


def _segment_sglang(path: Path) -> Segment:
    trace = from_name(path)
    assert trace is not None and trace.tool == "sglang"
    [segment] = scan_file(trace).segments
    return segment


def _python(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def _empty_step(event: dict[str, Any]) -> bool:
    return event.get("cat") == "user_annotation" and step_tokens(str(event.get("name"))) == 0


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def _names(path: Path) -> list[str]:
    return [str(e.get("name")) for e in _load(path)["traceEvents"]]


def test_the_report_says_what_each_replica_did_and_knows_the_frontend(tmp_path: Path) -> None:
    """Real vLLM names as written: the worker's ``rank0.{ns}…`` and the API server's ``{host}_{pid}.async_llm…``."""
    for kind in ("busy", "idle"):
        target = tmp_path / kind
        shutil.copytree(DATA / kind, target)
    frontend = next((tmp_path / "busy").glob("*.async_llm.*"))
    trace = from_name(frontend)
    assert trace is not None and (trace.stage, trace.tool, trace.rank) == ("frontend", "vllm", None)
    busy = analyze(tmp_path / "busy", jobs=1)
    assert {(s.role, s.stage) for s in busy.stages} == {("rollout", "engine"), ("rollout", "frontend")}
    text = render_text(busy, width=200)
    assert "rollout/engine step -: rank 0 24 iterations, 48 tokens, 126.5 ms in a 246.6 ms window" in text
    assert '"tokens": 48' in json.dumps(busy.to_dict())
    idle = render_text(analyze(tmp_path / "idle", jobs=1), width=200)
    assert "rank 0 idle (0 iterations in" in idle
