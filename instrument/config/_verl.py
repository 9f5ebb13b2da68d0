"""Read verl's profiler keys with verl 0.9.1's meaning, whatever their order.

verl keeps trainer-wide keys under ``global_profiler`` and per-role keys under
``actor_rollout_ref.{actor,rollout,ref}.profiler`` and ``critic.profiler``; this
package also reads a bare ``profiler`` section (one role's section, pasted) and
the verl-only keys (``tool_config.*``, ``finish_hook_*``) without a prefix.  The
rest of a whole verl configuration (``trainer``, ``data``, ``actor_rollout_ref.actor.optim``, …)
is skipped, so verl's shipped and generated YAMLs parse as they are.

Keys are first collected as an override list would set them (a later key
replaces the same key and anything below it), then OmegaConf interpolations
(``${oc.select:KEY,DEFAULT}``) are resolved within that document, as verl does
before its workers read it (:mod:`._interpolation`), then everything is resolved
together, so the order of distinct keys never changes the result.  A role's view
looks a key up in its own section, then the bare section, then ``global_profiler``.
In a document the rollout's keys are its own, as verl reads them (it follows the actor
only where the document's values say so); override lists alone stand for verl's composed
``ppo_trainer``, whose rollout section follows the actor's (``composed``).
A configuration written in verl's keys takes verl's defaults (:data:`VERL_DEFAULTS`)
for what it leaves out (a null verl value means that default) and ``dialect="verl"``: verl's rules
where verl and instrument differ (continuous mode's schedule, the rollout engines, the hook).  Only the selected
tool's settings apply.  ``_target_`` keys and tool-config ``name`` keys are ignored.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from instrument.config import _interpolation

__all__ = [
    "ROLES",
    "SPELLINGS",
    "VERL_DEFAULTS",
    "VERL_IGNORED",
    "VERL_KEYS",
    "collect",
    "combine",
    "is_meta",
    "is_other",
    "is_string_key",
    "is_verl_key",
    "prefixes_a_key",
    "sectioned",
    "set_key",
    "skippable",
    "views",
]

GLOBAL = "global_profiler"
BARE = "profiler"
ROLE_SECTIONS = {
    "actor": "actor_rollout_ref.actor.profiler",
    "rollout": "actor_rollout_ref.rollout.profiler",
    "ref": "actor_rollout_ref.ref.profiler",
    "critic": "critic.profiler",
}
# verl's fused workers read the actor's section.
_FUSED = {"actor_rollout": "actor", "actor_rollout_ref": "actor"}
ROLES = tuple(sorted([*ROLE_SECTIONS, *_FUSED]))
"""Role names whose view ``ProfilerConfig.from_dict(..., role=...)`` builds."""

# Longest first, so a role path is never read as a shorter section.
_SECTIONS = sorted([*ROLE_SECTIONS.values(), GLOBAL, BARE], key=len, reverse=True)

# The other top-level sections of verl 0.9.1's shipped configurations (trainer/config/*.yaml, composed):
# they hold no profiler setting, so a whole verl configuration parses with them skipped.
_OTHER_TOP = frozenset(
    {
        "algorithm",
        "checkpoint",
        "custom_reward_function",
        "data",
        "defaults",
        "distillation",
        "engine",
        "hydra",
        "model",
        "model_engine",
        "optim",
        "ray_kwargs",
        "reward",
        "reward_model",
        "sandbox_fusion",
        "skip",
        "trainer",
        "transfer_queue",
    }
)
# Top-level sections holding role profiler sections among other settings.
_CONTAINERS = frozenset({"actor_rollout_ref", "critic"})
_VERL_TARGET = "verl.utils.profiler.ProfilerConfig"

_SCHEDULE = ("skip_first", "wait", "warmup", "active", "repeat", "skip_first_wait")
_TOKEN_START = "tool_config.torch.profile_token_start"
_TOKEN_END = "tool_config.torch.profile_token_end"
# verl's torch_memory settings -> the memory section's fields (a role's own value wins, as for nsys).
_MEMORY = {
    "trace_alloc_max_entries": "memory.max_entries",
    "stack_depth": "memory.stack_depth",
    "context": "memory.context",
    "stacks": "memory.stacks",
}

VERL_KEYS = (
    "tool",
    "steps",
    "enable",
    "ranks",
    "all_ranks",
    "save_path",
    "relocate_results",
    "tool_config.torch.contents",
    "tool_config.torch.discrete",
    *(f"tool_config.torch.schedule.{name}" for name in _SCHEDULE),
    _TOKEN_START,
    _TOKEN_END,
    "tool_config.nsys.discrete",
    "global_tool_config.nsys.discrete",
    *(f"{where}.torch_memory.{name}" for where in ("tool_config", "global_tool_config") for name in _MEMORY),
    "finish_hook_cmd",
    "finish_hook_ranks",
    "finish_hook_all_ranks",
    "finish_hook_timeout_s",
)
"""verl's profiler keys this package moves over, valid in every section."""

VERL_IGNORED = (
    "profile_continuous_steps",
    "global_tool_config.nsys.controller_nsight_options",
    "global_tool_config.nsys.worker_nsight_options",
    "global_tool_config.torch",
    "global_tool_config.torch_memory.memory_snapshot_num_steps",
    "global_tool_config.torch_memory.kw_args",
    "global_tool_config.precision_debugger",
    "tool_config.torch_memory.memory_snapshot_num_steps",
    "tool_config.npu",
    "tool_config.precision_debugger",
)
"""verl keys accepted but not applied (one warning names them): they have no counterpart here."""

VERL_DEFAULTS: Mapping[str, Any] = {
    "tool": None,
    "steps": None,
    "enable": False,
    "ranks": [],
    "all_ranks": False,
    "save_path": "outputs/profile",
    "relocate_results": False,
    "tool_config.torch.contents": [],
    "tool_config.torch.discrete": False,
    **{f"tool_config.torch.schedule.{name}": 0 for name in _SCHEDULE[:5]},
    "tool_config.torch.schedule.skip_first_wait": False,
    _TOKEN_START: None,
    _TOKEN_END: None,
    "tool_config.nsys.discrete": False,
    "global_tool_config.nsys.discrete": False,
    "tool_config.torch_memory.trace_alloc_max_entries": 100_000,
    "tool_config.torch_memory.stack_depth": 32,
    "tool_config.torch_memory.context": "all",
    "tool_config.torch_memory.stacks": "all",
    "global_tool_config.torch_memory.trace_alloc_max_entries": 100_000,
    "global_tool_config.torch_memory.stack_depth": 32,
    "global_tool_config.torch_memory.context": "all",
    "global_tool_config.torch_memory.stacks": "all",
    "finish_hook_cmd": None,
    "finish_hook_ranks": [],
    "finish_hook_all_ranks": False,
    "finish_hook_timeout_s": None,
}
"""verl 0.9.1's value for each key a configuration in verl's keys leaves out (or sets to null).

Read once from verl 0.9.1's shipped YAMLs, resolved: ``trainer/config/ppo_trainer.yaml``'s
``global_profiler``, ``profiler/profiler.yaml`` and the ``profiler`` sections of ``actor/actor.yaml``,
``ref/ref.yaml``, ``critic/critic.yaml`` and ``rollout/rollout.yaml`` (copied under ``tests/data/verl/``,
where ``tests/config/test_verl_yamls.py`` checks this table against them). Two are verl's code rather than
a YAML value: ``tool_config.torch_memory.{context,stacks}`` are ``all`` because verl's memory profiler
records with ``enable_memory_visualize()``'s defaults; ``finish_hook_timeout_s`` is this package's key
(verl waits without a limit; ``None`` keeps ``FinishHook``'s 600 s)."""

# verl's shipped rollout section (rollout/rollout.yaml) defaults these to the actor's values
# (``${oc.select:...actor.profiler.X}``): a composed configuration follows the actor for them, a document
# only through its own values (verl 0.9.1 reads a rollout section that is absent, or leaves one out, as off).
_ROLLOUT_FOLLOWS_ACTOR = frozenset(
    {
        "enable",
        "all_ranks",
        "ranks",
        "relocate_results",
        "finish_hook_cmd",
        "finish_hook_all_ranks",
        "finish_hook_ranks",
        "tool_config.torch.contents",
        "tool_config.torch.discrete",
    }
)
_TOOLS = {None: "none", "nsys": "nvtx", "torch": "torch", "torch_memory": "torch_memory"}
_STRING_KEYS = frozenset({"tool", "save_path", "finish_hook_cmd"})
_META_NAME = re.compile(r"^(global_)?tool_config\.[A-Za-z_]+(\.schedule)?\.name$")
_KNOWN = tuple(f"{s}.{k}" for s in _SECTIONS for k in (*VERL_KEYS, *VERL_IGNORED))
SPELLINGS = tuple(f"{s}.{k}" for s in _SECTIONS for k in VERL_KEYS)
"""Every verl key in every section, for "did you mean" hints."""


def _split(key: str) -> tuple[str, str] | None:
    """``(section, key inside it)`` for a verl key, else None."""
    for section in _SECTIONS:
        if key.startswith(section + "."):
            sub = key[len(section) + 1 :]
            break
    else:
        if key.startswith(("tool_config.", "finish_hook_")):
            section, sub = BARE, key
        elif key.startswith("global_tool_config."):
            section, sub = GLOBAL, key
        else:
            return None
    if sub in VERL_KEYS or _ignored(sub) or _META_NAME.match(sub):
        return section, sub
    return None


def _ignored_entry(sub: str) -> str | None:
    return next((entry for entry in VERL_IGNORED if sub == entry or sub.startswith(entry + ".")), None)


def _ignored(sub: str) -> bool:
    return _ignored_entry(sub) is not None


def is_verl_key(key: str) -> bool:
    """Whether ``key`` is one of verl's profiler keys (in a section, or verl-only without one)."""
    return _split(key) is not None


def is_meta(key: str) -> bool:
    """``_target_`` at any depth: hydra's class pointer, present in every verl section."""
    return key == "_target_" or key.endswith("._target_")


def is_other(key: str) -> bool:
    """A key of verl's other settings (``trainer.*``, ``actor_rollout_ref.actor.optim.*``, …): skipped.

    A key on a ``profiler`` path is never one, so a typo in a profiler section is still named.
    """
    parts = key.split(".")
    if parts[0] in _OTHER_TOP:
        return True
    return parts[0] in _CONTAINERS and "profiler" not in parts and _split(key) is None


def skippable(key: str, value: Any) -> bool:
    """Keys that carry no setting: ``_target_``, verl's other settings, an empty mapping at a verl section."""
    if is_meta(key) or is_other(key):
        return True
    if not isinstance(value, Mapping) or value:
        return False
    where = _split(key)
    return (where is not None and _ignored(where[1])) or any(k.startswith(key + ".") for k in _KNOWN)


def prefixes_a_key(key: str) -> bool:
    """Whether verl keys lie below ``key`` (a section, or a tool's settings): ``~key`` may delete it."""
    return key in _SECTIONS or any(k.startswith(key + ".") for k in _KNOWN)


def is_string_key(key: str) -> bool:
    """verl keys whose override text is taken as written (a tool, a path, a command)."""
    where = _split(key)
    return where is not None and where[1] in _STRING_KEYS


def sectioned(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A verl section given as a whole document (``profiler/profiler.yaml``) under its section's name.

    verl's sections carry ``_target_: verl.utils.profiler.ProfilerConfig`` at their top; hydra composes
    the group file as ``profiler``. The trainer-wide one (it has ``steps`` or ``global_tool_config``) is
    ``global_profiler``. Any other mapping is returned unchanged.
    """
    if mapping.get("_target_") != _VERL_TARGET:
        return mapping
    trainer_wide = any(k in mapping for k in ("steps", "global_tool_config", "profile_continuous_steps"))
    return {GLOBAL if trainer_wide else BARE: dict(mapping)}


def set_key(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` as an override does: it replaces the same key, what lies below it and any leaf above it."""
    for existing in [k for k in tree if k == key or k.startswith(key + ".") or key.startswith(k + ".")]:
        del tree[existing]
    tree[key] = value


def collect(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The document ``items`` set, in order (:func:`set_key` for each)."""
    tree: dict[str, Any] = {}
    for key, value in items:
        set_key(tree, key, value)
    return tree


def views(
    items: list[tuple[str, Any]], role: str | None, *, composed: bool = False
) -> list[tuple[str, list[tuple[str, Any]]]]:
    """ProfilerConfig items for each role view to build: one for ``role``, else one per role section given.

    ``composed``: ``items`` are overrides of verl's composed ``ppo_trainer`` (no document given), whose
    rollout section follows the actor's for the keys it leaves; else a document, whose rollout keys are its own.
    Native keys come last in every view, so they win over verl keys for the same field.
    """
    if role is not None and role not in ROLES:
        raise ValueError(f"'role' must be one of {', '.join(repr(r) for r in ROLES)}: {role!r}")
    tree = collect(items)
    verl_keys = [k for k, v in tree.items() if not skippable(k, v) and _split(k) is not None]
    # Interpolations may point anywhere in the document (verl's other sections too), so all of it is given.
    tree.update(_interpolation.resolve(tree, verl_keys))
    native: list[tuple[str, Any]] = []
    sections: dict[str, dict[str, Any]] = {}
    ignored: set[str] = set()
    for key, value in tree.items():
        if skippable(key, value):
            continue
        where = _split(key)
        if where is None:
            native.append((key, value))
            continue
        entry = _ignored_entry(where[1])
        if entry is not None:
            ignored.add(key[: len(key) - len(where[1])] + entry)
        elif not _META_NAME.match(where[1]):
            sections.setdefault(where[0], {})[where[1]] = value
    if ignored:
        warnings.warn(
            f"verl profiler keys without a counterpart here were ignored: {', '.join(sorted(ignored))}",
            UserWarning,
            stacklevel=4,
        )
    dialect = bool(sections or ignored)
    if role is not None:
        chosen: list[str | None] = [_FUSED.get(role, role)]
    else:
        chosen = [name for name, section in ROLE_SECTIONS.items() if section in sections]
        if not chosen or BARE in sections:
            chosen.append(None)  # the bare section stands for any role
    native_top = dict(native)
    return [
        (ROLE_SECTIONS[name] if name else BARE, _View(sections, name, dialect, composed).items(native_top) + native)
        for name in chosen
    ]


class _Combinable(Protocol):
    def union(self, other: Any, /) -> Any: ...


_C = TypeVar("_C", bound=_Combinable)


def combine(built: list[tuple[str, _C]]) -> _C:
    """The union of the role views built from :func:`views`, or a message naming the sections that clash."""
    combined = built[0][1]
    for _label, other in built[1:]:
        try:
            combined = combined.union(other)
        except ValueError as exc:
            labels = ", ".join(label for label, _ in built)
            raise ValueError(
                f"verl role sections {labels} cannot be combined into one configuration: {exc}; "
                "build each role's view with from_dict(..., role='actor') / from_overrides(..., role=...)"
            ) from None
    return combined


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))


class _View:
    """One role's view of the collected sections; with ``dialect`` (verl keys given), verl's defaults fill in;
    ``composed`` as in :func:`views`."""

    def __init__(self, sections: dict[str, dict[str, Any]], role: str | None, dialect: bool, composed: bool) -> None:
        self.sections = sections
        self.role = role
        self.dialect = dialect
        self.composed = composed

    def get(self, sub: str) -> tuple[bool, Any]:
        """``(given, value)`` of ``sub``, looked up from the most specific section to ``global_profiler``."""
        order = [ROLE_SECTIONS[self.role]] if self.role else []
        if self.composed and self.role == "rollout" and sub in _ROLLOUT_FOLLOWS_ACTOR:
            order.append(ROLE_SECTIONS["actor"])
        for section in (*order, BARE, GLOBAL):
            values = self.sections.get(section, {})
            if sub in values:
                return True, values[sub]
        return False, None

    def value(self, sub: str, fallback: str | None = None) -> Any:
        """``sub``'s value, else ``fallback``'s (a trainer-wide key), else verl's default; null is the default."""
        for key in (sub, fallback):
            if key is not None:
                given, value = self.get(key)
                if given and value is not None and value != _interpolation.MISSING:
                    return value
        return VERL_DEFAULTS[sub]

    def items(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        if not self.dialect:
            return []
        tool = self.value("tool")
        if tool not in _TOOLS:
            raise ValueError(
                "verl 'tool' must be one of null, 'nsys', 'torch', 'torch_memory' to move over (npu and "
                f"precision_debugger have no counterpart here): {tool!r}"
            )
        # verl's rules where they differ from instrument's (continuous schedule, rollout engines, the hook)
        out: list[tuple[str, Any]] = [("dialect", "verl"), ("tool", _TOOLS[tool])]
        selected = native.get("tool", _TOOLS[tool])
        steps = self.value("steps")
        if "steps" not in native and (steps is None or (_is_list(steps) and not steps)):
            out.append(("enable", False))  # verl profiles no step when steps is null or empty, whatever enable says
        else:
            out += [("steps", steps), ("enable", self.value("enable"))]
        for name in ("all_ranks", "save_path", "relocate_results"):
            out.append((name, self.value(name)))
        ranks = self.value("ranks")
        unnamed = _is_list(ranks) and not ranks
        # verl profiles rank 0 when ranks is empty and all_ranks is false, and its rollout then keeps
        # every trace of replica 0 (rollout_profiler_global_ranks: no rank named keeps all).
        out.append(("ranks", [0] if unnamed else ranks))
        out.append(("keep_engine_peers", unnamed and "ranks" not in native))
        out.append(("discrete", False))  # verl's mode for a tool without a discrete setting (torch_memory)
        if selected == "torch":
            out += self._torch()
        elif selected == "torch_memory":
            out += self._memory()
        elif selected == "nvtx":
            # verl's role nsys.discrete defaults to the trainer-wide one
            out.append(("discrete", self.value("tool_config.nsys.discrete", "global_tool_config.nsys.discrete")))
        return out + self._finish_hook(dict(out), native)

    def _torch(self) -> list[tuple[str, Any]]:
        contents = self.value("tool_config.torch.contents")
        if _is_list(contents):
            # verl always records CPU activity (its stage markers are CPU events) and CUDA unless contents
            # is given without it.
            cuda = ["cuda"] if not contents or "cuda" in contents else []
            contents = ["cpu", *cuda, *(c for c in contents if c not in ("cpu", "cuda"))]
        discrete = self.value("tool_config.torch.discrete")
        out: list[tuple[str, Any]] = [("contents", contents), ("discrete", discrete)]
        schedule = {name: self.value(f"tool_config.torch.schedule.{name}") for name in _SCHEDULE}
        # verl schedules only when active > 0; its default of all zeros means "no schedule".
        if schedule["active"] not in (0, None):  # repeat 0 in continuous mode: ProfilerConfig makes it verl's 1
            out += [(f"schedule.{name}", value) for name, value in schedule.items()]
        return out + self._token_window()

    def _memory(self) -> list[tuple[str, Any]]:
        # verl's memory profiler also saves a snapshot at an out-of-memory error, on every profiled rank.
        out: list[tuple[str, Any]] = [("memory.on_oom", True)]
        for name, field in _MEMORY.items():
            # like nsys.discrete: the trainer-wide value unless the role sets its own
            out.append(
                (field, self.value(f"tool_config.torch_memory.{name}", f"global_tool_config.torch_memory.{name}"))
            )
        return out

    def _token_window(self) -> list[tuple[str, Any]]:
        start, end = self.value(_TOKEN_START), self.value(_TOKEN_END)
        for name, value in (("start", start), ("end", end)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise TypeError(f"verl 'profile_token_{name}' must be an int >= 0 or null: {value!r}")
        if start is None and end is None:
            return []
        if end is None:
            raise ValueError(
                f"verl 'profile_token_end' must be set when 'profile_token_start' is: start={start}, end=None"
            )
        first = start or 0
        if end <= first:
            raise ValueError(
                f"verl 'profile_token_end' (exclusive) must be > 'profile_token_start': start={start}, end={end}"
            )
        # verl's end is exclusive, token_window's last iteration inclusive.
        return [("token_window", [first, end - 1])]

    def _finish_hook(self, resolved: dict[str, Any], native: dict[str, Any]) -> list[tuple[str, Any]]:
        cmd = self.value("finish_hook_cmd")
        if cmd is None:
            return []  # verl keeps the other finish_hook_* keys even when no command is set
        out: list[tuple[str, Any]] = [("finish_hook.cmd", cmd)]
        timeout = self.value("finish_hook_timeout_s")
        if timeout is not None:
            out.append(("finish_hook.timeout_s", timeout))
        all_ranks = self.value("finish_hook_all_ranks")
        ranks = self.value("finish_hook_ranks")
        if not (_is_list(ranks) and not ranks):
            out.append(("finish_hook.ranks", ranks))
        if all_ranks is not False:
            out.append(("finish_hook.all_ranks", all_ranks))
        elif _is_list(ranks) and not ranks:
            # verl runs the hook on the profiled ranks when no hook ranks are given.
            out.append(("finish_hook.ranks", native.get("ranks", resolved["ranks"])))
            out.append(("finish_hook.all_ranks", native.get("all_ranks", resolved["all_ranks"])))
        return out
