"""On a CUDA GPU: kernels land in the stage that launched them, in the trace and in ``instrument analyze``.

Marked ``gpu``: ``make test-gpu`` (``pytest -m gpu``) runs only these, ``benchmarks/gpu_check.sh``
runs them on a machine that has a GPU but no network. Without CUDA each test is skipped, the reason
in pytest's summary (``-ra``). Assertions are about what the traces hold (kernel events, their
stage, memory events), never about how long anything took.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
from instrument import cli  # noqa: E402
from instrument.analyze import analyze, render_text  # noqa: E402
from instrument.naming import parse_trace_name  # noqa: E402
from tests.conftest import load_trace  # noqa: E402

_NO_CUDA = (
    f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
    f"built for CUDA {torch.version.cuda or 'none: a CPU build'})"
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=_NO_CUDA)]

HANG_GUARD_S = 300  # a child process still running after this is killed: a hang guard, not a speed check
STAGES = ("generate_sequences", "compute_log_prob")


def _matmuls(n: int = 4) -> None:
    """CUDA work that ends inside the caller's stage: kernels run before the stage range closes."""
    x = torch.randn(256, 256, device="cuda")
    for _ in range(n):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()


@ins.profiled_stage("generate_sequences")
def _generate() -> None:
    _matmuls()


@ins.profiled_stage("compute_log_prob")
def _log_prob() -> None:
    _matmuls()


@ins.profiled_stage("update_actor", scheduled=True)
def _update(mini_batches: int) -> None:
    for i in range(mini_batches):
        with ins.profile_window(mini_batch=i):
            _matmuls(2)


def _run(save: Path, steps: tuple[int, ...] = (1, 2), **config: Any) -> list[Path]:
    """Two profiled steps of two forward stages and one scheduled update; the trace files written."""
    cfg = ins.ProfilerConfig(save_path=str(save), steps=steps, **config)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in steps:
        with ins.profile_step(step, last=(step == steps[-1])):
            _generate()
            _log_prob()
            _update(4)
    return [Path(f) for f in ins.finish() if f.endswith(".pt.trace.json.gz")]


def _events(path: Path, cat: str) -> list[dict[str, Any]]:
    return [e for e in load_trace(path)["traceEvents"] if e.get("cat") == cat]


def _analyze_json(save: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    code = cli.main(["analyze", str(save), "--json", "--no-png", "--quiet"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == 0, out.get("skipped")
    return out


@pytest.fixture(autouse=True)
def _cuda_warm() -> Iterator[None]:
    """CUDA's context is made before the profiler starts, so the first stage is not the one paying for it."""
    _matmuls(1)
    yield


# --------------------------------------------------------------------------- kernels in each stage's trace


@pytest.mark.parametrize("contents", [("cpu", "cuda"), ("cuda",)], ids=["cpu+cuda", "cuda"])
def test_discrete_traces_hold_the_kernels_of_their_own_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], contents: tuple[str, ...]
) -> None:
    save = tmp_path / "profile"
    files = _run(save, contents=contents, schedule=ins.Schedule(warmup=1, active=2))
    by_stage: dict[str, list[Path]] = {}
    for path in files:
        name = parse_trace_name(path.name)
        assert name is not None, path.name
        by_stage.setdefault(name.stage.replace("-", "_"), []).append(path)
    # one file per forward stage and step; the update's recorded window (mini-batches 1-2) per step
    assert {stage: len(paths) for stage, paths in by_stage.items()} == {
        "generate_sequences": 2,
        "compute_log_prob": 2,
        "update_actor": 2,
    }
    for path in files:
        kernels = _events(path, "kernel")
        assert kernels, f"{path.name}: no kernel events"
        launches = _events(path, "cuda_runtime") + _events(path, "cuda_driver")  # cuBLAS may launch via the driver
        assert any(e["name"].startswith(("cudaLaunchKernel", "cuLaunchKernel")) for e in launches), path.name
        assert all(e["args"].get("device") == torch.cuda.current_device() for e in kernels), path.name

    out = _analyze_json(save, capsys)
    rows = {(row["step"], row["stage"]): row for row in out["stages"]}
    assert {stage for _, stage in rows} == {"generate_sequences", "compute_log_prob", "update_actor"}
    for (step, stage), row in rows.items():
        (rank,) = row["per_rank"]
        assert rank["kernels"] > 0 and rank["kernel_ms"] > 0, (step, stage, rank)
        assert row["median_kernel_ms"] > 0, (step, stage)
    whole = [row for row in out["gpu"] if row["rank"] == 0 and row["step"] is None]
    assert len(whole) == 1, out["gpu"]
    assert whole[0]["compute_us"] > 0 and whole[0]["busy_us"] > 0
    assert whole[0]["span_us"] >= whole[0]["busy_us"]


def test_continuous_traces_attribute_kernels_to_each_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save = tmp_path / "profile"
    files = _run(save, contents=("cpu", "cuda"), discrete=False)
    assert len(files) == 2  # one trace per profiled step
    for path in files:
        assert _events(path, "kernel"), path.name
    out = _analyze_json(save, capsys)
    stages = {row["stage"] for row in out["stages"]}
    assert set(STAGES) | {"update_actor"} <= stages
    for row in out["stages"]:
        if row["stage"] in STAGES:
            (rank,) = row["per_rank"]
            assert rank["kernels"] > 0, row  # the kernels it launched, not its neighbour's
    assert any(row["step"] is None for row in out["gpu"])


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_stage_ranges_that_launched_kernels_are_gpu_user_annotations(tmp_path: Path, discrete: bool) -> None:
    """Stage and mini-batch ranges are user annotations, so kineto projects them onto the GPU timeline (a kernel
    belongs to the innermost one: update_actor's kernels all run inside its mini-batches, so it is not asked for)."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), steps=(1,), contents=("cpu", "cuda"), discrete=discrete)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    with ins.profile_step(1, last=True):
        for _ in range(2):  # on a continuous step the second calls open their ranges themselves (the fast path)
            _generate()
            _update(2)
    projected = {
        e["name"]
        for path in ins.finish()
        if path.endswith(".json.gz")
        for e in _events(Path(path), "gpu_user_annotation")
    }
    assert {"generate_sequences", "mini_batch0", "mini_batch1"} <= projected, projected


def test_analyze_shows_gpu_ms_and_the_gpu_table(tmp_path: Path) -> None:
    save = tmp_path / "profile"
    _run(save, steps=(1,), contents=("cpu", "cuda"))
    report = analyze(save, jobs=1)
    assert report.ok and report.gpu
    text = render_text(report)
    assert "gpu ms" in text and "GPU time per rank" in text


# --------------------------------------------------------------------------- memory


def test_memory_contents_record_cuda_allocations(tmp_path: Path) -> None:
    files = _run(tmp_path / "profile", steps=(1,), contents=("cpu", "cuda", "memory"))
    assert files
    for path in files:
        memory = [e for e in load_trace(path)["traceEvents"] if e.get("name") == "[memory]"]
        # Device Type 1 is CUDA (0 the CPU); the stage's tensors were allocated on the GPU.
        assert any(e.get("args", {}).get("Device Type") == 1 for e in memory), f"{path.name}: no CUDA [memory] events"


# --------------------------------------------------------------------------- the CUPTI / NVTX rule

_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import instrument as ins

    cfg = ins.ProfilerConfig(save_path=sys.argv[1], steps=(1,), contents=("cpu", "cuda"))
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    left = os.environ.get("NVTX_INJECTION64_PATH")

    @ins.profiled_stage("compute_log_prob")
    def forward():
        x = torch.randn(256, 256, device="cuda")
        for _ in range(4):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()

    with ins.profile_step(1, last=True):
        forward()
    files = ins.finish()
    print(json.dumps({"injection_left": left, "files": files}))
    """
)


def _child(tmp_path: Path, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    root = str(Path(__file__).resolve().parents[2])
    child_env = {**os.environ, "PYTHONPATH": root, **env}
    done = subprocess.run(
        [*command, sys.executable, str(script), str(tmp_path / "profile")],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=tmp_path,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def test_torch_with_cuda_drops_nvtx_injection_and_keeps_its_kernels(tmp_path: Path) -> None:
    """An injection library named from the start, as nsys sets it: configure() removes it, kernels stay."""
    result = _child(tmp_path, [], {"NVTX_INJECTION64_PATH": str(tmp_path / "libToolsInjection64.so")})
    assert result["injection_left"] is None
    assert "removed NVTX_INJECTION64_PATH" in result["stderr"]
    (trace,) = result["files"]
    assert _events(Path(trace), "kernel")


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems) is not on PATH")
def test_under_nsys_torch_traces_keep_their_kernels(tmp_path: Path) -> None:
    """The real conflict: nsys injects NVTX and wants CUPTI; torch.profiler's trace still has kernels."""
    nsys = [
        "nsys",
        "profile",
        "--trace=cuda,nvtx",
        "--sample=none",
        "-o",
        str(tmp_path / "report"),
        "--force-overwrite=true",
    ]
    result = _child(tmp_path, nsys, {})
    assert result["injection_left"] is None
    (trace,) = result["files"]
    assert _events(Path(trace), "kernel")


# --------------------------------------------------------------------------- NVTX capture ranges on a real GPU


def test_nvtx_capture_ranges_call_the_real_cuda_profiler(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("nvtx")
    cfg = ins.ProfilerConfig(tool="nvtx", save_path=str(tmp_path), steps=(1,), contents=("cpu", "cuda"))
    session = ins.configure(cfg, role="actor", rank=0, world_size=1)
    with ins.profile_step(1, last=True):
        _generate()
        _update(3)
    ins.finish()
    assert session.failures == 0
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "cudaProfiler" in r.getMessage()]
