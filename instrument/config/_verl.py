"""Read verl's profiler keys with verl's meaning, whatever their order.

verl keeps trainer-wide keys under ``global_profiler`` and per-role keys under
``actor_rollout_ref.{actor,rollout,ref}.profiler`` and ``critic.profiler``; this
package also reads a bare ``profiler`` section (one role's section, pasted) and
the verl-only keys (``tool_config.*``, ``finish_hook_*``) without a prefix.

Keys are first collected as an override list would set them (a later key
replaces the same key and anything below it), then resolved together, so the
order of distinct keys never changes the result.  A role's view looks a key up
in its own section, then (rollout only, as verl's interpolations do) the
actor's, then the bare section, then ``global_profiler``.  Only the selected
tool's settings apply.  ``_target_`` keys and tool-config ``name`` keys are
ignored; an OmegaConf interpolation (``${...}``) counts as "not given", which
is what verl's own interpolations say: inherit.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

__all__ = [
    "ROLES",
    "SPELLINGS",
    "VERL_IGNORED",
    "VERL_KEYS",
    "combine",
    "is_meta",
    "is_string_key",
    "is_verl_key",
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

_SCHEDULE = ("skip_first", "wait", "warmup", "active", "repeat", "skip_first_wait")
_TOKEN_START = "tool_config.torch.profile_token_start"
_TOKEN_END = "tool_config.torch.profile_token_end"
# verl's torch_memory settings -> the memory section's fields (a role's own value wins, as for nsys).
_MEMORY = {"trace_alloc_max_entries": "memory.max_entries", "stack_depth": "memory.stack_depth"}

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
    "global_tool_config.precision_debugger",
    "tool_config.npu",
    "tool_config.precision_debugger",
)
"""verl keys accepted but not applied (one warning names them): they have no counterpart here."""

# verl's rollout section defaults these to the actor's values (``${oc.select:...actor.profiler.X}``).
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
_INTERPOLATION = re.compile(r"^\$\{.*\}$", re.DOTALL)
_INHERIT = object()
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


def _ignored(sub: str) -> bool:
    return any(sub == ignored or sub.startswith(ignored + ".") for ignored in VERL_IGNORED)


def is_verl_key(key: str) -> bool:
    """Whether ``key`` is one of verl's profiler keys (in a section, or verl-only without one)."""
    return _split(key) is not None


def is_meta(key: str) -> bool:
    """``_target_`` at any depth: hydra's class pointer, present in every verl section."""
    return key == "_target_" or key.endswith("._target_")


def skippable(key: str, value: Any) -> bool:
    """Keys that carry no setting: ``_target_``, and an empty mapping at a verl section or ignored path."""
    if is_meta(key):
        return True
    if not isinstance(value, Mapping) or value:
        return False
    where = _split(key)
    return (where is not None and _ignored(where[1])) or any(k.startswith(key + ".") for k in _KNOWN)


def is_string_key(key: str) -> bool:
    """verl keys whose override text is taken as written (a tool, a path, a command)."""
    where = _split(key)
    return where is not None and where[1] in _STRING_KEYS


def _assign(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` as an override does: it replaces the same key, what lies below it and any leaf above it."""
    for existing in [k for k in tree if k == key or k.startswith(key + ".") or key.startswith(k + ".")]:
        del tree[existing]
    tree[key] = value


def views(items: list[tuple[str, Any]], role: str | None) -> list[tuple[str, list[tuple[str, Any]]]]:
    """ProfilerConfig items for each role view to build: one for ``role``, else one per role section given.

    Native keys come last in every view, so they win over verl keys for the same field.
    """
    if role is not None and role not in ROLES:
        raise ValueError(f"'role' must be one of {', '.join(repr(r) for r in ROLES)}: {role!r}")
    tree: dict[str, Any] = {}
    for key, value in items:
        if not skippable(key, value):
            _assign(tree, key, value)
    native: list[tuple[str, Any]] = []
    sections: dict[str, dict[str, Any]] = {}
    ignored: list[str] = []
    for key, value in tree.items():
        where = _split(key)
        if where is None:
            native.append((key, value))
        elif _ignored(where[1]):
            ignored.append(key)
        elif not _META_NAME.match(where[1]):
            inherit = isinstance(value, str) and _INTERPOLATION.match(value)
            sections.setdefault(where[0], {})[where[1]] = _INHERIT if inherit else value
    if ignored:
        warnings.warn(
            f"verl profiler keys without a counterpart here were ignored: {', '.join(sorted(ignored))}",
            UserWarning,
            stacklevel=4,
        )
    if role is not None:
        chosen: list[str | None] = [_FUSED.get(role, role)]
    else:
        chosen = [name for name, section in ROLE_SECTIONS.items() if section in sections]
        if not chosen or BARE in sections:
            chosen.append(None)  # the bare section stands for any role
    native_top = dict(native)
    return [
        (ROLE_SECTIONS[name] if name else BARE, _View(sections, name).items(native_top) + native) for name in chosen
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


class _View:
    """One role's view of the collected sections."""

    def __init__(self, sections: dict[str, dict[str, Any]], role: str | None) -> None:
        self.sections = sections
        self.role = role

    def get(self, sub: str) -> tuple[bool, Any]:
        """``(given, value)`` of ``sub``, looked up from the most specific section to ``global_profiler``."""
        order = [ROLE_SECTIONS[self.role]] if self.role else []
        if self.role == "rollout" and sub in _ROLLOUT_FOLLOWS_ACTOR:
            order.append(ROLE_SECTIONS["actor"])
        for section in (*order, BARE, GLOBAL):
            value = self.sections.get(section, {}).get(sub, _INHERIT)
            if value is not _INHERIT:
                return True, value
        return False, None

    def items(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        given, tool = self.get("tool")
        if given:
            if tool not in _TOOLS:
                raise ValueError(
                    "verl 'tool' must be one of null, 'nsys', 'torch', 'torch_memory' to move over (npu and "
                    f"precision_debugger have no counterpart here): {tool!r}"
                )
            out.append(("tool", _TOOLS[tool]))
        selected = native.get("tool", _TOOLS[tool] if given else "torch")
        has_steps, steps = self.get("steps")
        if has_steps:
            # verl profiles no step when steps is null, whatever a role's enable says.
            out.append(("enable", False) if steps is None else ("steps", steps))
        for name in ("enable", "all_ranks", "save_path", "relocate_results"):
            given, value = self.get(name)
            if given and not (name == "enable" and has_steps and steps is None):
                out.append((name, value))
        given, ranks = self.get("ranks")
        if given:
            # verl profiles rank 0 when ranks is empty and all_ranks is false.
            out.append(("ranks", [0] if ranks in ([], ()) else ranks))
        if selected == "torch":
            out += self._torch()
        elif selected == "torch_memory":
            out += self._memory()
        elif selected == "nvtx":
            given, discrete = self.get("tool_config.nsys.discrete")
            if not given:  # verl's role nsys.discrete defaults to the trainer-wide one
                given, discrete = self.get("global_tool_config.nsys.discrete")
            if given:
                out.append(("discrete", discrete))
        return out + self._finish_hook(dict(out), native)

    def _torch(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        given, contents = self.get("tool_config.torch.contents")
        if given and contents not in ([], (), None):  # verl collects the default for []
            out.append(("contents", contents))
        given, discrete = self.get("tool_config.torch.discrete")
        if given:
            out.append(("discrete", discrete))
        schedule = []
        for name in _SCHEDULE:
            given, value = self.get(f"tool_config.torch.schedule.{name}")
            if given:
                schedule.append((f"schedule.{name}", value))
        # verl schedules only when active > 0; its default of all zeros means "no schedule".
        if dict(schedule).get("schedule.active", 0):
            out += schedule
        return out + self._token_window()

    def _memory(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for name, field in _MEMORY.items():
            given, value = self.get(f"tool_config.torch_memory.{name}")
            if not given:  # like nsys.discrete: the trainer-wide value unless the role sets its own
                given, value = self.get(f"global_tool_config.torch_memory.{name}")
            if given:
                out.append((field, value))
        return out

    def _token_window(self) -> list[tuple[str, Any]]:
        start, end = self.get(_TOKEN_START)[1], self.get(_TOKEN_END)[1]
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
        given, cmd = self.get("finish_hook_cmd")
        if not given or cmd is None:
            return []  # verl keeps the other finish_hook_* keys even when no command is set
        out: list[tuple[str, Any]] = [("finish_hook.cmd", cmd)]
        given, timeout = self.get("finish_hook_timeout_s")
        if given:
            out.append(("finish_hook.timeout_s", timeout))
        has_all, all_ranks = self.get("finish_hook_all_ranks")
        _, ranks = self.get("finish_hook_ranks")
        if ranks not in ([], (), None):
            out.append(("finish_hook.ranks", ranks))
        if has_all and all_ranks is not False:
            out.append(("finish_hook.all_ranks", all_ranks))
        elif ranks in ([], (), None):
            # verl runs the hook on the profiled ranks when no hook ranks are given.
            out.append(("finish_hook.ranks", native.get("ranks", resolved.get("ranks", [0]))))
            out.append(("finish_hook.all_ranks", native.get("all_ranks", resolved.get("all_ranks", False))))
        return out
