"""verl 0.9.1's shipped profiler YAMLs and the PR body's overrides mean here what verl's own code makes of them.

The expectations in tests/data/verl/expected.json were computed once by verl 0.9.1 itself (NOTICE.md there
says how); verl is not needed to run these tests.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.config import MemorySnapshots, ProfilerConfig, _interpolation, _verl
from instrument.config._file import read_mapping
from instrument.config._settings import _flatten

DATA = Path(__file__).parents[1] / "data" / "verl"
EXPECTED = json.loads((DATA / "expected.json").read_text(encoding="utf-8"))
WORLD = EXPECTED["world_size"]
ROLES = ("actor", "rollout", "ref", "critic")
DOCUMENTS = sorted(EXPECTED["documents"])
SCENARIOS = sorted(EXPECTED["overrides"])
# Documents in verl's shape whose rollout section is its own (or absent), given inline (NOTICE.md)
ROLLOUT_DOCUMENTS = EXPECTED["rollout_documents"]


@pytest.fixture(params=["omegaconf", "stdlib"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every check runs with OmegaConf resolving the interpolations and with this package's own resolver."""
    if request.param == "stdlib":
        monkeypatch.setattr(_interpolation, "omegaconf_available", lambda: False)
    yield request.param


def _quiet(build: Any) -> ProfilerConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the npu / precision_debugger keys have no counterpart: one warning
        result: ProfilerConfig = build()
    return result


def _check(cfg: ProfilerConfig, verl: dict[str, Any], where: str) -> None:
    """``cfg`` against what verl computed for that role: the fields verl's worker acts on.

    A role verl found no section for (inactive, no tool) is checked without its tool: instrument's view
    names ``global_profiler``'s tool there, for a role it does not profile either."""
    hook = cfg.finish_hook
    got: dict[str, Any] = {
        "active": cfg.active,
        "ranks": [r for r in range(WORLD) if cfg.profiles_rank(r)],
        "hook_ranks": [r for r in range(WORLD) if cfg.active and hook and (hook.all_ranks or r in hook.ranks)],
        "all_ranks": cfg.all_ranks,
        "relocate_results": cfg.relocate_results,
        "tool": {"none": None, "nvtx": "nsys"}.get(cfg.tool, cfg.tool),
    }
    want = {k: verl[k] for k in got}
    if not verl["active"] and verl["tool"] is None and not cfg.active:
        del got["tool"], want["tool"]
    if verl["discrete"] is not None:
        got["discrete"], want["discrete"] = cfg.discrete, verl["discrete"]
    if verl["active"]:
        got["steps"], want["steps"] = list(cfg.steps or ()), verl["steps"]
        got["finish_hook_cmd"], want["finish_hook_cmd"] = hook.cmd if hook else None, verl["finish_hook_cmd"]
        if verl["tool"] == "torch":
            schedule = attrs.asdict(cfg.schedule) if cfg.schedule else None
            if schedule:
                assert schedule.pop("skip_first_wait") is False
            start, end = verl["token_window"]
            got["contents"], want["contents"] = list(cfg.contents), verl["contents"]
            got["schedule"], want["schedule"] = schedule, verl["schedule"]
            # verl's profile_token_end is exclusive, token_window's last iteration inclusive
            window = None if start is None and end is None else (start or 0, end - 1)
            got["token_window"], want["token_window"] = cfg.token_window, window
    assert got == want, where


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_shipped_section_parses_with_verls_meaning(name: str, role: str, resolver: str) -> None:
    expected = EXPECTED["documents"][name]
    cfg = _quiet(lambda: ProfilerConfig.from_dict(read_mapping(DATA / name), role=role))
    _check(cfg, expected["alone"][role], f"{name} alone, {role}")
    if "overridden" in expected:
        overrides = expected["overridden"]["overrides"]
        base = read_mapping(DATA / name)
        cfg = _quiet(lambda: ProfilerConfig.from_overrides(overrides, base=base, role=role))
        _check(cfg, expected["overridden"]["expected"][role], f"{name} + overrides, {role}")


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pr_body_overrides_mean_what_verl_makes_of_them(scenario: str, role: str, resolver: str) -> None:
    """The overrides alone take verl's defaults; over a pasted base (verl's composed sections) they agree."""
    entry = EXPECTED["overrides"][scenario]
    overrides, verl = entry["overrides"], entry["expected"][role]
    _check(_quiet(lambda: ProfilerConfig.from_overrides(overrides, role=role)), verl, f"{scenario} alone, {role}")
    base = read_mapping(DATA / "generated_ppo_trainer.yaml")
    cfg = _quiet(lambda: ProfilerConfig.from_overrides(overrides, base=base, role=role))
    _check(cfg, verl, f"{scenario} over the pasted base, {role}")


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", sorted(ROLLOUT_DOCUMENTS))
def test_a_documents_rollout_section_is_its_own(name: str, role: str, resolver: str) -> None:
    """In a document the rollout's keys are its own: no rollout section, or one without ``enable``, is off
    (verl's default) whatever the actor's says; it follows the actor only where its values say so
    (``${oc.select:actor_rollout_ref.actor.profiler.enable,false}``, as verl's rollout.yaml writes them)."""
    case = ROLLOUT_DOCUMENTS[name]
    document, overrides = case["document"], case.get("overrides", [])
    cfg = _quiet(lambda: ProfilerConfig.from_overrides(overrides, base=document, role=role))
    _check(cfg, case["expected"][role], f"{name}, {role}")
    if not overrides:
        _check(_quiet(lambda: ProfilerConfig.from_dict(document, role=role)), case["expected"][role], name)


def test_the_defaults_table_is_what_the_shipped_yamls_say(resolver: str) -> None:
    flat = dict(_flatten(read_mapping(DATA / "generated_ppo_trainer.yaml")))
    for sub, default in _verl.VERL_DEFAULTS.items():
        for key in (f"{_verl.ROLE_SECTIONS['actor']}.{sub}", f"global_profiler.{sub}"):
            if key in flat:
                value = _interpolation.resolve(flat, [key]).get(key, flat[key])
                assert value == default, key
                break


def test_every_shipped_key_is_accepted_and_the_rest_named_once() -> None:
    with pytest.warns(UserWarning) as caught:
        ProfilerConfig.from_dict(read_mapping(DATA / "generated_ppo_trainer.yaml"), role="actor")
    assert len(caught) == 1
    message = str(caught[0].message)
    for name in ("torch_memory.memory_snapshot_num_steps", "tool_config.npu", "profile_continuous_steps"):
        assert name in message
    assert "torch_memory.context" not in message  # it has a counterpart: memory.context
    assert "kw_args" not in message  # verl's shipped {} carries nothing
    with pytest.warns(UserWarning, match=r"global_profiler\.global_tool_config\.torch_memory\.kw_args"):
        ProfilerConfig.from_overrides(["global_profiler.global_tool_config.torch_memory.kw_args.x=1"])


def test_torch_memory_keys_map_to_memory_snapshots() -> None:
    base = read_mapping(DATA / "generated_ppo_trainer.yaml")
    overrides = [
        "global_profiler.tool=torch_memory",
        "global_profiler.steps=[1]",
        "global_profiler.global_tool_config.torch_memory.stacks=python",
        "global_profiler.global_tool_config.torch_memory.context=alloc",
        "global_profiler.global_tool_config.torch_memory.stack_depth=8",
        "actor_rollout_ref.actor.profiler.enable=true",
    ]
    cfg = _quiet(lambda: ProfilerConfig.from_overrides(overrides, base=base, role="actor"))
    # the actor's own stack_depth is a link to the trainer-wide one
    assert cfg.memory == MemorySnapshots(stack_depth=8, context="alloc", stacks="python", on_oom=True)


def test_a_whole_verl_configuration_parses_its_other_settings_skipped() -> None:
    whole = read_mapping(DATA / "generated_ppo_trainer.yaml")
    whole["trainer"] = {"total_epochs": 30, "default_local_dir": "checkpoints/${trainer.project_name}"}
    whole["actor_rollout_ref"]["actor"]["optim"] = {"lr": 1e-6}
    whole["actor_rollout_ref"]["hybrid_engine"] = True
    whole["global_profiler"]["save_path"] = "${trainer.default_local_dir}/profile"
    whole["trainer"]["project_name"] = "gsm8k"
    cfg = _quiet(lambda: ProfilerConfig.from_dict(whole, role="actor"))
    assert cfg.save_path == "checkpoints/gsm8k/profile"  # an interpolation may point into the other settings
    with pytest.raises(ValueError, match=r"unknown configuration key 'actor_rollout_ref.actor.profiler.enabel'"):
        ProfilerConfig.from_overrides(["actor_rollout_ref.actor.profiler.enabel=true"], base=whole)


def test_rollout_yaml_alone_profiles_nothing(resolver: str) -> None:
    """Its ``enable: ${oc.select:...actor.profiler.enable,false}`` takes the default when no actor is given."""
    cfg = _quiet(lambda: ProfilerConfig.from_file(DATA / "rollout.yaml", ["global_profiler.steps=[1]"]))
    assert not cfg.active


def test_native_keys_keep_instruments_defaults() -> None:
    assert ProfilerConfig.from_overrides(["steps=[1]"]) == ProfilerConfig(steps=(1,))
    assert (
        ProfilerConfig.from_dict({"schedule": {"active": 2}}).schedule
        == ProfilerConfig(schedule={"active": 2}).schedule
    )


# --------------------------------------------------------------------------- interpolations


def test_unresolvable_forms_are_named_without_omegaconf() -> None:
    document = {"a": "${oc.env:HOME}", "b": "${.sibling}"}
    for key in document:
        with pytest.raises(ValueError, match=r"not one of the forms resolved without OmegaConf"):
            _interpolation.resolve(document, [key], use_omegaconf=False)


@pytest.mark.parametrize("use_omegaconf", [True, False])
def test_missing_keys_and_cycles_are_named(use_omegaconf: bool) -> None:
    with pytest.raises(ValueError, match=r"cannot resolve 'a' \('\$\{x.y\}'\)"):
        _interpolation.resolve({"a": "${x.y}"}, ["a"], use_omegaconf=use_omegaconf)
    with pytest.raises(ValueError, match=r"cannot resolve '[ab]'"):
        _interpolation.resolve({"a": "${b}", "b": "${a}"}, ["a"], use_omegaconf=use_omegaconf)


def test_verl_values_resolve_but_native_text_is_kept() -> None:
    cfg = ProfilerConfig.from_overrides(["finish_hook.cmd=echo ${HOME}"])
    assert cfg.finish_hook is not None and cfg.finish_hook.cmd == "echo ${HOME}"


_LEAVES = ["a.x", "a.y", "b", "c.d.e"]
_SCALARS = st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.sampled_from(["w", "level0"]))
_DEFAULTS = st.one_of(
    st.sampled_from(["null", "false", "True", "3", "-2", "[]", "[1, 2]", "level0", "'q,r'"]),
    st.sampled_from(_LEAVES).map(lambda k: "${oc.select:" + k + ",7}"),
)


@st.composite
def _documents(draw: st.DrawFn) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for leaf in _LEAVES:
        if draw(st.booleans()):
            document[leaf] = draw(_SCALARS)
    for index in range(draw(st.integers(1, 4))):
        target = draw(st.sampled_from([*_LEAVES, "a", "missing.key"]))
        form = draw(st.sampled_from(["select", "select_default", "plain", "text"]))
        if form == "select":
            value = "${oc.select:" + target + "}"
        elif form == "select_default":
            value = "${oc.select:" + target + "," + draw(_DEFAULTS) + "}"
        elif form == "plain":
            value = "${" + target + "}"
        else:
            value = "at ${oc.select:" + target + ",none}!"
        document[f"i{index}"] = value
    return document


def _outcome(document: dict[str, Any], use_omegaconf: bool) -> Any:
    try:
        return _interpolation.resolve(document, list(document), use_omegaconf=use_omegaconf)
    except ValueError:
        return ValueError


@settings(max_examples=200, deadline=None)
@given(_documents())
def test_the_simple_forms_resolve_as_omegaconf_does(document: dict[str, Any]) -> None:
    assert _outcome(document, use_omegaconf=False) == _outcome(document, use_omegaconf=True)
