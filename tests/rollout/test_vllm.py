"""The vLLM backend without a vLLM server: launch arguments by version, replicas, relocation, HTTP errors.

Relocation runs on real files named as vLLM and SGLang name them; the HTTP tests use a small
stub server on 127.0.0.1 only for answers a real vLLM never gives (redirects, 500s, a hang).
The real-server scenarios are in tests/rollout/test_vllm_server.py.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

import instrument as ins
from instrument.manifest import Manifest, read_manifests
from instrument.rollout._http import HttpTimeoutError
from instrument.rollout.vllm import (
    TRACES,
    EngineDriver,
    EngineProfilerError,
    EngineStillFlushingError,
    HttpEngineDriver,
    RolloutProfiler,
    engine_to_drive,
    profiler_fields_for,
    profiler_launch_args,
    relocate_engine_traces,
    replica_profiler_dir,
)

# --------------------------------------------------------------------------- launch arguments


def test_new_vllm_gets_a_profiler_config_with_known_fields_only(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(contents=("cpu", "cuda", "shapes"), token_window=(4, 11))
    launch = profiler_launch_args(cfg, profiler_dir=tmp_path / "prof", vllm_version="0.13.0")
    assert launch.args[0] == "--profiler-config"
    assert launch.env == {}
    assert launch.profiler_config == {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path / "prof"),
        "torch_profiler_with_stack": False,  # off unless asked: a stack-laden flush is many times slower
        "torch_profiler_record_shapes": True,
        "torch_profiler_with_memory": False,
        "torch_profiler_use_gzip": True,
        "delay_iterations": 4,
        "max_iterations": 8,
    }


def test_fields_a_version_does_not_know_are_never_sent(tmp_path: Path) -> None:
    known = {"profiler", "torch_profiler_dir", "torch_profiler_with_stack"}
    launch = profiler_launch_args(
        ins.ProfilerConfig(contents=("stack",)), profiler_dir=tmp_path, vllm_version="0.14.1", known_fields=known
    )
    assert launch.profiler_config == {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path),
        "torch_profiler_with_stack": True,
    }
    assert "torch_profiler_use_gzip" in launch.dropped
    with pytest.raises(ValueError, match="has no 'torch_profiler_dir'"):
        profiler_launch_args(
            ins.ProfilerConfig(), profiler_dir=tmp_path, vllm_version="0.20", known_fields={"profiler"}
        )


def test_old_vllm_gets_environment_variables_returned_not_set(tmp_path: Path) -> None:
    before = dict(os.environ)
    launch = profiler_launch_args(
        ins.ProfilerConfig(contents=("memory",)), profiler_dir=tmp_path, vllm_version="0.11.2"
    )
    assert launch.args == ()
    assert launch.env == {
        "VLLM_TORCH_PROFILER_DIR": str(tmp_path),
        "VLLM_TORCH_PROFILER_WITH_STACK": "0",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "0",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1",
    }
    assert dict(os.environ) == before


def test_field_table_by_version() -> None:
    assert profiler_fields_for("0.12.0") == frozenset()
    assert {"profiler", "torch_profiler_dir", "delay_iterations"} <= profiler_fields_for("0.13.0")
    with pytest.raises(ValueError, match=r"must look like '0\.13\.0'"):
        profiler_fields_for("latest")


def test_every_replica_gets_its_own_directory(tmp_path: Path) -> None:
    assert replica_profiler_dir(tmp_path, 0) != replica_profiler_dir(tmp_path, 1)
    assert replica_profiler_dir(tmp_path, 3) == str(tmp_path / "replica3")
    with pytest.raises(ValueError):
        replica_profiler_dir(tmp_path, -1)


@pytest.mark.parametrize(
    ("rank", "expected"),
    [(0, 0), (1, None), (2, None), (3, None), (4, 2), (5, None), (6, None)],
)
def test_only_local_rank_0_of_a_profiled_replica_drives_it(rank: int, expected: int | None) -> None:
    cfg = ins.ProfilerConfig(ranks=(1, 5))  # replicas 0 and 2 of 2 GPUs each
    assert engine_to_drive(rank, gpus_per_replica=2, world_size=8, config=cfg) == expected


# --------------------------------------------------------------------------- relocation


def _engine_dir(tmp_path: Path, names: list[str]) -> Path:
    source = tmp_path / "engine"
    source.mkdir()
    for name in names:
        (source / name).write_bytes(b"x" * 100)
    return source


def test_relocation_keeps_requested_ranks_labels_frontend_and_keeps_unknown(tmp_path: Path) -> None:
    source = _engine_dir(
        tmp_path,
        [
            "step3_rank0.1764000000000000001.pt.trace.json.gz",
            "step3_rank1.1764000000000000002.pt.trace.json.gz",  # a TP peer: dropped
            "step3_node1_4242.async_llm.1764000000000000003.pt.trace.json.gz",
            "mystery.bin",
        ],
    )
    save = tmp_path / "save"
    result = relocate_engine_traces(
        source,
        save_path=save,
        step=3,
        replica=1,
        gpus_per_replica=2,
        world_size=4,
        keep_ranks={2},
        traces=TRACES,
        manifest=Manifest(save),
        quiet_s=0.05,
    )
    moved = sorted(Path(r.path).name for r in result.moved)
    assert moved == [
        "rollout_engine_step3_rank-unknown-of-4_replica1_mystery.bin",
        "rollout_engine_step3_rank2-of-4_replica1_step3_rank0.1764000000000000001.pt.trace.json.gz",
        "rollout_frontend_step3_replica1_step3_node1_4242.async_llm.1764000000000000003.pt.trace.json.gz",
    ]
    assert [Path(p).name for p in result.dropped] == ["step3_rank1.1764000000000000002.pt.trace.json.gz"]
    assert (source / "step3_rank1.1764000000000000002.pt.trace.json.gz").exists()  # left, not deleted
    records = {Path(r.path).name: r for r in read_manifests(save)}
    assert len(records) == 3
    engine = next(r for r in records.values() if r.stage == "engine" and r.rank == 2)
    assert (engine.role, engine.step, engine.world_size, engine.tool, engine.bytes) == ("rollout", 3, 4, "vllm", 100)


def test_relocation_waits_for_a_growing_file(tmp_path: Path) -> None:
    source = _engine_dir(tmp_path, [])
    growing = source / "rank0.1.pt.trace.json.gz"

    def write() -> None:
        with growing.open("wb") as handle:
            for _ in range(8):
                handle.write(b"y" * 1000)
                handle.flush()
                time.sleep(0.05)

    writer = threading.Thread(target=write)
    growing.write_bytes(b"")
    writer.start()
    result = relocate_engine_traces(
        source, save_path=tmp_path / "save", step=1, replica=0, gpus_per_replica=1, world_size=1, keep_ranks={0},
        quiet_s=0.3, traces=TRACES,
    )  # fmt: skip
    writer.join()
    assert [r.bytes for r in result.moved] == [8000]


def test_relocation_skips_files_older_than_the_step(tmp_path: Path) -> None:
    source = _engine_dir(tmp_path, ["rank0.1.pt.trace.json.gz"])
    os.utime(source / "rank0.1.pt.trace.json.gz", ns=(1, 1))
    result = relocate_engine_traces(
        source, save_path=tmp_path / "save", step=2, replica=0, gpus_per_replica=1, world_size=1, keep_ranks={0},
        since_ns=time.time_ns() - 10**9, quiet_s=0.05, traces=TRACES,
    )  # fmt: skip
    assert result.moved == []


# --------------------------------------------------------------------------- HTTP errors a real vLLM does not produce

HANG_GUARD_S = 60.0  # a held request is answered after this at the latest, so a broken test cannot hang


class _Stub(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    held: ClassVar[list[str]]  # paths of requests held back, in arrival order
    release: ClassVar[threading.Event]  # set: held requests are answered (200)
    answered: ClassVar[list[str]]  # paths of held requests answered, after the release
    url: ClassVar[str]

    def _answer(self) -> None:
        status, headers, body = self.routes.get(self.path, (404, {}, b"not found"))
        if status == 0:  # a server that does not answer until the test says so (a flush that never ends)
            self.held.append(self.path)
            self.release.wait(HANG_GUARD_S)
            self.answered.append(self.path)
            status = 200
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub_server() -> Iterator[type[_Stub]]:
    """The stub's handler class (its routes, held requests and release) once it serves on ``url``."""

    class Handler(_Stub):  # a class per test: its own routes and held requests
        routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
        held: ClassVar[list[str]] = []
        release: ClassVar[threading.Event] = threading.Event()
        answered: ClassVar[list[str]] = []

    handler = Handler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler
    handler.release.set()  # held requests end before server_close() joins their threads
    server.shutdown()
    server.server_close()


@pytest.fixture
def stub(stub_server: type[_Stub]) -> tuple[str, dict[str, tuple[int, dict[str, str], bytes]]]:
    return stub_server.url, stub_server.routes


def test_redirects_are_refused(stub: tuple[str, dict[str, tuple[int, dict[str, str], bytes]]]) -> None:
    url, routes = stub
    routes["/start_profile"] = (307, {"Location": "http://example.invalid/start_profile"}, b"")
    with pytest.raises(EngineProfilerError, match="answered 307"):
        HttpEngineDriver(url).start()


def test_server_errors_and_slow_stops_are_reported(stub_server: type[_Stub]) -> None:
    url, routes = stub_server.url, stub_server.routes
    routes["/start_profile"] = (500, {}, b"boom")
    with pytest.raises(EngineProfilerError, match="answered 500"):
        HttpEngineDriver(url).start()
    routes["/stop_profile"] = (0, {}, b"")  # held until the test releases it
    with pytest.raises(HttpTimeoutError, match=r"timed out after 0\.5 s"):
        HttpEngineDriver(url, stop_timeout_s=0.5).stop()
    # The stop gave up at its own deadline: the server got the request and has still not answered it
    # (it answers only when released, at teardown). The wait below only covers a slow server thread.
    guard = time.monotonic() + HANG_GUARD_S
    while not stub_server.held:
        assert time.monotonic() < guard, "the stub never received /stop_profile"
        time.sleep(0.01)
    assert stub_server.held == ["/stop_profile"]
    assert stub_server.answered == []


def test_a_rollout_profiler_never_raises_into_training(
    stub: tuple[str, dict[str, tuple[int, dict[str, str], bytes]]], tmp_path: Path
) -> None:
    url, _routes = stub  # no profiling routes: every call is a 404
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,))
    profiler = RolloutProfiler(
        cfg, HttpEngineDriver(url), rank=0, world_size=1, gpus_per_replica=1, profiler_base=tmp_path / "prof",
        manifest=Manifest(cfg.save_path),
    )  # fmt: skip
    assert profiler.start(1) is False
    assert profiler.stop(1) == []
    assert profiler.failures == 1
    assert profiler.start(2) is False  # not a profiled step: not even tried
    assert profiler.failures == 1


def test_bad_urls_and_engines_fail_at_construction() -> None:
    for bad in ("ftp://host", "localhost:8000", "http://"):
        with pytest.raises(ValueError, match=r"must be http\(s\)://host:port"):
            HttpEngineDriver(bad)
    with pytest.raises(TypeError, match="no start_profile/stop_profile"):
        EngineDriver(object())


def test_engine_driver_passes_the_prefix_where_taken_and_awaits_coroutines() -> None:
    calls: list[tuple[str, object]] = []

    class NewLLM:
        def start_profile(self, profile_prefix: str | None = None) -> None:
            calls.append(("start", profile_prefix))

        def stop_profile(self) -> None:
            calls.append(("stop", None))

    class OldAsyncLLM:
        async def start_profile(self) -> None:
            calls.append(("async start", None))

        async def stop_profile(self) -> None:
            calls.append(("async stop", None))

    EngineDriver(NewLLM()).start("step4")
    EngineDriver(NewLLM()).stop()
    EngineDriver(OldAsyncLLM()).start("step4")
    EngineDriver(OldAsyncLLM()).stop()
    assert calls == [("start", "step4"), ("stop", None), ("async start", None), ("async stop", None)]


def test_router_listing_shapes_and_errors(stub: tuple[str, dict[str, tuple[int, dict[str, str], bytes]]]) -> None:
    from instrument.rollout._fanout import list_router_workers

    url, routes = stub
    routes["/workers"] = (200, {}, json.dumps(["http://a:1", "http://b:2"]).encode())
    assert list_router_workers(url) == [("http://a:1", True), ("http://b:2", True)]
    routes["/workers"] = (200, {}, json.dumps({"workers": [{"url": "http://a:1", "is_healthy": False}]}).encode())
    assert list_router_workers(url) == [("http://a:1", False)]
    routes["/workers"] = (200, {}, json.dumps({"urls": ["http://c:3"]}).encode())
    assert list_router_workers(url) == [("http://c:3", True)]
    for body, message in [
        (b"<html>", "did not answer JSON"),
        (b"[]", "lists no worker"),
        (b'{"nodes": []}', "expected a list of workers"),
        (b"[3]", "a worker must be a URL"),
    ]:
        routes["/workers"] = (200, {}, body)
        with pytest.raises(ValueError, match=message):
            list_router_workers(url)
    routes["/workers"] = (302, {"Location": "http://elsewhere/workers"}, b"")
    with pytest.raises(ValueError, match="answered 302"):
        list_router_workers(url)


def test_a_stop_past_its_deadline_on_a_live_server_is_still_flushing(stub_server: type[_Stub]) -> None:
    url, routes = stub_server.url, stub_server.routes
    routes["/stop_profile"] = (0, {}, b"")  # held: a flush longer than the deadline
    routes["/health"] = (200, {}, b"")
    with pytest.raises(EngineStillFlushingError, match=r"still flushing after 0\.5 s \(the server answers /health\)"):
        HttpEngineDriver(url, stop_timeout_s=0.5).stop()
    stub_server.release.set()  # the flush ends
    routes["/start_profile"] = (409, {}, b"")  # already profiling, and stays so: the restart's own start fails
    with pytest.raises(EngineProfilerError, match="answered 409"):
        HttpEngineDriver(url, stop_timeout_s=0.5).start_profile("step1")
