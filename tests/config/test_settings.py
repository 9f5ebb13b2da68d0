"""ProfilerConfig, Schedule and FinishHook: validation messages, building, verl keys, union / intersect."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.config import CONTENTS, FinishHook, MemorySnapshots, ProfilerConfig, Schedule, SlowStep, parse_value
from instrument.config._memory import MEMORY_CONTEXTS, MEMORY_STACKS

# --------------------------------------------------------------------------- validation messages


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"active": 0},
            ValueError,
            "'schedule.active' must be >= 1: 0; schedule=None records every mini-batch of the stage",
        ),
        ({"wait": -1}, ValueError, "'schedule.wait' must be >= 0: -1"),
        ({"warmup": -2}, ValueError, "'schedule.warmup' must be >= 0: -2"),
        ({"skip_first": -1}, ValueError, "'schedule.skip_first' must be >= 0: -1"),
        ({"repeat": -1}, ValueError, "'schedule.repeat' must be >= 0: -1"),
        ({"wait": 1.5}, TypeError, "'schedule.wait' must be an int >= 0: 1.5"),
        ({"active": "2"}, TypeError, "'schedule.active' must be an int >= 1: '2'"),
        ({"active": True}, TypeError, "'schedule.active' must be an int >= 1: True"),
        ({"skip_first_wait": 1}, TypeError, "'skip_first_wait' must be true or false: 1"),
    ],
)
def test_schedule_rejects(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Schedule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"tool": "pytorch"},
            ValueError,
            "'tool' must be one of 'none', 'nvtx', 'torch', 'torch_memory', or recorder names joined by '+': 'pytorch'",
        ),
        (
            {"tool": "torch+torch_memory+perf"},
            ValueError,
            "'tool' joins recorders with '+': 'perf' in 'torch+torch_memory+perf' is not one of 'nvtx', 'torch', "
            "'torch_memory'",
        ),
        ({"tool": "torch+torch"}, ValueError, "'tool' must name each recorder once: 'torch' is twice in 'torch+torch'"),
        ({"tool": "none+nvtx"}, ValueError, "'tool' cannot combine 'none' with recorders: 'none+nvtx'"),
        ({"steps": [0]}, ValueError, "'steps' must hold values >= 1: 0"),
        ({"steps": [2, -1]}, ValueError, "'steps' must hold values >= 1: -1"),
        ({"steps": []}, ValueError, "'steps' must list at least one step, or be null for every step: []"),
        ({"steps": [1.0]}, TypeError, "'steps' must be a list of ints or null: (1.0,)"),
        ({"steps": "1,2"}, TypeError, "'steps' must be a list of ints or null: '1,2'"),
        ({"ranks": [0, 3, 3]}, ValueError, "'ranks' must not repeat a value: [3] given more than once"),
        ({"ranks": [-1]}, ValueError, "'ranks' must hold values >= 0: -1"),
        ({"ranks": []}, ValueError, "'ranks' must select at least one rank unless 'all_ranks' is true: []"),
        (
            {"contents": ["cpu", "gpu"]},
            ValueError,
            "'contents' items must be among 'cpu', 'cuda', 'memory', 'shapes', 'stack': 'gpu'",
        ),
        ({"save_path": ""}, ValueError, "'save_path' must be a non-empty path: ''"),
        ({"discrete": "yes"}, TypeError, "'discrete' must be true or false: 'yes'"),
        ({"enable": None}, TypeError, "'enable' must be true or false: None"),
        ({"schedule": 3}, TypeError, "'schedule' must be a Schedule, a mapping or null: 3"),
        ({"schedule": {"activ": 2}}, ValueError, "unknown configuration key 'schedule.activ'; did you mean"),
        ({"finish_hook": {"cmd": "  "}}, ValueError, "'cmd' must be a non-empty shell command: '  '"),
        ({"finish_hook": {"cmd": ["ls"]}}, TypeError, "'cmd' must be a shell command string: ['ls']"),
        ({"trigger": {"factor": 1}}, ValueError, "'factor' must be a finite number > 1: 1"),
        ({"trigger": {"window": 1}}, ValueError, "'window' must be >= 2: 1"),
        ({"max_triggered": -1}, ValueError, "'max_triggered' must be >= 0: -1"),
        ({"token_window": [5, 2]}, ValueError, "'token_window' must satisfy 0 <= first <= last: [5, 2]"),
        ({"token_window": 5}, TypeError, "'token_window' must be a [first, last] pair of engine iterations or null: 5"),
        ({"memory": {"max_entries": 0}}, ValueError, "'max_entries' must be >= 1: 0"),
        ({"memory": {"stack_depth": "32"}}, TypeError, "'stack_depth' must be an int >= 1: '32'"),
        ({"memory": {"context": "free"}}, ValueError, "'context' must be one of 'all', 'alloc', 'state': 'free'"),
        ({"memory": {"stacks": "cpp"}}, ValueError, "'stacks' must be one of 'python', 'all': 'cpp'"),
        ({"memory": {"on_oom": 1}}, TypeError, "'on_oom' must be true or false: 1"),
        ({"memory": {"oom_max_snapshots": 0}}, ValueError, "'oom_max_snapshots' must be >= 1: 0"),
        ({"memory": {"max_bytes": 1000}}, ValueError, "'max_bytes' must be >= 1048576: 1000"),
        ({"memory": {"max_entrys": 5}}, ValueError, "unknown configuration key 'memory.max_entrys'; did you mean"),
        ({"memory": 5}, TypeError, "'memory' must be a MemorySnapshots, a mapping or null: 5"),
    ],
)
def test_profiler_config_rejects(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        ProfilerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan])
def test_finish_hook_rejects_non_positive_timeout(timeout: float) -> None:
    with pytest.raises(ValueError, match=r"^'timeout_s' must be a finite number of seconds > 0: "):
        FinishHook(cmd="true", timeout_s=timeout)


def test_finish_hook_rejects_bad_types_and_empty_selection() -> None:
    with pytest.raises(TypeError, match="'timeout_s' must be a number of seconds > 0: True"):
        FinishHook(cmd="true", timeout_s=True)
    with pytest.raises(ValueError, match="'ranks' must not repeat a value"):
        FinishHook(cmd="true", ranks=(1, 1))
    with pytest.raises(ValueError, match=r"'finish_hook\.ranks' must select at least one rank"):
        FinishHook(cmd="true", ranks=())
    assert FinishHook(cmd="true", ranks=(), all_ranks=True).all_ranks


def test_defaults_match_design() -> None:
    assert Schedule() == Schedule(skip_first=0, wait=0, warmup=0, active=1, repeat=1, skip_first_wait=False)
    cfg = ProfilerConfig()
    assert (cfg.enable, cfg.tool, cfg.steps, cfg.ranks, cfg.save_path) == (True, "torch", None, (0,), "outputs/profile")
    assert (cfg.all_ranks, cfg.discrete, cfg.contents) == (False, True, ("cpu", "cuda"))
    assert (cfg.schedule, cfg.relocate_results, cfg.finish_hook) == (None, True, None)
    assert FinishHook(cmd="true").timeout_s == 600


def test_values_are_normalised_and_frozen(tmp_path: Path) -> None:
    cfg = ProfilerConfig(steps=[3, 1], ranks={2, 0}, contents=["stack", "cpu"], save_path=tmp_path)
    assert cfg.steps == (1, 3)
    assert cfg.ranks == (0, 2)
    assert cfg.contents == ("cpu", "stack")
    assert cfg.save_path == str(tmp_path)
    assert ProfilerConfig(steps=4, ranks=1).steps == (4,)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.tool = "nvtx"  # type: ignore[misc]


def test_disabled_config_may_select_nothing() -> None:
    cfg = ProfilerConfig(enable=False, ranks=[])
    assert not cfg.active
    assert not cfg.profiles_step(1)
    assert not cfg.profiles_rank(0)
    assert not ProfilerConfig(tool="none").active


def test_profiles_step_and_rank() -> None:
    cfg = ProfilerConfig(steps=[2], ranks=[1, 3])
    assert [cfg.profiles_step(s) for s in (1, 2, 3)] == [False, True, False]
    assert [cfg.profiles_rank(r) for r in range(4)] == [False, True, False, True]
    assert ProfilerConfig(all_ranks=True, ranks=[]).profiles_rank(999)
    assert ProfilerConfig().profiles_step(12345)


# --------------------------------------------------------------------------- from_dict / from_overrides


def test_from_dict_nested_and_dotted() -> None:
    nested = ProfilerConfig.from_dict(
        {"steps": [1, 2], "schedule": {"warmup": 1, "active": 2}, "finish_hook": {"cmd": "echo hi", "ranks": [1]}}
    )
    dotted = ProfilerConfig.from_dict(
        {
            "steps": [1, 2],
            "schedule.warmup": 1,
            "schedule.active": 2,
            "finish_hook.cmd": "echo hi",
            "finish_hook.ranks": [1],
        }
    )
    assert nested == dotted
    assert nested.schedule == Schedule(warmup=1, active=2)
    assert nested.finish_hook == FinishHook(cmd="echo hi", ranks=(1,))
    assert ProfilerConfig.from_dict({"schedule": {}}).schedule == Schedule()


def test_unknown_keys_suggest_the_closest() -> None:
    with pytest.raises(ValueError, match=r"unknown configuration key 'savepath'; did you mean 'save_path'\?"):
        ProfilerConfig.from_dict({"savepath": "x"})
    with pytest.raises(ValueError, match=r"did you mean 'schedule.active'\?"):
        ProfilerConfig.from_overrides(["schedule.actve=2"])
    with pytest.raises(ValueError, match=r"did you mean 'finish_hook.timeout_s'\?"):
        ProfilerConfig.from_overrides(["finish_hook.timeout=2"])
    with pytest.raises(ValueError, match="valid keys: "):
        ProfilerConfig.from_dict({"zzzzzz": 1})


def test_from_overrides_parses_values() -> None:
    cfg = ProfilerConfig.from_overrides(
        [
            "steps=[1, 2]",
            "schedule.active=2",
            "schedule.skip_first_wait=true",
            "discrete=false",
            "contents=[cpu,'stack']",
            'finish_hook.cmd=tar czf /tmp/p.tgz -C "$INSTRUMENT_PROFILE_SAVE_PATH" . && echo a=b',
            "finish_hook.timeout_s=2.5",
            "tool=none",
        ]
    )
    assert cfg.steps == (1, 2)
    assert cfg.schedule == Schedule(active=2, skip_first_wait=True)
    assert cfg.discrete is False
    assert cfg.contents == ("cpu", "stack")
    assert cfg.finish_hook is not None
    assert cfg.finish_hook.cmd == 'tar czf /tmp/p.tgz -C "$INSTRUMENT_PROFILE_SAVE_PATH" . && echo a=b'
    assert cfg.finish_hook.timeout_s == 2.5
    assert cfg.tool == "none"


def test_from_overrides_later_wins_and_applies_over_base() -> None:
    base = {"steps": [1], "schedule": {"active": 3}}
    cfg = ProfilerConfig.from_overrides(["steps=[5]", "schedule.wait=1", "steps=[6]"], base=base)
    assert cfg.steps == (6,)
    assert cfg.schedule == Schedule(wait=1, active=3)
    assert ProfilerConfig.from_overrides(["schedule=null"], base=base).schedule is None


@pytest.mark.parametrize("bad", ["steps", "=3", "steps=[1,'2]"])
def test_from_overrides_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        ProfilerConfig.from_overrides([bad])


def test_from_overrides_rejects_a_single_string() -> None:
    with pytest.raises(TypeError, match="list of 'key=value' strings"):
        ProfilerConfig.from_overrides("steps=[1]")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("-2", -2),
        ("2.5", 2.5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("~", None),
        ("'007'", "007"),
        ("x y", "x y"),
        ("[]", []),
        ("[1, 2 ,3]", [1, 2, 3]),
        ("[a, 'b,c', \"d\"]", ["a", "b,c", "d"]),
    ],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_parse_value_refuses_mappings() -> None:
    with pytest.raises(ValueError, match="set key by key"):
        parse_value("{active: 2}")


_labels = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30).filter(
    lambda s: s.strip() != ""
)


def _not_a_file(label: str) -> bool:
    """A save_path that names an existing file (``/proc/self/stat``: hypothesis draws constants of the source)
    is rightly refused; the round trip is about the values, not that check."""
    try:
        return not Path(label).exists() or Path(label).is_dir()
    except (OSError, ValueError):
        return True


_schedules = st.builds(
    Schedule,
    skip_first=st.integers(0, 5),
    wait=st.integers(0, 5),
    warmup=st.integers(0, 5),
    active=st.integers(1, 5),
    repeat=st.integers(0, 3),
    skip_first_wait=st.booleans(),
)
_hooks = st.builds(
    FinishHook,
    cmd=_labels,
    ranks=st.lists(st.integers(0, 16), min_size=1, max_size=4, unique=True),
    all_ranks=st.booleans(),
    timeout_s=st.one_of(st.integers(1, 10_000), st.floats(0.001, 1e6)),
)


_memories = st.builds(
    MemorySnapshots,
    max_entries=st.integers(1, 10**7),
    stack_depth=st.integers(1, 128),
    context=st.sampled_from(MEMORY_CONTEXTS),
    stacks=st.sampled_from(MEMORY_STACKS),
    on_oom=st.booleans(),
    oom_max_snapshots=st.integers(1, 5),
    max_bytes=st.integers(1 << 20, 1 << 40),
)


@st.composite
def _configs(draw: st.DrawFn, tool: str | None = None, save_path: str | None = None) -> ProfilerConfig:
    return ProfilerConfig(
        enable=draw(st.booleans()) if tool is None else True,
        tool=tool or draw(st.sampled_from(["torch", "nvtx", "none", "torch_memory", "torch+torch_memory"])),
        steps=draw(st.none() | st.lists(st.integers(1, 30), min_size=1, max_size=5, unique=True)),
        ranks=draw(st.lists(st.integers(0, 16), min_size=1, max_size=5, unique=True)),
        save_path=save_path or draw(_labels.filter(_not_a_file)),
        all_ranks=draw(st.booleans()),
        discrete=draw(st.booleans()) if tool is None else True,
        contents=draw(st.lists(st.sampled_from(CONTENTS), unique=True)),
        schedule=draw(st.none() | _schedules) if tool is None else None,
        relocate_results=draw(st.booleans()),
        finish_hook=draw(st.none() | _hooks) if tool is None else None,
        token_window=draw(st.none() | st.tuples(st.integers(0, 9), st.integers(10, 99))) if tool is None else None,
        metrics=draw(st.booleans()),
        metrics_rank_label=draw(st.booleans()),
        trigger=draw(st.none() | st.builds(SlowStep, factor=st.floats(1.01, 10), window=st.integers(2, 50)))
        if tool is None
        else None,
        on_demand=draw(st.booleans()),
        max_triggered=draw(st.integers(0, 9)),
        memory=draw(st.none() | _memories) if tool is None else None,
    )


@settings(max_examples=300)
@given(_configs())
def test_overrides_and_dict_round_trip(cfg: ProfilerConfig) -> None:
    assert ProfilerConfig.from_overrides(cfg.to_overrides()) == cfg
    assert ProfilerConfig.from_dict(cfg.to_dict()) == cfg


# --------------------------------------------------------------------------- verl keys


def _verl_yaml_defaults() -> dict[str, object]:
    """verl's ppo_trainer.yaml profiler sections, as shipped (verl-project/verl, Aug 2026)."""
    return {
        "global_profiler": {
            "tool": None,
            "steps": None,
            "profile_continuous_steps": False,
            "save_path": "outputs/profile",
            "relocate_results": False,
            "finish_hook_cmd": None,
            "finish_hook_all_ranks": False,
            "finish_hook_ranks": [],
            "global_tool_config": {
                "nsys": {"discrete": False, "worker_nsight_options": {"capture-range": "cudaProfilerApi"}},
                "torch_memory": {"trace_alloc_max_entries": 100_000, "stack_depth": 32},
            },
        },
        "profiler": {
            "enable": False,
            "all_ranks": False,
            "ranks": [],
            "tool_config": {
                "torch": {
                    "contents": [],
                    "discrete": False,
                    "schedule": {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0},
                },
                "npu": {"contents": [], "level": "level0"},
            },
        },
    }


def test_verl_defaults_move_over_as_profiling_off() -> None:
    with pytest.warns(UserWarning, match="profile_continuous_steps"):
        cfg = ProfilerConfig.from_dict(_verl_yaml_defaults())
    assert not cfg.active
    assert cfg.schedule is None
    assert cfg.finish_hook is None


def test_verl_settings_move_over_unchanged() -> None:
    verl = {
        "global_profiler": {"tool": "torch", "steps": [1, 3], "save_path": "/p", "finish_hook_cmd": "upload.sh"},
        "profiler": {
            "enable": True,
            "ranks": [0, 4],
            "tool_config": {
                "torch": {
                    "contents": ["cuda", "cpu", "shapes"],
                    "discrete": True,
                    "schedule": {"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
                }
            },
        },
    }
    cfg = ProfilerConfig.from_dict(verl)
    assert cfg == ProfilerConfig(
        tool="torch",
        steps=(1, 3),
        save_path="/p",
        ranks=(0, 4),
        contents=("cpu", "cuda", "shapes"),
        discrete=True,
        schedule=Schedule(wait=1, warmup=1, active=2, repeat=1),
        relocate_results=False,  # verl's default
        # verl runs the hook on the profiled ranks when finish_hook_ranks is empty
        finish_hook=FinishHook(cmd="upload.sh", ranks=(0, 4)),
        dialect="verl",  # verl's rules where the two differ
    )


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        (["global_profiler.tool=nsys"], "tool", "nvtx"),
        (["profiler.tool=null"], "tool", "none"),
        (["global_profiler.steps=null"], "enable", False),
        (["global_profiler.steps=[2,4]"], "steps", (2, 4)),
        (["profiler.ranks=[]"], "ranks", (0,)),
        (["profiler.all_ranks=true"], "all_ranks", True),
        (["global_profiler.tool=torch", "tool_config.torch.contents=[]"], "contents", ("cpu", "cuda")),
        # verl records CPU activity whatever contents says, CUDA only when it is named or contents is empty
        (["global_profiler.tool=torch", "tool_config.torch.contents=[stack]"], "contents", ("cpu", "stack")),
        (["global_profiler.tool=nsys", "tool_config.nsys.discrete=false"], "discrete", False),
        (["global_profiler.tool=nsys", "global_tool_config.nsys.discrete=false"], "discrete", False),
        # only the selected tool's settings apply
        (["global_profiler.tool=torch", "tool_config.nsys.discrete=true"], "discrete", False),
        (["global_profiler.relocate_results=false"], "relocate_results", False),
        (["tool_config.torch.schedule.active=0", "tool_config.torch.schedule.wait=3"], "schedule", None),
        (["global_profiler.tool=torch", "tool_config.torch.schedule.active=2"], "schedule", Schedule(active=2)),
        (
            # verl's end is exclusive, token_window's last inclusive
            [
                "global_profiler.tool=torch",
                "tool_config.torch.profile_token_start=4",
                "tool_config.torch.profile_token_end=20",
            ],
            "token_window",
            (4, 19),
        ),
        (
            ["tool_config.torch.profile_token_start=null", "tool_config.torch.profile_token_end=null"],
            "token_window",
            None,
        ),
        (["finish_hook_cmd=null", "finish_hook_ranks=[3]"], "finish_hook", None),
        (["finish_hook_cmd=x.sh", "finish_hook_all_ranks=true"], "finish_hook", FinishHook("x.sh", all_ranks=True)),
        (["finish_hook_cmd=x.sh", "finish_hook_ranks=[2]"], "finish_hook", FinishHook("x.sh", ranks=(2,))),
        (
            ["profiler.finish_hook_cmd=x.sh", "finish_hook_timeout_s=9", "ranks=[1]"],
            "finish_hook",
            FinishHook("x.sh", ranks=(1,), timeout_s=9),
        ),
    ],
)
def test_verl_key_mapping(overrides: list[str], field: str, value: object) -> None:
    assert getattr(ProfilerConfig.from_overrides(overrides), field) == value


def test_verl_keys_and_native_overrides_compose_in_order() -> None:
    base = {
        "global_profiler": {"tool": "torch"},
        "tool_config": {"torch": {"schedule": {"wait": 1, "active": 2}}},
        "finish_hook_cmd": "a.sh",
    }
    cfg = ProfilerConfig.from_overrides(["schedule.wait=4", "finish_hook.ranks=[3]"], base=base)
    assert cfg.schedule == Schedule(wait=4, active=2)
    assert cfg.finish_hook == FinishHook("a.sh", ranks=(3,))


def test_verl_tools_without_counterpart_fail_clearly() -> None:
    with pytest.raises(ValueError, match=r"verl 'tool' must be one of null, 'nsys', 'torch'.*: 'npu'"):
        ProfilerConfig.from_overrides(["global_profiler.tool=npu"])


def test_verl_ignored_keys_warn_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ProfilerConfig.from_overrides(["tool_config.npu.level=level1", "global_profiler.profile_continuous_steps=true"])
    assert len(caught) == 1
    assert "tool_config.npu" in str(caught[0].message)
    assert "profile_continuous_steps" in str(caught[0].message)


# --------------------------------------------------------------------------- union / intersect


def test_merge_rules_cover_every_field() -> None:
    from instrument.config._settings import _MERGE_RULES

    assert set(_MERGE_RULES) == {f.name for f in attrs.fields(ProfilerConfig)}


def test_union_and_intersect_carry_every_field() -> None:
    actor = ProfilerConfig(
        steps=[1, 2],
        ranks=[0, 1],
        contents=["cpu", "cuda"],
        relocate_results=False,
        schedule=Schedule(active=2),
        finish_hook=FinishHook("up.sh", ranks=(0,), timeout_s=30),
    )
    rollout = ProfilerConfig(
        steps=[2, 3],
        ranks=[1, 2],
        contents=["cpu", "stack"],
        finish_hook=FinishHook("up.sh", ranks=(1,), timeout_s=60),
    )
    assert actor.union(rollout) == ProfilerConfig(
        steps=(1, 2, 3),
        ranks=(0, 1, 2),
        contents=("cpu", "cuda", "stack"),
        relocate_results=True,
        schedule=None,
        finish_hook=FinishHook("up.sh", ranks=(0, 1), timeout_s=60),
    )
    assert actor.intersect(rollout) == ProfilerConfig(
        steps=(2,),
        ranks=(1,),
        contents=("cpu",),
        relocate_results=False,
        schedule=Schedule(active=2),
        finish_hook=None,  # the hooks share no rank
    )


def test_union_with_disabled_is_the_other_and_disjoint_intersection_is_off() -> None:
    on = ProfilerConfig(steps=[1])
    off = ProfilerConfig(enable=False)
    assert on.union(off) == on
    assert off.union(on) == on
    assert not on.intersect(off).active
    assert not on.intersect(ProfilerConfig(steps=[2])).active
    assert not on.intersect(ProfilerConfig(ranks=[5])).active


@pytest.mark.parametrize(
    ("other", "field"),
    [
        (ProfilerConfig(tool="nvtx"), "tool"),
        (ProfilerConfig(save_path="elsewhere"), "save_path"),
        (ProfilerConfig(discrete=False), "discrete"),
        (ProfilerConfig(schedule=Schedule(active=3)), "schedule"),
        (ProfilerConfig(finish_hook=FinishHook("b.sh")), "finish_hook.cmd"),
    ],
)
def test_conflicting_fields_are_named(other: ProfilerConfig, field: str) -> None:
    base = ProfilerConfig(schedule=Schedule(active=2), finish_hook=FinishHook("a.sh"))
    with pytest.raises(ValueError, match=f"'{re.escape(field)}' differs"):
        base.union(other)


_steps = st.integers(1, 32)
_ranks = st.integers(0, 18)


@settings(max_examples=300)
@given(_configs(tool="torch", save_path="p"), _configs(tool="torch", save_path="p"), _steps, _ranks)
def test_union_profiles_what_either_does(a: ProfilerConfig, b: ProfilerConfig, step: int, rank: int) -> None:
    u = a.union(b)
    assert u == b.union(a)
    assert u.profiles_step(step) == (a.profiles_step(step) or b.profiles_step(step))
    assert u.profiles_rank(rank) == (a.profiles_rank(rank) or b.profiles_rank(rank))


@settings(max_examples=300)
@given(_configs(tool="torch", save_path="p"), _configs(tool="torch", save_path="p"), _steps, _ranks)
def test_intersect_profiles_what_both_do(a: ProfilerConfig, b: ProfilerConfig, step: int, rank: int) -> None:
    i = a.intersect(b)
    both = a.profiles_step(step) and a.profiles_rank(rank) and b.profiles_step(step) and b.profiles_rank(rank)
    assert (i.profiles_step(step) and i.profiles_rank(rank)) == both


# --------------------------------------------------------------------------- memory


def test_memory_section_builds_from_dict_and_overrides() -> None:
    cfg = ProfilerConfig.from_overrides(["tool=torch+torch_memory", "memory.max_entries=5000", "memory.on_oom=true"])
    assert cfg.tool == "torch+torch_memory"
    assert cfg.memory == MemorySnapshots(max_entries=5000, on_oom=True)
    assert ProfilerConfig.from_dict({"memory": {"stack_depth": 8}}).memory == MemorySnapshots(stack_depth=8)
    assert ProfilerConfig().memory is None


def test_memory_union_keeps_either_side_and_refuses_two_different() -> None:
    with_oom = ProfilerConfig(memory=MemorySnapshots(on_oom=True))
    assert ProfilerConfig().union(with_oom).memory == MemorySnapshots(on_oom=True)
    assert ProfilerConfig().intersect(with_oom).memory is None
    with pytest.raises(ValueError, match="'memory' differs"):
        with_oom.union(ProfilerConfig(memory=MemorySnapshots(max_entries=7)))
