"""The SGLang backend: launch environment and ``/start_profile`` bodies by version, trace names, the HTTP
driver, relocation.

SGLang cannot run on this machine: the ``sglang`` wheels on the registry are CUDA builds (0.5.23 pins
torch 2.14.1, CUDA torchvision / torchaudio / torchcodec, and its CPU engine needs ``sgl_kernel``'s CPU
build, which is only built from source; docs/sglang.md shows where it stops). So the HTTP tests use a
stand-in (tests/sglang_support/server.py): a real HTTP server from the standard library on 127.0.0.1
that answers as SGLang's own code does, read from the release wheels
(``sglang/srt/entrypoints/http_server.py``: ``/start_profile`` and ``/stop_profile`` accept GET and POST
and answer 200 with a text line, an exception becomes a bare 500; ``/server_info`` from 0.5.8,
``/get_server_info`` before, with ``"version"``; the scheduler's profiler
(``managers/scheduler_components/profiler_manager.py`` in 0.5.23) refuses a second start and a stop
without a start, and writes ``[{prefix}-]{profile_id}-TP-{t}[-{stage}].trace.json.gz`` into the body's
``output_dir`` once per TP rank at the stop). The bodies checked here were also validated by SGLang
0.5.23's real ``ProfileReq`` schema (pydantic) in a scratch environment. Relocation runs on real files,
across a filesystem boundary too.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import instrument as ins
from instrument.manifest import Manifest, read_manifests
from instrument.rollout import (
    EngineDriver,
    EngineProfilerError,
    EngineStillFlushingError,
    RolloutProfiler,
    relocate_engine_traces,
    replica_profiler_dir,
)
from instrument.rollout._http import HttpError
from instrument.rollout.sglang import (
    TRACES,
    SglangHttpDriver,
    profiler_launch_args,
    sglang_start_body,
    sglang_trace_local_rank,
    start_body_fields,
)
from tests.sglang_support.server import Request, SGLangStandIn, serve_sglang

# --------------------------------------------------------------------------- launch environment and bodies


def test_launch_environment_by_version_is_returned_not_set(tmp_path: Path) -> None:
    before = dict(os.environ)
    cfg = ins.ProfilerConfig(contents=("cpu", "cuda", "shapes"))
    new = profiler_launch_args(cfg, profiler_dir=tmp_path / "prof", sglang_version="0.5.23")
    assert new.args == ()
    assert new.env == {
        "SGLANG_TORCH_PROFILER_DIR": str(tmp_path / "prof"),
        "SGLANG_PROFILE_WITH_STACK": "false",  # SGLang's default is true; false also wins over a bodiless start
        "SGLANG_PROFILE_RECORD_SHAPES": "true",
    }
    mid = profiler_launch_args(cfg, profiler_dir="rel", sglang_version="0.4.7")
    assert mid.env == {"SGLANG_TORCH_PROFILER_DIR": os.path.abspath("rel"), "SGLANG_PROFILE_WITH_STACK": "false"}
    assert mid.dropped == ("SGLANG_PROFILE_RECORD_SHAPES",)
    old = profiler_launch_args(cfg, profiler_dir=tmp_path, sglang_version="0.4.3")
    assert old.env == {"SGLANG_TORCH_PROFILER_DIR": str(tmp_path)}
    assert dict(os.environ) == before


def test_body_fields_by_release() -> None:
    assert start_body_fields("0.4.3.post4") == frozenset()
    assert start_body_fields("0.4.4") == start_body_fields("0.4.6") == {"output_dir", "num_steps", "activities"}
    assert start_body_fields("0.4.6.post5") - start_body_fields("0.4.6") == {"with_stack", "record_shapes"}
    assert "profile_by_stage" in start_body_fields("0.4.7") and "start_step" not in start_body_fields("0.4.9")
    assert "profile_prefix" not in start_body_fields("0.5.5") and "profile_prefix" in start_body_fields("0.5.6")
    assert start_body_fields("0.5.23") - start_body_fields("0.5.18") == {"detailed_annotations"}
    with pytest.raises(ValueError, match=r"'sglang_version' must look like '0\.5\.23'"):
        start_body_fields("latest")


def test_the_start_body_for_a_new_sglang(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(contents=("cpu", "cuda", "shapes"), token_window=(0, 7))
    body = sglang_start_body(
        cfg, output_dir=tmp_path / "r0", prefix="step3", sglang_version="0.5.23", profile_by_stage=True
    )
    # Exactly this body was accepted by SGLang 0.5.23's own ProfileReq schema.
    assert body == {
        "activities": ["CPU", "GPU"],
        "with_stack": False,
        "record_shapes": True,
        "output_dir": str(tmp_path / "r0"),
        "num_steps": 8,
        "profile_by_stage": True,
        "profile_prefix": "step3",
    }
    assert sglang_start_body(ins.ProfilerConfig(contents=("memory", "stack")), sglang_version="0.5.23") == {
        "activities": ["MEM"],
        "with_stack": True,
        "record_shapes": False,
    }


def test_older_sglang_gets_what_it_reads_and_a_warning_for_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    cfg = ins.ProfilerConfig(token_window=(2, 5))
    with caplog.at_level(logging.WARNING, logger="instrument"):
        body = sglang_start_body(cfg, prefix="step1", sglang_version="0.4.5", output_dir="/x")
    assert body == {"activities": ["CPU", "GPU"], "output_dir": "/x", "num_steps": 4}  # no prefix before 0.5.6
    text = caplog.text
    assert "cannot start profiling 2 iterations from now" in text
    assert "does not read record_shapes, with_stack" in text
    assert sglang_start_body(cfg, sglang_version="0.4.3") is None  # no body at all before 0.4.4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": ins.ProfilerConfig(contents=("stack", "shapes"))}, "'contents' must hold cpu, cuda or memory"),
        ({"profile_by_stage": True}, "'profile_by_stage' needs 'num_steps'"),
        ({"num_steps": 0}, "'num_steps' must be an int >= 1"),
        ({"prefix": "../escape"}, "'prefix' must be 1-64 of"),
        ({"prefix": "a/b"}, "'prefix' must be 1-64 of"),
    ],
)
def test_bad_settings_fail_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("config", ins.ProfilerConfig())
    with pytest.raises(ValueError, match=message):
        sglang_start_body(sglang_version="0.5.23", **kwargs)
    config = kwargs.pop("config")
    kwargs.pop("prefix", None)  # the driver takes its prefix at each start
    if kwargs or config.contents == ("stack", "shapes"):
        with pytest.raises(ValueError, match=message):  # the driver fails at construction, not at a step
            SglangHttpDriver("http://127.0.0.1:9", config, **kwargs)


# --------------------------------------------------------------------------- trace names


@pytest.mark.parametrize(
    ("name", "local_rank"),
    [
        ("1712345678.123-TP-3.trace.json.gz", 3),  # 0.4.4+
        ("step3-1712345678.123-TP-1.trace.json.gz", 1),  # 0.5.6+ profile_prefix
        ("1712345678.123-TP-0-EXTEND.trace.json.gz", 0),  # profile_by_stage, 0.5.3+
        ("1712345678.123-TP-2-DECODE.trace.json.gz", 2),
        ("1712345678.123-TP-1-decode.trace.json.gz", 1),  # SGLANG_PROFILE_V2
        ("1712345678.123-TP-1-2.trace.json.gz", 1),  # 0.4.7-0.5.2 on Python >= 3.11: str(ForwardMode.DECODE)
        ("1712345678.123-TP-1-ForwardMode.EXTEND.trace.json.gz", 1),  # the same on Python 3.10
        ("1712345678.123-TP-1-EP-5.trace.json.gz", 1),  # EP ranks live on the TP ranks' GPUs
        ("step3-1712345678.5-TP-1-memory-DECODE.pickle", 1),  # activities MEM
        ("rpd-1712345678.5-TP-4.trace.json.gz", 4),  # ROCm
        ("1712345678.123-TP-1-DP-1.trace.json.gz", None),  # DP / PP: the GPU depends on the engine's mode
        ("1712345678.123-TP-1-PP-1.trace.json.gz", None),
        ("1712345678.123.trace.json.gz", None),  # <= 0.4.3: no rank in the name
        ("merged-1712345678.123.trace.json.gz", None),
    ],
)
def test_sglang_names_give_the_rank_inside_the_replica(name: str, local_rank: int | None) -> None:
    assert sglang_trace_local_rank(name) == local_rank
    assert sglang_trace_local_rank(f"/out/replica0/{name}") == local_rank


@given(
    prefix=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.=+_-]{0,20}", fullmatch=True)),
    profile_id=st.one_of(st.floats(1e9, 2e9).map(str), st.from_regex(r"[A-Za-z0-9_.]{1,20}", fullmatch=True)),
    tp=st.integers(0, 4095),
    ep=st.one_of(st.none(), st.integers(0, 64)),
    memory=st.booleans(),
    stage=st.sampled_from(["", "-EXTEND", "-DECODE", "-prefill", "-decode", "-1", "-2", "-ForwardMode.DECODE"]),
)
def test_any_name_sglang_writes_gives_its_tp_rank(
    prefix: str | None, profile_id: str, tp: int, ep: int | None, memory: bool, stage: str
) -> None:
    # Built as SGLang's _stop_profile builds it (0.5.23 profiler_manager.py), memory snapshots included.
    name = (f"{prefix}-" if prefix else "") + f"{profile_id}-TP-{tp}" + (f"-EP-{ep}" if ep is not None else "")
    name += ("-memory" + stage + ".pickle") if memory else (stage + ".trace.json.gz")
    assert sglang_trace_local_rank(name) == tp


# --------------------------------------------------------------------------- a stand-in SGLang server


@pytest.fixture
def sglang_server(tmp_path: Path) -> Iterator[type[SGLangStandIn]]:
    """A stand-in SGLang 0.5.23 with TP 2 on 127.0.0.1 (tests/sglang_support/server.py; version and TP size
    may be changed by the test)."""
    with serve_sglang(tmp_path / "env-dir") as handler:
        yield handler


def _post(requests: list[Request], path: str) -> list[tuple[str, str | None, Any]]:
    return [(method, kind, body) for method, route, kind, body in requests if route == path]


def test_the_driver_posts_the_exact_body_and_relocates_one_rank(
    sglang_server: type[SGLangStandIn], tmp_path: Path
) -> None:
    """Replica 1 of a 4-GPU run (TP 2), rank 3 profiled: TP-1 moves, its TP peer stays put."""
    save = tmp_path / "save"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(2,), ranks=(3,), contents=("cpu", "cuda"))
    base = tmp_path / "sglang-prof"
    driver = SglangHttpDriver(sglang_server.url, cfg, output_dir=replica_profiler_dir(base, 1))
    assert isinstance(driver, EngineDriver)
    rollout = RolloutProfiler(
        cfg, driver, rank=2, world_size=4, gpus_per_replica=2, profiler_base=base, manifest=Manifest(save)
    )
    assert rollout.start(1) is False  # not a profiled step: no request at all
    assert sglang_server.requests == []
    assert rollout.start(2) is True
    assert _post(sglang_server.requests, "/start_profile") == [
        (
            "POST",
            "application/json",
            {
                "activities": ["CPU", "GPU"],
                "with_stack": False,
                "record_shapes": False,
                "output_dir": str(base / "replica1"),
                "profile_prefix": "step2",
            },
        )
    ]
    records = rollout.stop(2)
    assert rollout.failures == 0
    assert [(r.rank, r.tool, r.stage, r.step) for r in records] == [(3, "sglang", "engine", 2)]
    moved = save / records[0].path
    assert moved.name.startswith("rollout_engine_step2_rank3-of-4_replica1_step2-")
    assert moved.name.endswith("-TP-1.trace.json.gz")
    assert json.loads(gzip.decompress(moved.read_bytes()))["traceEvents"][0]["name"] == "run_batch"
    left = sorted(p.name for p in (base / "replica1").iterdir())
    assert len(left) == 1 and left[0].endswith("-TP-0.trace.json.gz")  # the TP peer, not moved
    assert sorted(p.name for p in save.iterdir() if not p.name.startswith("instrument-manifest")) == [moved.name]
    assert [(line.path, line.tool) for line in read_manifests(save)] == [(moved.name, "sglang")]


def test_relocation_leaves_other_steps_and_moves_across_filesystems(tmp_path: Path) -> None:
    """Real files as SGLang names them; ``save_path`` on another filesystem (/dev/shm) where there is one."""
    source = tmp_path / "replica0"
    source.mkdir()
    names = {
        "step4-1712.5-TP-0.trace.json.gz": b"kept",
        "step4-1712.5-TP-1.trace.json.gz": b"peer",
        "step3-1700.1-TP-0.trace.json.gz": b"an earlier step's",
        "step4-1712.5-TP-0-memory.pickle": b"snapshot",
    }
    for name, data in names.items():
        (source / name).write_bytes(data)
    shm = Path("/dev/shm")
    other_fs = shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev
    save = Path(tempfile.mkdtemp(dir=shm)) if other_fs else tmp_path / "save"
    try:
        result = relocate_engine_traces(
            source,
            save_path=save,
            step=4,
            replica=0,
            gpus_per_replica=2,
            world_size=2,
            keep_ranks={0},
            traces=TRACES,
            quiet_s=0.05,
        )
        moved = {r.path: (save / r.path).read_bytes() for r in result.moved}
        assert moved == {
            "rollout_engine_step4_rank0-of-2_replica0_step4-1712.5-TP-0.trace.json.gz": b"kept",
            "rollout_engine_step4_rank0-of-2_replica0_step4-1712.5-TP-0-memory.pickle": b"snapshot",
        }
        assert sorted(Path(p).name for p in result.dropped) == ["step4-1712.5-TP-1.trace.json.gz"]
        assert sorted(Path(p).name for p in result.skipped) == ["step3-1700.1-TP-0.trace.json.gz"]
        assert sorted(p.name for p in source.iterdir()) == sorted(
            ["step4-1712.5-TP-1.trace.json.gz", "step3-1700.1-TP-0.trace.json.gz"]
        )
        assert sorted(p.name for p in save.iterdir()) == sorted(moved)  # no temp file left behind
    finally:
        if other_fs:
            shutil.rmtree(save)


def test_the_version_comes_from_the_server_and_old_ones_get_their_body(
    sglang_server: type[SGLangStandIn], caplog: pytest.LogCaptureFixture
) -> None:
    sglang_server.version = "0.4.9"  # no /server_info yet: /get_server_info answers
    cfg = ins.ProfilerConfig(contents=("cpu", "cuda", "stack"), token_window=(0, 3))
    driver = SglangHttpDriver(sglang_server.url, cfg, output_dir="/prof/r0", profile_by_stage=True)
    with caplog.at_level(logging.WARNING, logger="instrument"):
        driver.start(prefix="step1")
        driver.stop()
        driver.start(prefix="step2")
    assert [path for _, path, _, _ in sglang_server.requests] == [
        "/server_info",
        "/get_server_info",
        "/start_profile",
        "/stop_profile",
        "/start_profile",
    ]  # the version is asked once
    assert _post(sglang_server.requests, "/start_profile")[0][2] == {
        "activities": ["CPU", "GPU"],
        "with_stack": True,
        "record_shapes": False,
        "output_dir": "/prof/r0",
        "num_steps": 4,
        "profile_by_stage": True,
    }  # no profile_prefix before 0.5.6
    assert caplog.text == ""  # 0.4.9 honours all of it


def test_sglang_before_0_4_4_gets_no_body_and_a_warning_once(
    sglang_server: type[SGLangStandIn], caplog: pytest.LogCaptureFixture
) -> None:
    sglang_server.version = "0.4.3"
    driver = SglangHttpDriver(sglang_server.url, ins.ProfilerConfig())
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for _ in range(2):
            driver.start(prefix="step1")
            driver.stop()
    assert _post(sglang_server.requests, "/start_profile") == [("POST", None, None)] * 2
    assert caplog.text.count("reads no /start_profile body") == 1
    assert caplog.text.count("answers /stop_profile before its traces are written") == 1


def test_refusals_become_messages_that_name_the_cause(sglang_server: type[SGLangStandIn]) -> None:
    url = sglang_server.url
    driver = SglangHttpDriver(url, ins.ProfilerConfig(), sglang_version="0.5.23")
    driver.start()
    with pytest.raises(EngineProfilerError, match=r"start_profile answered 500: most likely already profiling"):
        driver.start()
    driver.stop()
    with pytest.raises(EngineProfilerError, match=r"stop_profile answered 500: most likely not profiling"):
        driver.stop()
    sglang_server.overrides["/start_profile"] = 401
    with pytest.raises(EngineProfilerError, match="wants an API key"):
        driver.start()
    sglang_server.overrides["/start_profile"] = 404
    with pytest.raises(EngineProfilerError, match="does not exist: not an SGLang server"):
        driver.start()
    sglang_server.overrides.update({"/server_info": 404, "/get_server_info": 404})
    with pytest.raises(EngineProfilerError, match="neither /server_info nor /get_server_info"):
        SglangHttpDriver(url, ins.ProfilerConfig()).start()


def test_a_stop_after_num_steps_is_not_a_failure(sglang_server: type[SGLangStandIn]) -> None:
    """With ``num_steps`` SGLang stops by itself; a later stop is refused (500) and that is fine, once."""
    driver = SglangHttpDriver(sglang_server.url, ins.ProfilerConfig(token_window=(0, 1)))
    driver.start()
    sglang_server.state["profiling"] = False  # SGLang stopped itself after 2 forward passes
    driver.stop()
    with pytest.raises(EngineProfilerError, match="not profiling"):
        driver.stop()  # a second stop is a real mistake again


def test_a_stop_past_its_deadline_on_a_live_server_is_still_flushing(sglang_server: type[SGLangStandIn]) -> None:
    sglang_server.overrides["/stop_profile"] = 0  # held: the flush goes on past the deadline
    driver = SglangHttpDriver(sglang_server.url, ins.ProfilerConfig(), sglang_version="0.5.23", stop_timeout_s=0.3)
    with pytest.raises(EngineStillFlushingError, match=r"still flushing after 0\.3 s \(the server answers /health\)"):
        driver.stop()


def test_a_rollout_profiler_on_an_unreachable_sglang_never_raises(tmp_path: Path) -> None:
    with socket_closed_port() as port:
        cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,))
        driver = SglangHttpDriver(f"http://127.0.0.1:{port}", cfg, timeout_s=2)
        with pytest.raises(HttpError, match="unreachable"):
            driver.server_version()
        rollout = RolloutProfiler(
            cfg, driver, rank=0, world_size=1, gpus_per_replica=1, profiler_base=tmp_path, manifest=Manifest(tmp_path)
        )
        assert rollout.start(1) is False
        assert rollout.stop(1) == []
        assert rollout.failures == 1


class socket_closed_port:  # noqa: N801 - used as a context manager, named for what it gives
    """A port on 127.0.0.1 that was bound and closed again: nothing listens there."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        pass
