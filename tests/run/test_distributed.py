"""Four real torch.distributed (gloo) processes: a tiny DDP update loop, profiled on chosen ranks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import instrument as ins
from instrument.naming import parse_trace_name
from tests.conftest import event_names, load_trace, without_timeline

pytestmark = pytest.mark.slow

WORLD = 4
HANG_GUARD_S = 600.0  # ranks still running after this are killed and the test fails


def _worker(rank: int, save: str, rendezvous: str, crash_rank: int) -> None:
    """One torchrun-style rank: rank and world size come from torch.distributed, not from arguments."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    marker = str(Path(save).parent / "hook-rank$INSTRUMENT_PROFILE_RANK")
    cfg = ins.ProfilerConfig(
        save_path=save,
        contents=("cpu",),
        steps=(1, 3),
        ranks=(0, 2),
        schedule=ins.Schedule(warmup=1, active=2),
        finish_hook=ins.FinishHook(
            cmd=f'echo "$INSTRUMENT_PROFILE_PID" >> "{marker}"; ls "$INSTRUMENT_PROFILE_SAVE_PATH" >> "{marker}.ls"',
            ranks=(0, 3),
        ),
    )
    session = ins.configure(cfg, role="actor")
    assert (session.rank, session.world_size) == (rank, WORLD)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    @ins.profiled_stage("update_actor", scheduled=True)
    def update(step: int) -> None:
        for i in range(4):
            with ins.profile_window(mini_batch=i):
                optimizer.zero_grad()
                model(torch.randn(4, 8)).pow(2).mean().backward()  # all-reduce over gloo
                optimizer.step()
                if rank == crash_rank and step == 3 and i == 2:
                    raise SystemExit(3)  # this rank dies mid-window

    for step in (1, 2, 3):
        with ins.profile_step(step, last=(step == 3)):
            update(step)
    ins.finish()
    dist.destroy_process_group()


def _spawn(tmp_path: Path, crash_rank: int = -1) -> tuple[Path, list[int], BaseException | None]:
    """Run the ranks; returns the save path, each rank's exit code and the launcher's error, if any."""
    save = tmp_path / "profile"
    context = mp.spawn(_worker, args=(str(save), str(tmp_path / "rendezvous"), crash_rank), nprocs=WORLD, join=False)
    assert context is not None
    guard = time.monotonic() + HANG_GUARD_S
    error = None
    try:
        while not context.join(timeout=1):
            if time.monotonic() > guard:  # a hang guard only: the assertions below are about behaviour
                for process in context.processes:
                    process.kill()
                pytest.fail(f"the ranks were still running after {HANG_GUARD_S:g} s")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        error = exc  # the launcher has stopped and joined the other ranks by now
    codes = [process.exitcode for process in context.processes]
    assert None not in codes, codes
    return save, [code for code in codes if code is not None], error


def test_gloo_ranks_profile_chosen_steps_and_the_hook_runs_once_per_chosen_rank(tmp_path: Path) -> None:
    save, codes, error = _spawn(tmp_path)
    assert error is None and codes == [0] * WORLD
    files = sorted(save.glob("*.pt.trace.json.gz"))
    names = [parse_trace_name(p.name) for p in files]
    assert sorted((n.step, n.rank, n.world_size, n.window) for n in names if n) == [
        (1, 0, 4, (1, 2)),
        (1, 2, 4, (1, 2)),
        (3, 0, 4, (1, 2)),
        (3, 2, 4, (1, 2)),
    ]
    assert len({n.pid for n in names if n}) == 2  # two processes wrote them
    for path, name in zip(files, names, strict=True):
        info = load_trace(path)["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", name.rank, 4)  # type: ignore[union-attr]
        assert {"mini_batch1", "mini_batch2"} <= event_names(path)
    markers = sorted(p.name for p in tmp_path.glob("hook-rank*") if p.suffix != ".ls")
    assert markers == ["hook-rank0", "hook-rank3"]
    assert all(len((tmp_path / m).read_text().split()) == 1 for m in markers)
    # The ranks meet before the hook: rank 0's hook already sees rank 2's last trace.
    assert sorted(p for p in (tmp_path / "hook-rank0.ls").read_text().split() if p.endswith(".gz")) == sorted(
        p.name for p in files
    )


def test_a_rank_dying_mid_window_leaves_the_other_ranks_traces(tmp_path: Path) -> None:
    save, codes, error = _spawn(tmp_path, crash_rank=2)
    assert error is not None  # the launcher sees the dead rank
    assert codes[2] == 3  # it ended by its own exit, first; the launcher then sent the others SIGTERM
    assert -signal.SIGKILL not in codes  # no rank hung on after SIGTERM (the launcher kills after 30 s)
    names = [parse_trace_name(p.name) for p in save.glob("*.pt.trace.json.gz")]
    got = {(n.step, n.rank, n.window, n.partial) for n in names if n}
    # Rank 2 died in mini-batch 2 of step 3, after its all-reduce: window 1-2 closed at the
    # window's exit on every rank; the survivors were then stopped by the launcher in mini-batch 3.
    assert {(1, 0, (1, 2), False), (1, 2, (1, 2), False), (3, 2, (1, 2), False)} <= got
    for path in save.glob("*.pt.trace.json.gz"):
        load_trace(path)  # every published trace is whole
    visible = without_timeline(p for p in os.listdir(save) if not p.startswith("."))  # temporaries are hidden
    assert all(p.endswith((".pt.trace.json.gz", ".jsonl")) for p in visible), visible
