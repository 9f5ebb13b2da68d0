"""``dialect``: a configuration in verl's keys carries verl's rules; instrument's own keys keep instrument's."""

from __future__ import annotations

import pytest

from instrument.config import ProfilerConfig, Schedule
from instrument.plan import plan_run
from instrument.schedule import Window

ACTOR = "actor_rollout_ref.actor.profiler"
VERL = ["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{ACTOR}.enable=True"]


def test_instruments_own_keys_are_instruments_dialect() -> None:
    assert ProfilerConfig().dialect == "instrument"
    assert ProfilerConfig.from_overrides(["steps=[1]", "discrete=false"]).dialect == "instrument"
    assert not ProfilerConfig().keep_engine_peers


@pytest.mark.parametrize("role", [None, "actor", "rollout", "ref", "critic", "actor_rollout_ref"])
def test_any_verl_key_brings_verls_dialect(role: str | None) -> None:
    assert ProfilerConfig.from_overrides(VERL, role=role).dialect == "verl"


def test_the_dialect_may_be_set_either_way() -> None:
    over_verl = ProfilerConfig.from_overrides([*VERL, "dialect=instrument"], role="rollout")
    assert (over_verl.dialect, over_verl.discrete) == ("instrument", False)  # verl's defaults stay
    assert ProfilerConfig.from_dict({"steps": [1], "dialect": "verl"}).dialect == "verl"
    with pytest.raises(ValueError, match=r"^'dialect' must be one of 'instrument', 'verl': 'hydra'$"):
        ProfilerConfig(dialect="hydra")


def test_verls_empty_ranks_keep_the_engine_peers_and_named_ranks_do_not() -> None:
    empty = ProfilerConfig.from_overrides(VERL, role="rollout")
    assert (empty.ranks, empty.keep_engine_peers) == ((0,), True)
    named = ProfilerConfig.from_overrides([*VERL, f"{ACTOR}.ranks=[0]"], role="rollout")
    assert (named.ranks, named.keep_engine_peers) == ((0,), False)


def test_dialect_and_peers_survive_a_round_trip() -> None:
    cfg = ProfilerConfig.from_overrides(VERL, role="rollout")
    assert ProfilerConfig.from_overrides(cfg.to_overrides()) == cfg
    assert ProfilerConfig.from_dict(cfg.to_dict()) == cfg


def test_configurations_of_two_dialects_do_not_combine() -> None:
    verl = ProfilerConfig.from_overrides([*VERL, "discrete=true"], role="actor")
    with pytest.raises(ValueError, match=r"'dialect' differs \('verl' vs 'instrument'\)"):
        verl.union(ProfilerConfig(steps=(1,)))
    peers = ProfilerConfig(keep_engine_peers=True)
    assert ProfilerConfig().union(peers).keep_engine_peers
    assert not ProfilerConfig().intersect(peers).keep_engine_peers


@pytest.mark.parametrize("given", ["verl keys", "native keys"])
def test_verls_continuous_repeat_0_is_one_window_however_it_is_written(given: str) -> None:
    """verl 0.9.1 gives its continuous trace ``repeat or 1`` (``_resolve_continuous_schedule_kwargs``)."""
    torch = f"{ACTOR}.tool_config.torch"
    if given == "verl keys":
        cfg = ProfilerConfig.from_overrides([*VERL, f"{torch}.schedule.active=2", f"{torch}.schedule.repeat=0"])
    else:
        cfg = ProfilerConfig(dialect="verl", discrete=False, steps=(1,), schedule=Schedule(active=2, repeat=0))
    assert cfg.schedule == Schedule(active=2, repeat=1)
    assert list(plan_run(cfg, num_steps=1, world_size=1, num_mini_batches=6).windows) == [Window(0, 1)]


def test_repeat_0_keeps_its_meaning_where_verl_keeps_it() -> None:
    """Discrete windows take the schedule as written (unbounded), in verl's dialect too; instrument's own
    continuous steps are whole, so their schedule is left as given."""
    for cfg in (
        ProfilerConfig(dialect="verl", discrete=True, steps=(1,), schedule=Schedule(active=2, repeat=0)),
        ProfilerConfig(discrete=False, steps=(1,), schedule=Schedule(active=2, repeat=0)),
    ):
        assert cfg.schedule is not None and cfg.schedule.repeat == 0
