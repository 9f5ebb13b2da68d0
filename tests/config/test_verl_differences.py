"""Where instrument deliberately differs from verl 0.9.1, and keeps its own behaviour (docs/config.md)."""

from __future__ import annotations

import pytest

from instrument import schedule as sched
from instrument.config import ProfilerConfig, Schedule

ACTOR = "actor_rollout_ref.actor.profiler"
CRITIC = "critic.profiler"


@pytest.mark.parametrize(
    ("n", "schedule", "windows"),
    [
        # verl: after the last window's RECORD_AND_SAVE the next cycle starts recording, and stop() saves
        # that empty window under the last real window's name (_mb2-3), overwriting it.
        (4, Schedule(active=2, repeat=0), [(0, 1), (2, 3)]),
        (6, Schedule(wait=1, active=2, repeat=0), [(1, 2), (4, 5)]),
        # verl names an extra window for a loop that ends in a cycle's warmup; nothing was recorded there.
        (3, Schedule(warmup=1, active=1, repeat=0), [(1, 1)]),
    ],
)
def test_a_loop_ending_at_a_window_boundary_saves_its_windows_once(
    n: int, schedule: Schedule, windows: list[tuple[int, int]]
) -> None:
    planned = sched.plan(n, schedule)
    assert [(w.first, w.last) for w in planned] == windows
    assert not any(w.partial for w in planned)


def test_union_keeps_rank_0_that_an_empty_ranks_list_meant() -> None:
    """verl's ``ProfilerConfig.union`` joins the raw lists: ``[] | [3]`` is ``[3]``, losing rank 0 that ``[]`` meant."""
    mapping = {
        "global_profiler": {"tool": "torch", "steps": [1]},
        ACTOR: {"enable": True, "ranks": []},
        CRITIC: {"enable": True, "ranks": [3]},
    }
    assert ProfilerConfig.from_dict(mapping).ranks == (0, 3)
    actor = ProfilerConfig.from_dict(mapping, role="actor")
    critic = ProfilerConfig.from_dict(mapping, role="critic")
    assert actor.union(critic).ranks == (0, 3)
    assert actor.intersect(critic).active is False  # no common rank: nothing, not a silent rank 0


def test_two_hook_commands_are_not_merged_silently() -> None:
    """verl's union / intersect keep the first command and drop the other; here it is an error naming both."""
    mapping = {
        "global_profiler": {"tool": "torch", "steps": [1]},
        ACTOR: {"enable": True, "finish_hook_cmd": "a.sh"},
        CRITIC: {"enable": True, "finish_hook_cmd": "b.sh"},
    }
    actor = ProfilerConfig.from_dict(mapping, role="actor")
    critic = ProfilerConfig.from_dict(mapping, role="critic")
    for combine in (actor.union, actor.intersect):
        with pytest.raises(ValueError, match=r"'finish_hook.cmd' differs \('a.sh' vs 'b.sh'\)"):
            combine(critic)
    with pytest.raises(ValueError, match=r"cannot be combined.*'finish_hook.cmd' differs"):
        ProfilerConfig.from_dict(mapping)
