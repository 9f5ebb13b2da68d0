"""The run id every process of a job agrees on (issue 27, item 6): its sources, in order, and real ranks."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import instrument as ins
from instrument.manifest import read_manifests
from instrument.run import _run_id
from instrument.run._run_id import RUN_ID_ENV, older_runs, resolve_run_id
from tests.conftest import spawn_ranks

HANG_GUARD_S = 600.0  # ranks still running after this are killed and the test fails


def test_the_explicit_id_wins_over_every_other_source() -> None:
    env = {RUN_ID_ENV: "nightly-7", "TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "9"}
    stamp = resolve_run_id(rank=3, world_size=8, environ=env)
    assert (stamp.id, stamp.source) == ("nightly-7", "env")
    assert stamp.started > 0


def test_torchrun_then_slurm_and_torchruns_default_none_names_no_run() -> None:
    assert resolve_run_id(rank=0, world_size=2, environ={"TORCHELASTIC_RUN_ID": "f3a9"}).id == "f3a9"
    stamp = resolve_run_id(
        rank=0, world_size=2, environ={"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1"}
    )
    assert (stamp.id, stamp.source) == ("slurm-4242.1", "slurm")
    assert resolve_run_id(rank=0, world_size=2, environ={"SLURM_JOB_ID": "4242"}).id == "slurm-4242"
    assert resolve_run_id(rank=0, world_size=2, environ={RUN_ID_ENV: " "}).source != "env"


def test_without_any_source_ranks_share_the_minute_and_one_process_names_itself() -> None:
    many = resolve_run_id(rank=1, world_size=6, environ={})
    assert many.source == "time" and re.fullmatch(r"t\d{8}-\d{4}-w6", many.id)
    assert resolve_run_id(rank=2, world_size=6, environ={}).id == many.id  # every later configure here too
    alone = resolve_run_id(rank=0, world_size=1, environ={})
    assert alone.source == "process" and f"pid{os.getpid()}-" in alone.id
    assert resolve_run_id(rank=0, world_size=1, environ={}) == alone


@given(st.text(max_size=200))
def test_any_given_id_becomes_a_short_safe_name_or_none(raw: str) -> None:
    cleaned = _run_id._clean(raw)
    if cleaned is not None:
        assert re.fullmatch(r"[A-Za-z0-9.=+-]{1,80}", cleaned)
        assert cleaned.lower() not in {"none", "null"}


def test_older_runs_counts_manifests_of_other_runs_only(tmp_path: Path) -> None:
    (tmp_path / "instrument-manifest-h-pid1.jsonl").write_text('{"path":"a","run":"old"}\n')
    (tmp_path / "instrument-manifest-h-pid2.jsonl").write_text('{"path":"b"}\n')  # before run ids
    (tmp_path / "instrument-manifest-h-pid3.jsonl").write_text('{"path":"c","run":"new"}\n')
    os.mkfifo(tmp_path / "instrument-manifest-h-pid4.jsonl")  # never waited on
    assert older_runs(tmp_path, "new") == 2
    assert older_runs(tmp_path / "missing", "new") == 0


def test_run_info_and_every_manifest_line_carry_the_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_ID_ENV, "exp-1")
    run = ins.configure(ins.ProfilerConfig(tool="none", save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    assert run.run_id == "exp-1"
    with ins.profile_step(1):
        pass
    ins.finish()
    stamps = {(r.run.id, r.run.source) for r in read_manifests(tmp_path) if r.run is not None}
    assert stamps == {("exp-1", "env")}  # the step timeline's line


def test_a_second_run_into_the_save_path_warns_once_on_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = ins.ProfilerConfig(tool="none", save_path=str(tmp_path))
    for run_id in ("a", "b"):
        monkeypatch.setenv(RUN_ID_ENV, run_id)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="instrument"):
            ins.configure(cfg, role="actor", rank=0, world_size=1)
            for step in (1, 2):
                with ins.profile_step(step):
                    pass
            ins.finish()
        said = [r.getMessage() for r in caplog.records if "older runs" in r.getMessage()]
        assert len(said) == (0 if run_id == "a" else 1)
    assert "shows the newest run (this one, b)" in said[0]
    monkeypatch.setenv(RUN_ID_ENV, "c")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="instrument"):
        ins.configure(cfg, role="actor", rank=1, world_size=2)  # not rank 0: says nothing
        with ins.profile_step(1):
            pass
        ins.finish()
    assert not [r for r in caplog.records if "older runs" in r.getMessage()]


# --------------------------------------------------------------------------- real ranks


def _rank(rank: int, save: str, rendezvous: str, configure_on_0: bool) -> None:
    import torch.distributed as dist

    for name in (RUN_ID_ENV, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        os.environ.pop(name, None)
    _run_id.STORE_WAIT_S = 0.5  # rank 0 never configures in the second case: rank 1 gives up soon
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    if rank == 0 and not configure_on_0:
        dist.barrier()  # until rank 1 has finished
        dist.destroy_process_group()
        return
    run = ins.configure(ins.ProfilerConfig(tool="none", save_path=save), role="actor")
    with ins.profile_step(1):
        pass
    ins.finish()
    Path(save, f"id-rank{rank}").write_text(run.run_id)
    if not configure_on_0:
        dist.barrier()
    dist.destroy_process_group()


def _spawn(tmp_path: Path, name: str, configure_on_0: bool) -> Path:

    save = tmp_path / name
    save.mkdir()
    rendezvous = str(tmp_path / f"{name}.rdv")
    spawn_ranks(_rank, (str(save), rendezvous, configure_on_0), nprocs=2)
    return save


@pytest.mark.slow
def test_two_gloo_ranks_agree_on_one_id_through_the_store(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    save = _spawn(tmp_path, "both", configure_on_0=True)
    ids = {(save / f"id-rank{r}").read_text() for r in (0, 1)}
    assert len(ids) == 1
    stamps = {(r.run.id, r.run.source, r.rank) for r in read_manifests(save) if r.run is not None}
    assert {s[:2] for s in stamps} == {(ids.pop(), "store")} and {s[2] for s in stamps} == {0, 1}

    alone = _spawn(tmp_path, "alone", configure_on_0=False)
    (stamp,) = {r.run for r in read_manifests(alone) if r.run is not None}
    assert stamp is not None and stamp.source == "time"  # rank 1 waited for rank 0 in vain, then named it itself


@pytest.mark.slow
def test_a_ray_driver_and_its_actors_share_the_job_id() -> None:
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
    )
    try:

        @ray.remote(num_cpus=0)
        class Probe:
            def stamp(self, rank: int) -> tuple[str, str]:
                found = resolve_run_id(rank=rank, world_size=3, environ={})
                return found.id, found.source

        probes = [Probe.remote() for _ in range(2)]  # type: ignore[attr-defined]
        stamps = ray.get([probe.stamp.remote(rank) for rank, probe in enumerate(probes, 1)], timeout=HANG_GUARD_S)
        driver = resolve_run_id(rank=0, world_size=3, environ={})
    finally:
        ray.shutdown()
    assert driver.source == "ray" and driver.id.startswith("ray-")
    assert set(stamps) == {(driver.id, "ray")}
