"""The engine-generic rollout path: the driver protocol, relocation over each engine's names, and
:class:`RolloutProfiler`'s failures (one warning per kind) and where its manifest lines go (``publish``).

Everything runs on real files; the engine is :class:`_Engine`, a stand-in for ``vllm.LLM`` (a real
vLLM is too slow for this file: tests/rollout/test_vllm_server.py has it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
from instrument.manifest import MANIFEST_GLOB, Manifest, read_manifests
from instrument.rollout import (
    EngineDriver,
    RelocationResult,
    RolloutProfiler,
    relocate_engine_traces,
    replica_profiler_dir,
    sglang,
    vllm,
)
from instrument.rollout.vllm import HttpEngineDriver, InProcessEngineDriver


class _Engine:
    """A stand-in for ``vllm.LLM``: ``stop_profile`` writes one trace per GPU of the replica, named as
    vLLM 0.32 names them, into the replica's profiler directory (or nothing, or raises, if told to)."""

    def __init__(self, directory: str, gpus: int = 1, *, writes: bool = True, fails: bool = False) -> None:
        self.directory, self.gpus, self.writes, self.fails = Path(directory), gpus, writes, fails
        self.directory.mkdir(parents=True, exist_ok=True)  # vLLM makes it when the engine starts
        self.prefix: str | None = None

    def start_profile(self, profile_prefix: str | None = None) -> None:
        if self.fails:
            raise RuntimeError("engine is gone")
        self.prefix = profile_prefix

    def stop_profile(self) -> None:
        if self.writes:
            for local in range(self.gpus):
                (self.directory / f"{self.prefix}_rank{local}.{time.time_ns()}.pt.trace.json.gz").write_bytes(b"t" * 10)


def _profiler(tmp_path: Path, engine_kw: dict[str, bool] | None = None, **wiring: Any) -> RolloutProfiler:
    """A profiler of one GPU on steps 1-3; ``wiring`` is ``publish`` / ``manifest`` / ``profiles_step``
    (default: a manifest of its own in save_path)."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1, 2, 3))
    base = tmp_path / "prof"
    engine = _Engine(replica_profiler_dir(base, 0), **(engine_kw or {}))
    driver = InProcessEngineDriver(engine)
    if not {"publish", "manifest"} & set(wiring):
        wiring["manifest"] = Manifest(cfg.save_path)
    return RolloutProfiler(cfg, driver, rank=0, world_size=1, gpus_per_replica=1, profiler_base=base, **wiring)


def _relocate(tmp_path: Path, names: list[str], **overrides: Any) -> RelocationResult:
    """Write ``names`` into an engine directory and relocate them (one replica of one GPU, vLLM's names,
    unless overridden)."""
    source = tmp_path / "engine"
    source.mkdir(exist_ok=True)
    for name in names:
        (source / name).write_bytes(b"t")
    kw: dict[str, Any] = {"save_path": tmp_path / "save", "step": 1, "replica": 0, "gpus_per_replica": 1}
    kw.update(world_size=1, keep_ranks={0}, quiet_s=0.05, traces=vllm.TRACES)
    return relocate_engine_traces(source, **{**kw, **overrides})


def _warnings(caplog: pytest.LogCaptureFixture, words: str) -> int:
    return sum(words in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# --------------------------------------------------------------------------- failures: once per kind


def test_each_kind_of_rollout_failure_is_warned_once_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = _profiler(tmp_path, {"fails": True})
    with caplog.at_level(logging.WARNING, logger="instrument"):
        assert [profiler.start(step) for step in (1, 2, 3)] == [False, False, False]
    assert profiler.failures == 3
    assert _warnings(caplog, "could not start the engine profiler") == 1
    assert "engine is gone" in caplog.text and "step 1" in caplog.text


def test_a_step_without_engine_traces_is_warned_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profiler = _profiler(tmp_path, {"writes": False})
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for step in (1, 2, 3):
            assert profiler.start(step)
            assert profiler.stop(step) == []
    assert profiler.failures == 3
    assert _warnings(caplog, "no engine trace") == 1


# --------------------------------------------------------------------------- manifest


def test_profilers_given_one_manifest_share_it(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,), ranks=(0, 2))
    base = tmp_path / "prof"
    manifest = Manifest(cfg.save_path)
    profilers = [
        RolloutProfiler(
            cfg,
            InProcessEngineDriver(_Engine(replica_profiler_dir(base, rank // 2), gpus=2)),
            rank=rank,
            world_size=4,
            gpus_per_replica=2,
            profiler_base=base,
            manifest=manifest,
        )
        for rank in (0, 2)
    ]
    for profiler in profilers:
        assert profiler.start(1)
        assert [r.rank for r in profiler.stop(1)] == [profiler.rank]  # its TP peer's trace stays behind
    assert len(list((tmp_path / "save").glob(MANIFEST_GLOB))) == 1
    assert sorted(r.rank for r in read_manifests(tmp_path / "save")) == [0, 2]


def test_in_a_configured_process_engine_traces_join_the_runs_manifest(tmp_path: Path) -> None:
    """The run's publish lists them: one manifest for the process, and finish() returns them."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,))
    run = ins.configure(cfg, role="rollout", rank=0)
    profiler = _profiler(tmp_path, publish=run.publish, profiles_step=run.records_step)
    assert profiler.start(1)
    [record] = profiler.stop(1)
    assert [Path(f).name for f in ins.finish()] == [record.path]
    assert [m.name for m in (tmp_path / "save").glob(MANIFEST_GLOB)] == [run.manifest_path.name]


def test_the_run_decides_which_steps_the_engine_records(tmp_path: Path) -> None:
    """A step the run profiles on demand (here: SIGUSR1's flag) is recorded by the engine too."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(3,), on_demand=True)
    run = ins.configure(cfg, role="rollout", rank=0)
    profiler = _profiler(tmp_path, publish=run.publish, profiles_step=run.records_step)  # its own config: steps 1-3
    with ins.profile_step(1):
        assert not profiler.start(1)  # the run does not profile step 1
    os.kill(os.getpid(), signal.SIGUSR1)  # profile the next step
    with ins.profile_step(2):
        assert profiler.start(2)
        [record] = profiler.stop(2)
    assert record.step == 2


def test_a_given_manifest_gets_the_lines(tmp_path: Path) -> None:
    mine = Manifest(tmp_path / "save")
    profiler = _profiler(tmp_path, manifest=mine)
    assert profiler.start(1)
    [record] = profiler.stop(1)
    assert mine.path.exists()
    assert [r.path for r in read_manifests(tmp_path / "save")] == [record.path]


def test_an_unwritable_manifest_does_not_stop_relocation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "blocker").write_bytes(b"")  # a file where the manifest's directory should be
    names = [f"rank{local}.1.pt.trace.json.gz" for local in range(3)]
    with caplog.at_level(logging.WARNING, logger="instrument"):
        result = _relocate(
            tmp_path,
            names,
            gpus_per_replica=3,
            world_size=3,
            keep_ranks={0, 1, 2},
            manifest=Manifest(tmp_path / "blocker"),
        )
    assert len(result.moved) == 3  # every trace is in save_path; only the manifest lines are missing
    assert sorted(p.name.split("_replica")[0] for p in (tmp_path / "save").iterdir()) == [
        f"rollout_engine_step1_rank{r}-of-3" for r in range(3)
    ]
    assert "could not list an engine trace in the manifest" in caplog.text


def test_where_the_lines_go_is_the_callers_to_say(tmp_path: Path) -> None:
    """No manifest of the profiler's own: a relocating profiler is told where to list its traces."""
    with pytest.raises(TypeError, match="needs 'publish'"):
        _profiler(tmp_path, publish=None, manifest=None)
    with pytest.raises(TypeError, match="not both"):
        _profiler(tmp_path, publish=print, manifest=Manifest(tmp_path))
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,), relocate_results=False)
    driver = InProcessEngineDriver(_Engine(str(tmp_path / "prof" / "replica0")))
    profiler = RolloutProfiler(cfg, driver, rank=0, world_size=1, gpus_per_replica=1, profiler_base=tmp_path / "prof")
    assert profiler.start(1) and profiler.stop(1) == []  # nothing moves, so nothing is listed


def test_a_failing_profiles_step_is_a_counted_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(step: int) -> bool:
        raise RuntimeError("no run")

    profiler = _profiler(tmp_path, profiles_step=broken)
    with caplog.at_level(logging.WARNING, logger="instrument"):
        assert profiler.start(1) is False
    assert profiler.failures == 1 and "could not tell whether the step is profiled" in caplog.text


# --------------------------------------------------------------------------- hostile engine directories


def test_links_in_the_engine_directory_are_never_followed_or_moved(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"not a trace")
    source = tmp_path / "engine"
    source.mkdir()
    (source / "rank0.1.pt.trace.json.gz").symlink_to(outside)
    result = _relocate(tmp_path, ["rank0.2.pt.trace.json.gz"])
    assert [Path(r.path).name.endswith("rank0.2.pt.trace.json.gz") for r in result.moved] == [True]
    assert result.failed == []
    assert (source / "rank0.1.pt.trace.json.gz").is_symlink()
    assert outside.read_bytes() == b"not a trace"


def test_a_file_vanishing_during_the_wait_neither_ends_it_nor_fails(tmp_path: Path) -> None:
    vanishing = tmp_path / "engine" / "rank0.2.pt.trace.json.gz"
    remover = threading.Timer(0.1, lambda: vanishing.unlink(missing_ok=True))  # while relocation waits for quiet
    remover.start()
    result = _relocate(tmp_path, ["rank0.1.pt.trace.json.gz", vanishing.name], quiet_s=1.0)
    remover.join()
    assert result.settled
    assert result.failed == []
    assert any(r.path.endswith("rank0.1.pt.trace.json.gz") for r in result.moved)


# --------------------------------------------------------------------------- generic over engines


def test_sglang_traces_relocate_with_their_own_naming(tmp_path: Path) -> None:
    names = [f"1712345678.123-TP-{tp}.trace.json.gz" for tp in (0, 1)]
    result = _relocate(
        tmp_path, names, replica=1, gpus_per_replica=2, world_size=4, keep_ranks={3}, traces=sglang.TRACES
    )
    assert [(r.rank, r.tool, r.stage) for r in result.moved] == [(3, "sglang", "engine")]
    assert [Path(p).name for p in result.dropped] == ["1712345678.123-TP-0.trace.json.gz"]


def test_drivers_follow_one_protocol(tmp_path: Path) -> None:
    assert isinstance(HttpEngineDriver("http://127.0.0.1:1"), EngineDriver)
    assert isinstance(InProcessEngineDriver(_Engine(str(tmp_path))), EngineDriver)
    cfg = ins.ProfilerConfig(save_path=str(tmp_path))
    with pytest.raises(TypeError, match="'driver' must have traces, start\\(\\) and stop\\(\\)"):
        RolloutProfiler(cfg, object(), rank=0, world_size=1, gpus_per_replica=1, profiler_base=tmp_path)  # type: ignore[arg-type]


def test_an_async_engine_inside_a_running_loop_is_a_counted_failure_not_a_stray_coroutine(tmp_path: Path) -> None:
    made: list[Coroutine[Any, Any, None]] = []

    class AsyncEngine:
        """A stand-in for ``vllm.AsyncLLM``: its methods return coroutines (kept here to look at)."""

        def start_profile(self) -> Coroutine[Any, Any, None]:
            made.append(asyncio.sleep(0))
            return made[-1]

        def stop_profile(self) -> Coroutine[Any, Any, None]:
            return self.start_profile()

    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,))
    driver = InProcessEngineDriver(AsyncEngine())
    profiler = RolloutProfiler(
        cfg, driver, rank=0, world_size=1, gpus_per_replica=1, profiler_base=tmp_path, manifest=Manifest(cfg.save_path)
    )

    async def training_step() -> bool:
        return profiler.start(1)

    assert asyncio.run(training_step()) is False
    assert profiler.failures == 1
    [coroutine] = made
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # no "never awaited" RuntimeWarning later


def test_relocation_never_relabels_another_steps_files(tmp_path: Path) -> None:
    earlier = ["step3_rank0.1.pt.trace.json.gz", "step3_host_1.async_llm.2.pt.trace.json.gz"]
    result = _relocate(tmp_path, [*earlier, "step7_rank0.3.pt.trace.json.gz"], step=7)
    assert [Path(r.path).name for r in result.moved] == [
        "rollout_engine_step7_rank0-of-1_replica0_step7_rank0.3.pt.trace.json.gz"
    ]
    assert sorted(Path(p).name for p in result.skipped) == sorted(earlier)
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == sorted(earlier)  # left as vLLM wrote them
