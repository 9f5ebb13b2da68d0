"""hydra's override forms: ``+key=v`` adds, ``++key=v`` adds or replaces, ``~key`` deletes (issue 25)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import cli
from instrument.config import ProfilerConfig, Schedule
from instrument.config._cli import load_config
from instrument.config._overrides import ADD, DELETE, FORCE, SET, Override, split_override


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("steps=[1]", Override(SET, "steps", "[1]")),
        ("+steps=[1]", Override(ADD, "steps", "[1]")),
        ("++steps=[1]", Override(FORCE, "steps", "[1]")),
        ("~schedule", Override(DELETE, "schedule", None)),
        ("~tool=nvtx", Override(DELETE, "tool", "nvtx")),
        ("finish_hook.cmd=a=b", Override(SET, "finish_hook.cmd", "a=b")),
    ],
)
def test_forms_split(text: str, split: Override) -> None:
    assert split_override(text) == split


@pytest.mark.parametrize("text", ["steps", "+steps", "+++steps=1", "~", "~~steps", "=1", "+=1"])
def test_malformed_overrides_are_named(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        ProfilerConfig.from_overrides([text])


def test_add_sets_a_key_that_is_not_set() -> None:
    assert ProfilerConfig.from_overrides(["+steps=[2]", "+schedule.active=2"]) == ProfilerConfig(
        steps=(2,), schedule=Schedule(active=2)
    )
    with pytest.raises(ValueError, match=r"'\+steps=\[3\]' adds 'steps', which is already set; '\+\+steps=...'"):
        ProfilerConfig.from_overrides(["+steps=[3]"], base={"steps": [2]})
    with pytest.raises(ValueError, match=r"adds 'schedule', which is already set"):
        ProfilerConfig.from_overrides(["+schedule=null"], base={"schedule": {"active": 2}})


def test_force_adds_or_replaces() -> None:
    assert ProfilerConfig.from_overrides(["++steps=[3]"], base={"steps": [2]}).steps == (3,)
    assert ProfilerConfig.from_overrides(["++steps=[3]"]).steps == (3,)


def test_delete_removes_a_key_and_what_lies_below() -> None:
    base = {"steps": [2], "schedule": {"active": 2, "wait": 1}, "global_profiler": {"steps": [5]}}
    assert ProfilerConfig.from_overrides(["~schedule"], base=base).schedule is None
    assert ProfilerConfig.from_overrides(["~schedule.wait"], base=base).schedule == Schedule(active=2)
    assert ProfilerConfig.from_overrides(["~steps=[2]"], base=base).steps == (5,)  # the verl key is left
    # a key not set is deleted already (verl's base may hold it; this one need not)
    assert ProfilerConfig.from_overrides(["~actor_rollout_ref.actor.profiler.tool_config.npu"]) == ProfilerConfig()
    with pytest.raises(ValueError, match=r"'~steps=\[3\]' deletes 'steps' only while it is set to that value: \[2\]"):
        ProfilerConfig.from_overrides(["~steps=[3]"], base=base)


def test_typos_are_still_named_in_every_form() -> None:
    for text in ("+stpes=[1]", "++stpes=[1]", "~stpes"):
        with pytest.raises(ValueError, match=r"^unknown configuration key 'stpes'; did you mean 'steps'\?$"):
            ProfilerConfig.from_overrides([text])


def test_verl_command_lines_move_over() -> None:
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1]",
        "++actor_rollout_ref.actor.profiler.enable=True",
        "+actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2",
        "~actor_rollout_ref.actor.profiler.tool_config.npu",
        "trainer.total_epochs=3",  # verl's other settings are skipped
    ]
    cfg = ProfilerConfig.from_overrides(overrides, role="actor")
    assert (cfg.active, cfg.steps, cfg.schedule) == (True, (1,), Schedule(active=2))


def test_the_clis_take_the_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"steps": [1, 2], "schedule": {"active": 2}}))
    assert load_config(path, ["~schedule", "++steps=[3]", "+ranks=[1]"]) == ProfilerConfig(steps=(3,), ranks=(1,))
    with pytest.raises(ValueError, match=r"adds 'steps', which is already set"):
        load_config(path, ["+steps=[3]"])
    assert cli.main(["plan", "--config", str(path), "--num-steps", "2", "--world-size", "2", "~schedule"]) == 0
    assert capsys.readouterr().out


_KEYS = ["steps", "ranks", "schedule.active", "schedule.wait", "metrics"]
_VALUES = {"steps": "[1,2]", "ranks": "[0,1]", "schedule.active": "2", "schedule.wait": "1", "metrics": "true"}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "++", "~"]), st.sampled_from(_KEYS)), max_size=8))
def test_force_and_delete_mean_set_and_unset(ops: list[tuple[str, str]]) -> None:
    """``++k=v`` is ``k=v``; ``~k`` is as if ``k`` (and what lies below) had never been set."""
    overrides, state = [], {}
    for op, key in ops:
        if op == "~":
            overrides.append(f"~{key}")
            for existing in [k for k in state if k == key or k.startswith(key + ".")]:
                del state[existing]
        else:
            overrides.append(f"{op}{key}={_VALUES[key]}")
            state[key] = _VALUES[key]
    expected = ProfilerConfig.from_overrides([f"{k}={v}" for k, v in state.items()])
    assert ProfilerConfig.from_overrides(overrides) == expected
