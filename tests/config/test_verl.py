"""verl's profiler keys keep verl's meaning, whatever their order (issue 15), and NUL bytes fail early."""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.config import FinishHook, MemorySnapshots, ProfilerConfig, Schedule
from instrument.rollout.vllm import profiler_launch_args

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"
REF = "actor_rollout_ref.ref.profiler"
CRITIC = "critic.profiler"


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys -> nested mappings, in the order given."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return str(value)


# --------------------------------------------------------------------------- the cases of issue 15


@pytest.mark.parametrize(
    "mapping",
    [
        {"profiler": {"_target_": "verl.utils.profiler.ProfilerConfig", "enable": True}},
        {"global_profiler": {"_target_": "verl.utils.profiler.ProfilerConfig", "tool": "torch"}},
        {"global_profiler": {"global_tool_config": {"torch": {"_target_": "x"}, "nsys": {"_target_": "y"}}}},
        {"profiler": {"tool_config": {"torch": {"_target_": "a", "schedule": {"_target_": "b", "active": 2}}}}},
        {ACTOR: {"_target_": "verl.utils.profiler.ProfilerConfig", "enable": True}},
        {"_target_": "x", "schedule": {"_target_": "y", "active": 2}},
    ],
)
def test_target_keys_are_accepted_and_ignored_at_any_depth(mapping: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning: every verl section carries them
        cfg = ProfilerConfig.from_dict(mapping)
    without = ProfilerConfig.from_dict(_strip_targets(mapping))
    assert cfg == without


def _strip_targets(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: _strip_targets(v) if isinstance(v, dict) else v for k, v in mapping.items() if k != "_target_"}


def test_target_override_is_accepted() -> None:
    overrides = [
        "profiler._target_=verl.utils.profiler.ProfilerConfig",
        "global_profiler.global_tool_config.torch._target_=x",
    ]
    assert ProfilerConfig.from_overrides(overrides) == ProfilerConfig()


def test_verl_pr_example_role_paths_are_accepted() -> None:
    """The overrides of verl's torch-profile example script, role paths and all."""
    overrides = [
        f"{ACTOR}.enable=True",
        f"{ACTOR}.ranks=[0]",
        f"{ACTOR}.all_ranks=False",
        f"{ACTOR}.tool_config.torch.discrete=False",
        f"{ACTOR}.tool_config.torch.contents=['cpu','cuda']",
        f"{ACTOR}.tool_config.torch.schedule.active=2",
        f"{ACTOR}.tool_config.torch.schedule.warmup=1",
        f"{ROLLOUT}.enable=True",
        f"{ROLLOUT}.tool_config.torch.discrete=True",
        f"{ROLLOUT}.tool_config.torch.profile_token_start=12",
        f"{ROLLOUT}.tool_config.torch.profile_token_end=46",
        f"{REF}.enable=False",
        f"{CRITIC}.enable=False",
        f"{CRITIC}.tool_config.torch.contents=[]",
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        "global_profiler.save_path=/p",
        "global_profiler.relocate_results=True",
        "global_profiler.finish_hook_cmd=upload.sh",
    ]
    actor = ProfilerConfig.from_overrides(overrides, role="actor")
    assert actor == ProfilerConfig(
        steps=(1, 2),
        save_path="/p",
        discrete=False,
        schedule=Schedule(warmup=1, active=2),
        finish_hook=FinishHook("upload.sh", ranks=(0,)),
        dialect="verl",
    )
    # verl's fused worker reads the actor's section
    assert ProfilerConfig.from_overrides(overrides, role="actor_rollout_ref") == actor
    rollout = ProfilerConfig.from_overrides(overrides, role="rollout")
    # the rollout follows the actor's ranks and contents, has its own discrete and token window
    assert rollout == ProfilerConfig(
        steps=(1, 2),
        save_path="/p",
        discrete=True,
        token_window=(12, 45),
        finish_hook=FinishHook("upload.sh"),
        dialect="verl",
    )
    assert not ProfilerConfig.from_overrides(overrides, role="ref").active
    assert not ProfilerConfig.from_overrides(overrides, role="critic").active
    # One configuration for the whole run cannot be both continuous and discrete: the message says what to do.
    with pytest.raises(ValueError, match=r"'discrete' differs.*role="):
        ProfilerConfig.from_overrides(overrides)


def test_role_sections_combine_as_a_union_without_a_role() -> None:
    mapping = {
        "global_profiler": {"tool": "torch", "steps": [1, 3]},
        ACTOR: {"enable": True, "ranks": [0]},
        CRITIC: {"enable": True, "ranks": [4]},
        REF: {"enable": False, "ranks": [7]},
    }
    cfg = ProfilerConfig.from_dict(mapping)
    # verl's defaults for what the sections leave out: continuous, no relocation
    verl: dict[str, Any] = {"discrete": False, "relocate_results": False, "dialect": "verl"}
    assert cfg == ProfilerConfig(steps=(1, 3), ranks=(0, 4), **verl)
    assert ProfilerConfig.from_dict(mapping, role="critic") == ProfilerConfig(steps=(1, 3), ranks=(4,), **verl)


def test_rollout_follows_the_actor_in_override_lists_and_its_own_section_in_a_document() -> None:
    """Overrides alone stand for verl's composed ppo_trainer, whose rollout section follows the actor's; in a
    document (verl 0.9.1 reads it as it stands) the rollout's keys are its own: absent, it is off."""
    base: dict[str, Any] = {
        "global_profiler": {"tool": "torch", "steps": [1]},
        ACTOR: {"enable": True, "ranks": [2], "tool_config": {"torch": {"contents": ["cuda", "shapes"]}}},
    }
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1]",
        f"{ACTOR}.enable=true",
        f"{ACTOR}.ranks=[2]",
        f"{ACTOR}.tool_config.torch.contents=[cuda,shapes]",
    ]
    rollout = ProfilerConfig.from_overrides(overrides, role="rollout")
    assert (rollout.active, rollout.ranks, rollout.contents) == (True, (2,), ("cpu", "cuda", "shapes"))
    own = ProfilerConfig.from_overrides([*overrides, f"{ROLLOUT}.ranks=[5]"], role="rollout")
    assert (own.active, own.ranks) == (True, (5,))
    assert not ProfilerConfig.from_overrides([*overrides, f"{ROLLOUT}.enable=false"], role="rollout").active
    assert not ProfilerConfig.from_dict(base, role="rollout").active
    assert not ProfilerConfig.from_overrides([], base=base, role="rollout").active
    assert not ProfilerConfig.from_dict({**base, ROLLOUT: {"ranks": [5]}}, role="rollout").active
    enabled = ProfilerConfig.from_dict({**base, ROLLOUT: {"enable": True, "ranks": [5]}}, role="rollout")
    assert (enabled.active, enabled.ranks, enabled.contents) == (True, (5,), ("cpu", "cuda"))


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        (f"{ACTOR}.enabel", f"{ACTOR}.enable"),
        (f"{CRITIC}.tool_config.torch.discrte", f"{CRITIC}.tool_config.torch.discrete"),
        ("actor_rollout_ref.actr.profiler.ranks", f"{ACTOR}.ranks"),
    ],
)
def test_typos_in_role_paths_get_that_paths_hint(key: str, hint: str) -> None:
    with pytest.raises(ValueError, match=f"^unknown configuration key '{re.escape(key)}'; did you mean '{hint}'"):
        ProfilerConfig.from_overrides([f"{key}=1"])


def test_unknown_role_is_named() -> None:
    with pytest.raises(ValueError, match=r"^'role' must be one of 'actor', .*: 'trainer'$"):
        ProfilerConfig.from_dict({}, role="trainer")


def test_omegaconf_interpolations_follow_verls_inheritance() -> None:
    """verl's generated YAML holds ${oc.select:...} links to the section a key inherits from."""
    mapping = {
        "global_profiler": {"tool": "torch", "steps": [2], "finish_hook_cmd": "up.sh"},
        ACTOR: {
            "enable": True,
            "ranks": [1],
            "tool": "${oc.select:global_profiler.tool,null}",
            "finish_hook_cmd": "${oc.select:global_profiler.finish_hook_cmd,null}",
        },
        ROLLOUT: {
            "enable": "${oc.select:actor_rollout_ref.actor.profiler.enable,false}",
            "ranks": "${oc.select:actor_rollout_ref.actor.profiler.ranks,[]}",
            "finish_hook_cmd": "${oc.select:actor_rollout_ref.actor.profiler.finish_hook_cmd,null}",
        },
    }
    rollout = ProfilerConfig.from_dict(mapping, role="rollout")
    assert rollout == ProfilerConfig(
        steps=(2,),
        ranks=(1,),
        discrete=False,
        relocate_results=False,
        finish_hook=FinishHook("up.sh", ranks=(1,)),
        dialect="verl",
    )
    # resolved within the document: a link to a key it does not hold takes the link's default
    del mapping[ACTOR]["finish_hook_cmd"]
    assert ProfilerConfig.from_dict(mapping, role="rollout").finish_hook is None


@pytest.mark.parametrize("order", [1, -1])
def test_only_the_selected_tools_discrete_applies(order: int) -> None:
    sections = [
        ("profiler", {"tool_config": {"torch": {"discrete": True}}}),
        ("global_profiler", {"tool": "torch", "global_tool_config": {"nsys": {"discrete": False}}}),
    ]
    assert ProfilerConfig.from_dict(dict(sections[::order])).discrete is True
    nsys_global: dict[str, Any] = {"tool": "nsys", "global_tool_config": {"nsys": {"discrete": False}}}
    nsys = [("profiler", {"tool_config": {"torch": {"discrete": True}}}), ("global_profiler", nsys_global)]
    assert ProfilerConfig.from_dict(dict(nsys[::order])).discrete is False
    # a role's own nsys.discrete wins over the trainer-wide one (verl's interpolation default)
    own = [("global_profiler", nsys_global), ("profiler", {"tool_config": {"nsys": {"discrete": True}}})]
    assert ProfilerConfig.from_dict(dict(own[::order])).discrete is True


@pytest.mark.parametrize("order", [1, -1])
def test_torch_memory_moves_over_with_its_keys(order: int) -> None:
    sections = [
        (
            "global_profiler",
            {
                "tool": "torch_memory",
                "steps": [2],
                "global_tool_config": {"torch_memory": {"trace_alloc_max_entries": 5000, "stack_depth": 16}},
            },
        ),
        ("profiler", {"enable": True, "tool_config": {"torch_memory": {"stack_depth": 4}}}),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of it is ignored any more
        cfg = ProfilerConfig.from_dict(dict(sections[::order]))
    # a role's own stack_depth wins over the trainer-wide one, as for nsys.discrete
    assert (cfg.tool, cfg.steps) == ("torch_memory", (2,))
    # verl records whole stacks and saves a snapshot at an out-of-memory error
    assert cfg.memory == MemorySnapshots(max_entries=5000, stack_depth=4, stacks="all", on_oom=True)
    overrides = [
        "global_profiler.tool=torch_memory",
        "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=77",
    ][::order]
    assert ProfilerConfig.from_overrides(overrides).memory == MemorySnapshots(max_entries=77, stacks="all", on_oom=True)


def test_torch_memory_keys_apply_only_to_that_tool_and_are_validated() -> None:
    keys = {"global_profiler": {"tool": "torch", "global_tool_config": {"torch_memory": {"stack_depth": 4}}}}
    assert ProfilerConfig.from_dict(keys).memory is None
    bad = {"global_profiler": {"tool": "torch_memory", "global_tool_config": {"torch_memory": {"stack_depth": 0}}}}
    with pytest.raises(ValueError, match=r"^'stack_depth' must be >= 1: 0$"):
        ProfilerConfig.from_dict(bad)


@pytest.mark.parametrize("order", [1, -1])
def test_steps_null_profiles_nothing_in_any_order(order: int) -> None:
    items = [("global_profiler", {"tool": "torch", "steps": None}), ("profiler", {"enable": True})]
    cfg = ProfilerConfig.from_dict(dict(items[::order]))
    assert not cfg.active
    overrides = ["global_profiler.steps=null", "profiler.enable=true"][::order]
    assert not ProfilerConfig.from_overrides(overrides).active
    # a base and its overrides are one configuration too: the override does not undo steps=null
    assert not ProfilerConfig.from_overrides(["profiler.enable=true"], base={"global_profiler": {"steps": None}}).active


def test_verl_keys_example_with_steps_null_profiles_nothing() -> None:
    import yaml

    loaded = yaml.safe_load((Path(__file__).parents[2] / "examples" / "verl_keys.yaml").read_text())
    assert ProfilerConfig.from_dict(loaded).active
    loaded["global_profiler"]["steps"] = None
    assert not ProfilerConfig.from_dict(loaded).active


def test_profile_token_end_is_exclusive(tmp_path: Path) -> None:
    cfg = ProfilerConfig.from_overrides(
        [
            "global_profiler.tool=torch",
            "tool_config.torch.profile_token_start=12",
            "tool_config.torch.profile_token_end=46",
        ]
    )
    assert cfg.token_window == (12, 45)
    sent = profiler_launch_args(cfg, profiler_dir=tmp_path, vllm_version="0.13.0").profiler_config
    assert sent is not None
    # verl: delay_iterations = start, max_iterations = end - start
    assert (sent["delay_iterations"], sent["max_iterations"]) == (12, 34)
    only_end = ["global_profiler.tool=torch", "tool_config.torch.profile_token_end=5"]
    assert ProfilerConfig.from_overrides(only_end).token_window == (0, 4)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (5, 5, "verl 'profile_token_end' (exclusive) must be > 'profile_token_start': start=5, end=5"),
        (None, 0, "verl 'profile_token_end' (exclusive) must be > 'profile_token_start': start=None, end=0"),
        (3, None, "verl 'profile_token_end' must be set when 'profile_token_start' is: start=3, end=None"),
        ("a", 9, "verl 'profile_token_start' must be an int >= 0 or null: 'a'"),
        (1, 2.5, "verl 'profile_token_end' must be an int >= 0 or null: 2.5"),
    ],
)
def test_bad_token_bounds_are_named(start: object, end: object, message: str) -> None:
    torch = {"profile_token_start": start, "profile_token_end": end}
    with pytest.raises((ValueError, TypeError), match=f"^{re.escape(message)}$"):
        ProfilerConfig.from_dict({"global_profiler": {"tool": "torch"}, "profiler": {"tool_config": {"torch": torch}}})


def test_finish_hook_all_ranks_keeps_the_ranks_given() -> None:
    overrides = ["finish_hook_cmd=x.sh", "finish_hook_all_ranks=true", "finish_hook_ranks=[2]"]
    expected = FinishHook("x.sh", ranks=(2,), all_ranks=True)
    for order in (overrides, overrides[::-1]):
        assert ProfilerConfig.from_overrides(order).finish_hook == expected


def test_hook_falls_back_to_the_profiled_ranks_whatever_the_order() -> None:
    overrides = ["finish_hook_cmd=x.sh", "ranks=[3]"]
    for order in (overrides, overrides[::-1]):
        assert ProfilerConfig.from_overrides(order).finish_hook == FinishHook("x.sh", ranks=(3,))


def test_native_keys_win_over_verl_keys_for_the_same_field() -> None:
    base = {"global_profiler": {"steps": [1, 2]}}
    assert ProfilerConfig.from_overrides(["steps=[5]"], base=base).steps == (5,)
    assert ProfilerConfig.from_overrides(["global_profiler.steps=[5]"], base={"steps": [1, 2]}).steps == (1, 2)


# --------------------------------------------------------------------------- order never changes meaning

# (dotted key, value) pairs a verl user may give, several of them for the same ProfilerConfig field.
_POOL: list[tuple[str, Any]] = [
    ("global_profiler._target_", "verl.utils.profiler.ProfilerConfig"),
    ("global_profiler.tool", "torch"),
    ("global_profiler.steps", None),
    ("global_profiler.steps", [1, 3]),
    ("global_profiler.save_path", "/p"),
    ("global_profiler.relocate_results", False),
    ("global_profiler.finish_hook_cmd", "up.sh"),
    ("global_profiler.finish_hook_ranks", [1]),
    ("global_profiler.finish_hook_all_ranks", True),
    ("global_profiler.global_tool_config.nsys.discrete", False),
    ("global_profiler.global_tool_config.nsys._target_", "x"),
    ("global_profiler.tool", "torch_memory"),
    ("global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries", 5000),
    ("global_profiler.global_tool_config.torch_memory.stack_depth", 16),
    ("profiler.tool_config.torch_memory.stack_depth", 4),
    ("profiler.enable", True),
    ("profiler.enable", False),
    ("profiler.ranks", [0, 2]),
    ("profiler.ranks", []),
    ("profiler.all_ranks", True),
    ("profiler.tool_config.torch.discrete", True),
    ("profiler.tool_config.torch.contents", ["cuda", "shapes"]),
    ("profiler.tool_config.torch.schedule.active", 2),
    ("profiler.tool_config.torch.schedule.active", 0),
    ("profiler.tool_config.torch.schedule.wait", 1),
    ("profiler.tool_config.torch.profile_token_start", 4),
    ("profiler.tool_config.torch.profile_token_end", 20),
    ("profiler.tool_config.nsys.discrete", True),
    ("profiler.finish_hook_cmd", "role.sh"),
    (f"{ACTOR}.enable", True),
    (f"{ACTOR}.ranks", [1]),
    (f"{ACTOR}.tool_config.torch.discrete", True),
    (f"{ACTOR}.tool_config.torch.schedule.warmup", 1),
    (f"{ROLLOUT}.enable", True),
    (f"{ROLLOUT}.tool_config.torch.discrete", True),
    (f"{CRITIC}.enable", True),
    (f"{CRITIC}.ranks", [4]),
    (f"{CRITIC}.tool_config.torch.discrete", True),
    ("steps", [2]),
    ("discrete", True),
]


def _outcome(build: Any) -> Any:
    """The configuration built, or the error it raised (type and message)."""
    try:
        return build()
    except (ValueError, TypeError) as exc:
        return (type(exc), str(exc))


@st.composite
def _key_sets(draw: st.DrawFn) -> dict[str, Any]:
    """A set of distinct keys (one value each, no key below another), as verl or a user would give."""
    picks = draw(st.lists(st.sampled_from(range(len(_POOL))), unique=True, max_size=14))
    chosen: dict[str, Any] = {}
    for index in picks:
        key, value = _POOL[index]
        chosen.setdefault(key, value)
    return chosen


@settings(max_examples=200, deadline=None)
@given(_key_sets(), st.randoms(use_true_random=False), st.sampled_from([None, "actor", "rollout", "critic"]))
def test_permutations_of_verl_keys_build_the_same_config(keys: dict[str, Any], rnd: random.Random, role: Any) -> None:
    items = list(keys.items())
    shuffled = items[:]
    rnd.shuffle(shuffled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _outcome(lambda: ProfilerConfig.from_dict(dict(items), role=role))
        assert _outcome(lambda: ProfilerConfig.from_dict(dict(shuffled), role=role)) == expected
        assert _outcome(lambda: ProfilerConfig.from_dict(_nest(dict(shuffled)), role=role)) == expected
        overrides = [f"{k}={_text(v)}" for k, v in shuffled]
        alone = _outcome(lambda: ProfilerConfig.from_overrides(overrides, role=role))
        assert _outcome(lambda: ProfilerConfig.from_overrides(overrides[::-1], role=role)) == alone
        if role not in (None, "rollout"):  # overrides alone: the rollout follows the actor (verl's composed config)
            assert alone == expected
        # split between a base mapping and overrides: still one configuration
        cut = rnd.randrange(len(shuffled) + 1)
        base = _nest(dict(shuffled[:cut]))
        assert _outcome(lambda: ProfilerConfig.from_overrides(overrides[cut:], base=base, role=role)) == expected


# --------------------------------------------------------------------------- NUL bytes (C4)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ProfilerConfig(save_path="out\0put"), "'save_path' must be a path without NUL bytes: 'out\\x00put'"),
        (lambda: FinishHook(cmd="tar \0 x"), "'cmd' must be a shell command without NUL bytes: 'tar \\x00 x'"),
        (
            lambda: ProfilerConfig.from_overrides(["global_profiler.save_path=a\0b"]),
            "'save_path' must be a path without NUL bytes: 'a\\x00b'",
        ),
        (
            lambda: ProfilerConfig.from_dict({"global_profiler": {"finish_hook_cmd": "x\0"}}),
            "'cmd' must be a shell command without NUL bytes: 'x\\x00'",
        ),
    ],
)
def test_nul_bytes_fail_at_construction(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()
