"""Real torch.profiler traces through the public API: names, windows, rows, modes and faults."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import instrument as ins
from instrument.manifest import read_manifests
from instrument.naming import parse_trace_name
from tests.conftest import event_names, load_trace, without_timeline


def _matmul() -> None:
    torch.randn(16, 16) @ torch.randn(16, 16)


class Worker:
    """A tiny worker with one forward-only and one update stage."""

    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self) -> None:
        _matmul()

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, n: int) -> None:
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                _matmul()


def _run(cfg: ins.ProfilerConfig, *, steps: int, mini_batches: int, rank: int = 0, world: int = 1) -> list[str]:
    """The trace files of a run (its step timeline left out)."""
    ins.configure(cfg, role="actor", rank=rank, world_size=world)
    worker = Worker()
    for step in range(1, steps + 1):
        with ins.profile_step(step, last=(step == steps)):
            worker.compute_log_prob()
            worker.update_actor(mini_batches)
    return without_timeline(ins.finish())


def _traces(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("*.pt.trace.json.gz"))


def _cfg(tmp_path: Path, **kwargs: object) -> ins.ProfilerConfig:
    kwargs.setdefault("contents", ("cpu",))
    return ins.ProfilerConfig(save_path=str(tmp_path), **kwargs)  # type: ignore[arg-type]


def test_discrete_schedule_writes_one_trace_per_stage_and_window(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, steps=(1, 3), schedule=ins.Schedule(wait=1, warmup=1, active=2, repeat=2))
    files = _run(cfg, steps=3, mini_batches=10)
    names = [parse_trace_name(f) for f in files]
    assert all(n is not None for n in names)
    got = sorted((n.step, n.stage, n.window, n.partial) for n in names if n is not None)
    assert got == [
        (1, "compute-log-prob", None, False),
        (1, "update-actor", (2, 3), False),
        (1, "update-actor", (6, 7), False),
        (3, "compute-log-prob", None, False),
        (3, "update-actor", (2, 3), False),
        (3, "update-actor", (6, 7), False),
    ]
    assert sorted(Path(f).name for f in files) == _traces(tmp_path)
    window = next(f for f in files if "_mb6-7_" in f and "step3" in f)
    rows = event_names(window)
    assert {"mini_batch6", "mini_batch7"} <= rows
    assert not {"mini_batch5", "mini_batch8"} & rows
    assert not any(r.startswith("ProfilerStep#") for r in rows)
    assert "compute_log_prob" in event_names(next(f for f in files if "compute-log-prob" in f))


def test_partial_window_is_saved_and_named_by_what_it_holds(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, steps=(1,), schedule=ins.Schedule(skip_first=1, warmup=1, active=3))
    files = _run(cfg, steps=1, mini_batches=4)
    update = [f for f in files if "update-actor" in f]
    assert len(update) == 1
    assert "_mb2-3_partial_" in update[0]
    rows = event_names(update[0])
    assert {"mini_batch2", "mini_batch3"} <= rows
    assert "mini_batch1" not in rows


def test_window_that_never_starts_writes_nothing_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _cfg(tmp_path, steps=(1, 2), schedule=ins.Schedule(skip_first=2, wait=1, warmup=1, active=2))
    with caplog.at_level(logging.WARNING, logger="instrument"):
        files = _run(cfg, steps=2, mini_batches=3)
    assert [f for f in files if "update-actor" in f] == []
    reports = [r for r in caplog.records if "recorded none" in r.getMessage()]
    assert len(reports) == 1
    assert "'update_actor' ran 3 mini-batches" in reports[0].getMessage()


def test_unprofiled_steps_and_ranks_write_nothing(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "a", steps=(2,), ranks=(1,))
    assert _run(cfg, steps=3, mini_batches=2, rank=0, world=2) == []
    assert not (tmp_path / "a").exists() or _traces(tmp_path / "a") == []
    assert [r.tool for r in read_manifests(tmp_path / "a")] == ["timeline"]  # the step timeline alone
    ins.testing.reset()
    files = _run(cfg, steps=3, mini_batches=2, rank=1, world=2)
    assert {parse_trace_name(f).step for f in files if parse_trace_name(f)} == {2}  # type: ignore[union-attr]
    assert all("_rank1-of-2_" in f for f in files)


def test_no_schedule_records_a_scheduled_stage_whole(tmp_path: Path) -> None:
    files = _run(_cfg(tmp_path, steps=(1,)), steps=1, mini_batches=3)
    update = next(f for f in files if "update-actor" in f)
    assert "_mb" not in Path(update).name
    assert {"update_actor", "mini_batch0", "mini_batch1", "mini_batch2"} <= event_names(update)


def test_continuous_mode_writes_one_trace_per_step_with_stage_ranges(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, steps=(1, 2), discrete=False, schedule=ins.Schedule(active=2))
    files = _run(cfg, steps=2, mini_batches=3)
    assert [parse_trace_name(f).stage for f in files] == ["continuous", "continuous"]  # type: ignore[union-attr]
    rows = event_names(files[0])
    assert {"compute_log_prob", "update_actor", "mini_batch0", "mini_batch2"} <= rows


def test_rank_metadata_for_hta(tmp_path: Path) -> None:
    files = _run(_cfg(tmp_path, steps=(1,), all_ranks=True), steps=1, mini_batches=1, rank=3, world=4)
    trace = load_trace(files[0])
    assert trace["distributedInfo"] == {"backend": "none", "rank": 3, "world_size": 4}
    assert trace["instrument"] == {"role": "actor", "stage": "compute_log_prob", "step": 1, "rank": 3}


def test_manifest_lists_every_file(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, steps=(1, 2), schedule=ins.Schedule(active=2))
    files = _run(cfg, steps=2, mini_batches=2)
    records = without_timeline(read_manifests(tmp_path))
    assert sorted(str(tmp_path / r.path) for r in records) == sorted(files)
    for record in records:
        assert record.bytes == os.path.getsize(tmp_path / record.path)
        assert (record.role, record.rank, record.world_size, record.tool) == ("actor", 0, 1, "torch")
    assert {r.window for r in records} == {None, (0, 1)}


def test_a_stage_that_raises_propagates_unchanged_and_keeps_its_trace(tmp_path: Path) -> None:
    class BoomError(Exception):
        pass

    @ins.profiled_stage("update_actor", scheduled=True)
    def update() -> None:
        for i in range(3):
            with ins.profile_window(mini_batch=i):
                _matmul()
                if i == 1:
                    raise BoomError("user error")

    ins.configure(_cfg(tmp_path, steps=(1,), schedule=ins.Schedule(active=4)), role="actor", rank=0, world_size=1)
    with pytest.raises(BoomError, match="user error"), ins.profile_step(1):
        update()
    files = without_timeline(ins.finish())
    assert len(files) == 1
    assert "_mb0-1_partial_" in files[0]
    assert {"mini_batch0", "mini_batch1"} <= event_names(files[0])


def test_unwritable_save_path_logs_once_and_training_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    cfg = _cfg(blocker / "profile", steps=(1, 2))
    blocker.write_text("not a directory")  # after the config is built (which would refuse it): the run absorbs it
    with caplog.at_level(logging.WARNING, logger="instrument"):
        session = ins.configure(cfg, role="actor", rank=0, world_size=1)
        worker = Worker()
        for step in (1, 2):
            with ins.profile_step(step):
                worker.compute_log_prob()
        assert ins.finish() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(blocker / "profile") in warnings[0]
    assert session.failures == 1


def test_export_failure_is_absorbed_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path, steps=(1, 2))
    session = ins.configure(cfg, role="actor", rank=0, world_size=1)
    worker = Worker()
    with ins.profile_step(1):
        worker.compute_log_prob()
    ins.finish()  # the first trace is on disk
    assert len(_traces(tmp_path)) == 1
    session = ins.configure(cfg, role="actor", rank=0, world_size=1)
    tmp_path.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING, logger="instrument"), ins.profile_step(1):
            worker.compute_log_prob()
        ins.finish()
    finally:
        tmp_path.chmod(0o700)
    if os.geteuid() != 0:  # root writes into read-only directories
        assert session.failures >= 1
    assert len(_traces(tmp_path)) >= 1  # nothing already written is lost


def test_hostile_role_and_path_are_data(tmp_path: Path) -> None:
    save = tmp_path / "we ird; $(touch PWNED) `x` é"
    cfg = _cfg(
        save,
        steps=(1,),
        finish_hook=ins.FinishHook(
            cmd='ls "$INSTRUMENT_PROFILE_SAVE_PATH" > "$INSTRUMENT_PROFILE_SAVE_PATH/../listing"'
        ),
    )
    ins.configure(cfg, role="actor;rm -rf $(x)", rank=0, world_size=1)
    with ins.profile_step(1, last=True):
        Worker().compute_log_prob()
    files = without_timeline(ins.finish())
    assert len(files) == 1
    assert Path(files[0]).parent == save
    assert Path(files[0]).name.startswith("actor-rm--rf---x-_compute-log-prob_step1_")
    assert Path(files[0]).name in (tmp_path / "listing").read_text()
    assert not list(tmp_path.rglob("PWNED"))


def test_sigterm_during_a_window_flushes_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys, torch
        import instrument as ins
        ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1,),
                      schedule=ins.Schedule(active=5)), role="actor", rank=0, world_size=1)
        @ins.profiled_stage("update_actor", scheduled=True)
        def update():
            for i in range(4):
                with ins.profile_window(mini_batch=i):
                    torch.ones(4) + 1
                    if i == 2:
                        os.kill(os.getpid(), signal.SIGTERM)
        with ins.profile_step(1):
            update()
        print("not reached")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "not reached" not in done.stdout
    traces = _traces(tmp_path)
    assert len(traces) == 1
    assert "_mb0-2_partial_" in traces[0]
    assert {"mini_batch0", "mini_batch2"} <= event_names(tmp_path / traces[0])


def test_continuous_steps_record_every_call_and_window_through_the_fast_path(tmp_path: Path) -> None:
    """After a stage's first call on a continuous step its range opens without the session: same trace."""
    import threading

    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), discrete=False)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    worker = Worker()
    with ins.profile_step(1):
        for _ in range(3):
            worker.update_actor(2)
        other = threading.Thread(target=worker.update_actor, args=(1,))  # another thread: the counted path
        other.start()
        other.join()
    (path,) = without_timeline(ins.finish())
    events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") == "X"]
    names = [e["name"] for e in events]
    assert names.count("update_actor") == 4
    assert names.count("mini_batch0") == 4 and names.count("mini_batch1") == 3
    assert len({e["tid"] for e in events if e["name"] == "update_actor"}) == 2


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_stage_and_mini_batch_ranges_are_user_annotations(tmp_path: Path, discrete: bool) -> None:
    """As record_function writes them: HTA, TensorBoard and Perfetto read them as annotations."""
    cfg = _cfg(tmp_path, steps=(1,), discrete=discrete)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    worker = Worker()
    with ins.profile_step(1):
        for _ in range(2):  # on a continuous step the second calls open their ranges themselves (the fast path)
            worker.compute_log_prob()
            worker.update_actor(2)
    wanted = ("compute_log_prob", "update_actor", "mini_batch0", "mini_batch1")
    categories: dict[str, set[str]] = {}
    for path in without_timeline(ins.finish()):
        for event in load_trace(path)["traceEvents"]:
            if event.get("ph") == "X" and event["name"] in wanted:
                categories.setdefault(event["name"], set()).add(event["cat"])
    assert categories == {name: {"user_annotation"} for name in wanted}


def test_memory_contents_record_memory_events(tmp_path: Path) -> None:
    """``profile_all_threads`` silences torch's [memory] events: it is left off when memory is asked for."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu", "memory"), steps=(1,))
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    with ins.profile_step(1), ins.profiled_stage("compute_log_prob"):
        torch.randn(64, 64) @ torch.randn(64, 64)
    (path,) = without_timeline(ins.finish())
    assert "[memory]" in event_names(path)
