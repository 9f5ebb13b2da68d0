"""Validated, frozen profiler configuration.

:class:`ProfilerConfig`, :class:`Schedule` and :class:`FinishHook` check every
field at construction: a bad value raises ``ValueError`` (``TypeError`` for a
wrong type) naming the field, what is allowed and the value given.  They build
from nested mappings (:meth:`ProfilerConfig.from_dict`) and from dotted
overrides (:meth:`ProfilerConfig.from_overrides`), accepting verl's key names
(see ``docs/config.md``).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from instrument import ranks as _ranks
from instrument.config import _file as _config_file
from instrument.config import _verl
from instrument.config._memory import MemorySnapshots
from instrument.config._overrides import ADD, DELETE, format_value, parse_value, split_override, string_value
from instrument.config._validators import (
    CONTENTS,
    DIALECTS,
    HOOK_OUTPUTS,
    TOOLS,
    boolean,
    check_command,
    check_contents,
    check_path,
    check_timeout,
    int_at_least,
    int_tuple,
    is_int,
    known_tool,
    one_of,
    to_contents,
    to_path,
    to_sorted_tuple,
)
from instrument.config._validators import guesses_keywords as _guesses_keywords

__all__ = [
    "CONTENTS",
    "TOOLS",
    "SlowStep",
    "FinishHook",
    "MemorySnapshots",
    "ProfilerConfig",
    "Schedule",
    "parse_value",
]

_T = TypeVar("_T")
_M = TypeVar("_M")


def _from_mapping(cls: type[_T], value: Any, prefix: str) -> Any:
    """Build an attrs class from a mapping, naming unknown keys with a suggestion."""
    if isinstance(value, Mapping):
        names = [f.name for f in attrs.fields(cls)]  # type: ignore[arg-type]
        for key in value:
            if key not in names:
                raise ValueError(_unknown_key(f"{prefix}.{key}", [f"{prefix}.{n}" for n in names]))
        return cls(**value)
    return value


# --------------------------------------------------------------------------- value classes

_NO_SCHEDULE = "; schedule=None records every mini-batch of the stage"


@_guesses_keywords
@attrs.frozen
class Schedule:
    """Which mini-batches of a scheduled stage are recorded (``torch.profiler.schedule`` semantics).

    ``repeat=0`` repeats without end; the default of 1 keeps a long update loop from flooding the disk.
    """

    skip_first: int = attrs.field(default=0, validator=int_at_least(0, prefix="schedule."))
    wait: int = attrs.field(default=0, validator=int_at_least(0, prefix="schedule."))
    warmup: int = attrs.field(default=0, validator=int_at_least(0, prefix="schedule."))
    active: int = attrs.field(default=1, validator=int_at_least(1, prefix="schedule.", hint=_NO_SCHEDULE))
    repeat: int = attrs.field(default=1, validator=int_at_least(0, prefix="schedule."))
    skip_first_wait: bool = attrs.field(default=False, validator=boolean)


@_guesses_keywords
@attrs.frozen
class FinishHook:
    """One shell command run once after the last profiled step, on the chosen ranks, within ``timeout_s``."""

    cmd: str = attrs.field(validator=check_command)
    ranks: tuple[int, ...] = attrs.field(default=(0,), converter=to_sorted_tuple, validator=int_tuple(0))
    all_ranks: bool = attrs.field(default=False, validator=boolean)
    timeout_s: float = attrs.field(default=600, validator=check_timeout)
    output: str = attrs.field(default="stderr", validator=one_of(HOOK_OUTPUTS))
    """``"stderr"``: the hook's lines on stderr as ``[hook rank R] …``, then its exit status and
    duration; ``"log"``: to the ``instrument.finish_hook`` logger at INFO only."""

    def __attrs_post_init__(self) -> None:
        if not self.ranks and not self.all_ranks:
            raise ValueError("'finish_hook.ranks' must select at least one rank unless 'all_ranks' is true: ()")


def _to_window(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _check_token_window(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not (isinstance(value, tuple) and len(value) == 2 and all(is_int(v) for v in value)):
        raise TypeError(f"'{attribute.name}' must be a [first, last] pair of engine iterations or null: {value!r}")
    first, last = value
    if first < 0 or last < first:
        raise ValueError(f"'{attribute.name}' must satisfy 0 <= first <= last: {list(value)}")


def _to_schedule(value: Any) -> Any:
    return _from_mapping(Schedule, value, "schedule")


def _check_factor(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{attribute.name}' must be a number > 1: {value!r}")
    if not (math.isfinite(value) and value > 1):
        raise ValueError(f"'{attribute.name}' must be a finite number > 1: {value!r}")


@_guesses_keywords
@attrs.frozen
class SlowStep:
    """Profile the next ``steps`` steps of a rank whose step took ``factor`` x the median of its last ``window``."""

    factor: float = attrs.field(default=1.5, validator=_check_factor)
    window: int = attrs.field(default=20, validator=int_at_least(2))
    steps: int = attrs.field(default=1, validator=int_at_least(1))


def _to_trigger(value: Any) -> Any:
    return _from_mapping(SlowStep, value, "trigger")


def _to_finish_hook(value: Any) -> Any:
    return _from_mapping(FinishHook, value, "finish_hook")


def _to_memory(value: Any) -> Any:
    return _from_mapping(MemorySnapshots, value, "memory")


class _DefaultContents(tuple[str, ...]):
    """``ProfilerConfig.contents`` the user left out: the same tuple, marked (it survives pickling and
    ``attrs.evolve``), so a recorder can tell "CUDA when there is one" from a ``cuda`` the user asked for."""

    __slots__ = ()


_DEFAULT_CONTENTS = _DefaultContents(("cpu", "cuda"))


def contents_named(contents: tuple[str, ...]) -> bool:
    """Whether ``contents`` (a ``ProfilerConfig``'s, or a trace spec's copy of it) was given, not the default."""
    return not isinstance(contents, _DefaultContents)


def _to_contents(value: Any) -> Any:
    return value if isinstance(value, _DefaultContents) else to_contents(value)


def _optional_instance(cls: type) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"'{attribute.name}' must be a {cls.__name__}, a mapping or null: {value!r}")

    return check


@_guesses_keywords
@attrs.frozen
class ProfilerConfig:
    """What to profile (steps, ranks, contents, schedule), where to write it and what to run at the end."""

    enable: bool = attrs.field(default=True, validator=boolean)
    tool: str = attrs.field(default="torch", validator=known_tool)
    steps: tuple[int, ...] | None = attrs.field(
        default=None, converter=to_sorted_tuple, validator=int_tuple(1, allow_none=True)
    )
    ranks: tuple[int, ...] = attrs.field(default=(0,), converter=to_sorted_tuple, validator=int_tuple(0))
    save_path: str = attrs.field(default="outputs/profile", converter=to_path, validator=check_path)
    all_ranks: bool = attrs.field(default=False, validator=boolean)
    discrete: bool = attrs.field(default=True, validator=boolean)
    contents: tuple[str, ...] = attrs.field(
        default=_DEFAULT_CONTENTS, converter=_to_contents, validator=check_contents
    )  # the default is marked: contents_named()
    schedule: Schedule | None = attrs.field(
        default=None, converter=_to_schedule, validator=_optional_instance(Schedule)
    )
    relocate_results: bool = attrs.field(default=True, validator=boolean)
    finish_hook: FinishHook | None = attrs.field(
        default=None, converter=_to_finish_hook, validator=_optional_instance(FinishHook)
    )
    token_window: tuple[int, int] | None = attrs.field(
        default=None, converter=_to_window, validator=_check_token_window
    )
    keep_engine_peers: bool = attrs.field(default=False, validator=boolean)
    """Relocation keeps every trace of a driven rollout replica, not only the profiled ranks' (docs/rollout.md)."""
    dialect: str = attrs.field(default="instrument", validator=one_of(DIALECTS))
    """Whose rules apply where verl 0.9.1 and instrument differ: ``verl`` for a configuration in verl's keys
    (docs/config.md, "Moving from verl")."""
    metrics: bool = attrs.field(default=False, validator=boolean)
    metrics_rank_label: bool = attrs.field(default=False, validator=boolean)
    trigger: SlowStep | None = attrs.field(default=None, converter=_to_trigger, validator=_optional_instance(SlowStep))
    on_demand: bool = attrs.field(default=False, validator=boolean)
    max_triggered: int = attrs.field(default=3, validator=int_at_least(0))
    memory: MemorySnapshots | None = attrs.field(  # docs/memory.md
        default=None, converter=_to_memory, validator=_optional_instance(MemorySnapshots)
    )
    timeline: bool = attrs.field(default=True, validator=boolean)  # docs/timeline.md: every step, every rank

    def __attrs_post_init__(self) -> None:
        sched = self.schedule
        if self.dialect == "verl" and not self.discrete and sched is not None and sched.repeat == 0:
            # verl 0.9.1's continuous trace takes ``repeat or 1`` (_resolve_continuous_schedule_kwargs)
            object.__setattr__(self, "schedule", attrs.evolve(sched, repeat=1))
        if self.active:
            if self.steps == ():
                raise ValueError("'steps' must list at least one step, or be null for every step: []")
            if not self.ranks and not self.all_ranks:
                raise ValueError("'ranks' must select at least one rank unless 'all_ranks' is true: []")

    @property
    def active(self) -> bool:
        """Whether this configuration profiles anything at all."""
        return self.enable and self.tool != "none"

    def profiles_step(self, step: int) -> bool:
        """Whether RL step ``step`` (1-based) is profiled."""
        return self.active and (self.steps is None or step in self.steps)

    def profiles_rank(self, rank: int) -> bool:
        """Whether global rank ``rank`` is profiled."""
        return self.active and _ranks.is_profiled_rank(rank, self.ranks, self.all_ranks)

    # ----------------------------------------------------------------- building

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any], *, role: str | None = None) -> ProfilerConfig:
        """Build from a nested mapping (or dotted keys); verl's key names are accepted too.

        ``role`` (``actor``, ``rollout``, ``ref``, ``critic`` or a fused ``actor_rollout[_ref]``)
        builds that role's view of verl's role sections; without it, the sections given are
        combined with :meth:`union` (``docs/config.md``).
        """
        if not isinstance(mapping, Mapping):
            raise TypeError(f"configuration must be a mapping: {mapping!r}")
        return cls._from_flat(list(_flatten(_verl.sectioned(mapping))), role)

    @classmethod
    def from_overrides(
        cls, overrides: Iterable[str], base: Mapping[str, Any] | None = None, *, role: str | None = None
    ) -> ProfilerConfig:
        """Build from ``"dotted.key=value"`` strings set over ``base``; ``role`` as in :meth:`from_dict`.

        An override replaces the same key of ``base`` (and anything below it); then all keys are
        resolved together, so distinct keys mean the same in any order. Values read as YAML-ish
        scalars and flat lists (``steps=[1,2]``, ``discrete=false``); string fields such as
        ``finish_hook.cmd`` keep the text as written. hydra's forms work too: ``+key=v`` adds a key
        that is not set yet, ``++key=v`` sets it either way, ``~key`` deletes it and what lies below
        (``~key=v`` only while its value is ``v``).
        """
        if isinstance(overrides, str):
            raise TypeError(f"overrides must be a list of 'key=value' strings, not one string: {overrides!r}")
        tree = _verl.collect(_flatten(_verl.sectioned(base))) if base is not None else {}
        for override in overrides:
            op, key, text = split_override(override)
            string = key in _STRING_KEYS or _verl.is_string_key(key)
            value = None if text is None else string_value(text) if string else parse_value(text)
            present = [k for k in tree if k == key or k.startswith(key + ".")]
            if op == DELETE:
                if not (_verl.skippable(key, None) or _verl.prefixes_a_key(key) or key in _NESTED):
                    _check_key(key)
                if text is not None and present != [key]:
                    raise ValueError(f"{override!r} deletes {key!r} only while it is set to that value: not set")
                if text is not None and tree[key] != value:
                    raise ValueError(f"{override!r} deletes {key!r} only while it is set to that value: {tree[key]!r}")
                for existing in present:  # a key not set is deleted already: verl's base may have had it
                    del tree[existing]
                continue
            if not _verl.skippable(key, value):
                _check_key(key)
            if op == ADD and present:
                raise ValueError(f"{override!r} adds {key!r}, which is already set; '++{key}=...' sets it either way")
            _verl.set_key(tree, key, value)
        # without a base the overrides stand for verl's composed ppo_trainer (its rollout follows the actor)
        return cls._from_flat(list(tree.items()), role, composed=base is None)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> ProfilerConfig:
        """Read a YAML or JSON file (a mapping, as :meth:`from_dict` takes) and apply dotted ``overrides``.

        Any problem is one ``ValueError`` line (``TypeError`` for a wrong type) naming the file when
        the file is at fault, with line and column for a parse error; files over 256 KiB, 10,000
        values or 32 levels of nesting are refused. YAML needs PyYAML (``instrument-rl[yaml]``).
        """
        return _config_file.load(path, overrides, cls.from_overrides)

    @classmethod
    def _from_flat(
        cls, items: list[tuple[str, Any]], role: str | None = None, composed: bool = False
    ) -> ProfilerConfig:
        for key, value in items:
            if not _verl.skippable(key, value):
                _check_key(key)
        views = _verl.views(items, role, composed=composed)
        return _verl.combine([(label, cls._from_items(view)) for label, view in views])

    @classmethod
    def _from_items(cls, items: list[tuple[str, Any]]) -> ProfilerConfig:
        top: dict[str, Any] = {}
        for key, value in items:
            head, _, tail = key.partition(".")
            if tail:
                nested = top.get(head)
                if not isinstance(nested, dict):
                    nested = {} if nested is None else attrs.asdict(nested) if attrs.has(type(nested)) else {}
                    top[head] = nested
                nested[tail] = value
            elif isinstance(value, Mapping):
                top[head] = dict(value)
            else:
                top[head] = value
        return cls(**top)

    def to_dict(self) -> dict[str, Any]:
        """A plain nested mapping that :meth:`from_dict` turns back into this configuration."""
        return attrs.asdict(self)

    def to_overrides(self) -> list[str]:
        """``key=value`` strings that :meth:`from_overrides` turns back into this configuration."""
        out = []
        for key, value in _flatten(self.to_dict()):
            out.append(f"{key}={format_value(value)}")
        return out

    # ----------------------------------------------------------------- fused roles

    def union(self, other: ProfilerConfig) -> ProfilerConfig:
        """Profile what either role asks for (a fused worker serving both)."""
        return _merge(self, other, union=True)

    def intersect(self, other: ProfilerConfig) -> ProfilerConfig:
        """Profile only what both roles ask for."""
        return _merge(self, other, union=False)


# --------------------------------------------------------------------------- union / intersect


def _same(field: str, a: Any, b: Any) -> Any:
    if a != b:
        raise ValueError(f"cannot combine configurations: '{field}' differs ({a!r} vs {b!r})")
    return a


def _merge_selection(a: ProfilerConfig | FinishHook, b: ProfilerConfig | FinishHook, union: bool) -> dict[str, Any]:
    """Merge ``ranks`` / ``all_ranks`` of two configs or two hooks."""
    if union or (a.all_ranks and b.all_ranks):
        return {"all_ranks": a.all_ranks or b.all_ranks, "ranks": sorted(set(a.ranks) | set(b.ranks))}
    if a.all_ranks or b.all_ranks:
        return {"all_ranks": False, "ranks": sorted(b.ranks if a.all_ranks else a.ranks)}
    return {"all_ranks": False, "ranks": sorted(set(a.ranks) & set(b.ranks))}


def _merge_steps(a: tuple[int, ...] | None, b: tuple[int, ...] | None, union: bool) -> tuple[int, ...] | None:
    if union:
        return None if a is None or b is None else tuple(sorted(set(a) | set(b)))
    if a is None or b is None:
        return b if a is None else a
    return tuple(sorted(set(a) & set(b)))


def _merge_schedule(a: _M | None, b: _M | None, union: bool, field: str = "schedule") -> _M | None:
    if a is None or b is None:
        # No schedule records the whole stage: more than any schedule, so it wins a union.
        if union:
            return None
        return b if a is None else a
    return _same(field, a, b)  # type: ignore[no-any-return]


def _merge_optional(a: _M | None, b: _M | None, union: bool, field: str) -> _M | None:
    """A feature either side turns on: a union keeps it, an intersection only if both have it."""
    if a is None or b is None:
        return (b if a is None else a) if union else None
    return _same(field, a, b)  # type: ignore[no-any-return]


def _merge_hooks(a: FinishHook | None, b: FinishHook | None, union: bool) -> FinishHook | None:
    if a is None or b is None:
        return (b if a is None else a) if union else None
    selection = _merge_selection(a, b, union)
    if not selection["ranks"] and not selection["all_ranks"]:
        return None
    timeout = max(a.timeout_s, b.timeout_s) if union else min(a.timeout_s, b.timeout_s)
    output = _same("finish_hook.output", a.output, b.output)
    return FinishHook(cmd=_same("finish_hook.cmd", a.cmd, b.cmd), timeout_s=timeout, output=output, **selection)


# Every field of ProfilerConfig must appear here, so a new field cannot be dropped silently
# (tests check the key set).
_MERGE_RULES: dict[str, Callable[[ProfilerConfig, ProfilerConfig, bool], Any]] = {
    "enable": lambda a, b, union: True,
    "tool": lambda a, b, union: _same("tool", a.tool, b.tool),
    "steps": lambda a, b, union: _merge_steps(a.steps, b.steps, union),
    "ranks": lambda a, b, union: _merge_selection(a, b, union)["ranks"],
    "all_ranks": lambda a, b, union: _merge_selection(a, b, union)["all_ranks"],
    "save_path": lambda a, b, union: _same("save_path", a.save_path, b.save_path),
    "discrete": lambda a, b, union: _same("discrete", a.discrete, b.discrete),
    "contents": lambda a, b, union: (
        a.contents  # neither role named it: still the default
        if not (contents_named(a.contents) or contents_named(b.contents))
        else [c for c in CONTENTS if (c in a.contents) or (union and c in b.contents)]
        if union
        else [c for c in CONTENTS if c in a.contents and c in b.contents]
    ),
    "schedule": lambda a, b, union: _merge_schedule(a.schedule, b.schedule, union),
    "relocate_results": lambda a, b, union: (
        a.relocate_results or b.relocate_results if union else a.relocate_results and b.relocate_results
    ),
    "finish_hook": lambda a, b, union: _merge_hooks(a.finish_hook, b.finish_hook, union),
    "metrics": lambda a, b, union: a.metrics or b.metrics if union else a.metrics and b.metrics,
    "metrics_rank_label": lambda a, b, union: (
        a.metrics_rank_label or b.metrics_rank_label if union else a.metrics_rank_label and b.metrics_rank_label
    ),
    "trigger": lambda a, b, union: _merge_optional(a.trigger, b.trigger, union, "trigger"),
    "on_demand": lambda a, b, union: a.on_demand or b.on_demand if union else a.on_demand and b.on_demand,
    "timeline": lambda a, b, union: a.timeline or b.timeline if union else a.timeline and b.timeline,
    "max_triggered": lambda a, b, union: (
        max(a.max_triggered, b.max_triggered) if union else min(a.max_triggered, b.max_triggered)
    ),
    # Like a schedule: no window records every engine iteration, so it wins a union.
    "token_window": lambda a, b, union: _merge_schedule(a.token_window, b.token_window, union, "token_window"),
    "keep_engine_peers": lambda a, b, union: (
        a.keep_engine_peers or b.keep_engine_peers if union else a.keep_engine_peers and b.keep_engine_peers
    ),
    "dialect": lambda a, b, union: _same("dialect", a.dialect, b.dialect),
    "memory": lambda a, b, union: _merge_optional(a.memory, b.memory, union, "memory"),
}


def _merge(a: ProfilerConfig, b: ProfilerConfig, union: bool) -> ProfilerConfig:
    if not isinstance(b, ProfilerConfig):
        raise TypeError(f"can only combine with a ProfilerConfig: {b!r}")
    if not (a.active and b.active):
        if union:
            return a if a.active or not b.active else b
        return a if not a.active else b
    merged = {name: rule(a, b, union) for name, rule in _MERGE_RULES.items()}
    if merged["steps"] == () or (not merged["ranks"] and not merged["all_ranks"]):
        # The roles share no profiled step or rank: the fused worker profiles nothing.
        return attrs.evolve(a, enable=False)
    return ProfilerConfig(**merged)


# --------------------------------------------------------------------------- keys and values

_NESTED = {"schedule": Schedule, "finish_hook": FinishHook, "trigger": SlowStep, "memory": MemorySnapshots}


def _valid_keys() -> list[str]:
    keys = []
    for field in attrs.fields(ProfilerConfig):
        if field.name in _NESTED:
            keys.append(field.name)
            keys.extend(f"{field.name}.{f.name}" for f in attrs.fields(_NESTED[field.name]))
        else:
            keys.append(field.name)
    return keys


_KEYS = _valid_keys()
# Override values for these keys are taken as written ("tool=none" is the tool, a command may hold
# brackets and commas); only a bare null is null.
_STRING_KEYS = frozenset({"tool", "save_path", "finish_hook.cmd", "dialect"})  # and their verl spellings


def _unknown_key(key: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(candidates)}"
    return f"unknown configuration key {key!r}{hint}"


def _check_key(key: str) -> None:
    if key not in _KEYS and not _verl.is_verl_key(key) and not _verl.is_meta(key):
        # A typo in a role path is matched against that path's keys; the listing stays short.
        close = difflib.get_close_matches(key, [*_KEYS, *_verl.SPELLINGS], n=1, cutoff=0.6)
        if close:
            raise ValueError(f"unknown configuration key {key!r}; did you mean {close[0]!r}?")
        raise ValueError(_unknown_key(key, _KEYS + [f"global_profiler.{k}" for k in _verl.VERL_KEYS]))


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Yield ``(dotted.key, value)`` pairs; stops at known keys so a nested value object stays whole."""
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"configuration keys must be strings: {key!r}")
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if not value:
                yield dotted, {}
            yield from _flatten(value, dotted + ".")
        elif attrs.has(type(value)):
            yield from _flatten(attrs.asdict(value), dotted + ".")
        else:
            yield dotted, value
