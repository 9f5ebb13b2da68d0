"""The step timeline across real torch.distributed (gloo) processes in a disaggregated layout.

Ranks 0-1 are actors, ranks 2-3 rollout. Each step the rollout ranks generate (rank 3 five times
longer than rank 2) while the actors wait in a barrier outside any stage; then the actors update
while the rollout ranks wait. The durations come from sleeps, so they are lower bounds: a busy
machine can only stretch them, and the margins below hold as long as rank 3's generation stays
longer than rank 2's by 1.2x and the actors' wait covers most of it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.distributed as dist

import instrument as ins
from instrument.analyze import analyze
from tests.conftest import spawn_ranks

pytestmark = pytest.mark.slow

WORLD = 4
STEPS = 3
GENERATE_S = {2: 0.1, 3: 0.5}  # rank 3 is the slow rollout rank
UPDATE_S = 0.1


def _rank(rank: int, save: str, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    role = "actor" if rank < 2 else "rollout"
    ins.configure(ins.ProfilerConfig(save_path=save, tool="none"), role=role)

    @ins.profiled_stage("generate_sequences")
    def generate() -> None:
        time.sleep(GENERATE_S[rank])

    @ins.profiled_stage("update_actor")
    def update() -> None:
        time.sleep(UPDATE_S)

    for step in range(1, STEPS + 1):
        with ins.profile_step(step):
            if role == "rollout":
                generate()
            dist.barrier()  # the actors wait here, outside any stage, for the slowest generation
            if role == "actor":
                update()
            dist.barrier()  # the rollout ranks wait here for the update
    ins.finish()
    dist.destroy_process_group()


def test_idle_waits_critical_path_and_the_straggler_across_real_ranks(tmp_path: Path) -> None:
    save = tmp_path / "profile"
    spawn_ranks(_rank, (str(save), str(tmp_path / "rendezvous")), nprocs=WORLD)
    data = analyze(save, jobs=1).to_dict()

    timeline = data["timeline"]
    assert timeline["clock"]["aligned"] is True  # one host: one clock
    assert [s["step"] for s in timeline["steps"]] == [1, 2, 3]
    for step in timeline["steps"]:
        assert step["wall_ms"] >= (GENERATE_S[3] + UPDATE_S) * 1000
        ranks = {r["rank"]: r for r in step["ranks"]}
        for actor in (0, 1):
            # Idle at least most of rank 3's generation, and it waited for rank 3's generate_sequences.
            assert ranks[actor]["idle_ms"] >= 0.8 * GENERATE_S[3] * 1000
            cause = max(ranks[actor]["waited_for"], key=lambda w: w["ms"])
            assert (cause["role"], cause["stage"], cause["rank"]) == ("rollout", "generate_sequences", 3)
        assert step["roles"]["actor"]["idle_pct"] > 50
        # The critical path runs through rank 3's generation, then an actor's update, and adds up.
        path = [(p["role"], p["stage"], p["rank"]) for p in step["critical_path"] if p["stage"] != "idle"]
        assert ("rollout", "generate_sequences", 3) in path
        assert path.index(("rollout", "generate_sequences", 3)) < max(
            i for i, part in enumerate(path) if part[:2] == ("actor", "update_actor")
        )
        assert sum(p["ms"] for p in step["critical_path"]) == pytest.approx(step["wall_ms"], abs=0.01)

    stragglers = [f for f in data["findings"] if f["kind"] == "straggler"]
    assert [(f["role"], f["stage"], f["rank"]) for f in stragglers] == [("rollout", "generate_sequences", 3)]
    assert sorted(stragglers[0]["steps"]) == [1, 2, 3]
    assert [f["lost_ms"] for f in data["findings"]] == sorted((f["lost_ms"] for f in data["findings"]), reverse=True)
