"""attrs validators and converters of the configuration classes: each message names the field,
the allowed values and the value given."""

from __future__ import annotations

import collections
import difflib
import functools
import math
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from instrument import _tools

__all__ = [
    "CONTENTS",
    "DIALECTS",
    "HOOK_OUTPUTS",
    "TOOLS",
    "boolean",
    "check_command",
    "check_contents",
    "check_path",
    "check_timeout",
    "guesses_keywords",
    "int_at_least",
    "int_tuple",
    "is_int",
    "known_tool",
    "one_of",
    "to_contents",
    "to_path",
    "to_sorted_tuple",
]

TOOLS = ("none", *_tools.BUILT_IN_TOOLS)
"""``none`` and the built-in recorders; ``ProfilerConfig.tool`` also takes registered ones (``registered_tools()``)
and several joined by ``+`` (``"torch+torch_memory"``)."""

CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")
"""Allowed values in ``ProfilerConfig.contents``, in canonical order."""

HOOK_OUTPUTS = ("stderr", "log")
"""Allowed values of ``FinishHook.output``: the hook's lines on stderr, or in the log only."""

_T = TypeVar("_T")

DIALECTS = ("instrument", "verl")
"""Allowed values of ``ProfilerConfig.dialect``: instrument's own rules, or verl 0.9.1's."""


# --------------------------------------------------------------------------- validators


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_at_least(minimum: int, *, prefix: str = "", hint: str = "") -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """``prefix`` names the field where the user writes it (``schedule.``); ``hint`` follows a value too small."""

    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not is_int(value):
            raise TypeError(f"'{prefix}{attribute.name}' must be an int >= {minimum}: {value!r}")
        if value < minimum:
            raise ValueError(f"'{prefix}{attribute.name}' must be >= {minimum}: {value}{hint}")

    return check


def boolean(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"'{attribute.name}' must be true or false: {value!r}")


def one_of(allowed: Sequence[str]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    listing = ", ".join(repr(a) for a in allowed)

    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"'{attribute.name}' must be one of {listing}: {value!r}")

    return check


def known_tool(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """``none``, or registered recorder names (read now: the registry may have grown) joined by ``+``, each once.

    The registry (:mod:`instrument._tools`) sits below this package: config never imports the recorders.
    """
    if value == "none":
        return
    field = attribute.name
    if not isinstance(value, str):
        raise ValueError(f"'{field}' must be 'none' or recorder names such as 'torch': {value!r}")
    seen: set[str] = set()
    for name in value.split("+"):
        if name in seen:
            raise ValueError(f"'{field}' must name each recorder once: {name!r} is twice in {value!r}")
        if name == "none":
            raise ValueError(f"'{field}' cannot combine 'none' with recorders: {value!r}")
        seen.add(name)
        try:
            _tools.registration(name)
        except KeyError:
            known = ", ".join(map(repr, _tools.registered_tools()))
            if name == value:
                raise ValueError(
                    f"'{field}' must be one of 'none', {known}, or recorder names joined by '+': {value!r}"
                ) from None
            raise ValueError(
                f"'{field}' joins recorders with '+': {name!r} in {value!r} is not one of {known}"
            ) from None


def int_tuple(minimum: int, *, allow_none: bool = False) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and allow_none:
            return
        if not isinstance(value, tuple) or not all(is_int(v) for v in value):
            kind = "a list of ints or null" if allow_none else "a list of ints"
            raise TypeError(f"'{attribute.name}' must be {kind}: {value!r}{_as_list_hint(value)}")
        for v in value:
            if v < minimum:
                raise ValueError(f"'{attribute.name}' must hold values >= {minimum}: {v}")
        repeated = sorted(v for v, n in collections.Counter(value).items() if n > 1)  # linear: 10^5 steps fine
        if repeated:
            raise ValueError(f"'{attribute.name}' must not repeat a value: {repeated} given more than once")

    return check


def _as_list_hint(value: Any) -> str:
    """``"2,4"`` (a shell or an override without brackets) -> ``" (did you mean [2,4]?)"``."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.strip().strip("()").split(",")]
        if parts and all(p.isascii() and p.isdigit() for p in parts):
            return f" (did you mean [{','.join(parts)}]?)"
    return ""


def to_sorted_tuple(value: Any) -> Any:
    """Lists (and a single int) become a sorted tuple; anything else is left for the validator."""
    if is_int(value):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = tuple(value)
        return tuple(sorted(items)) if all(is_int(v) for v in items) else items
    return value


def to_contents(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple, set, frozenset)):
        items = tuple(value)
        known = [c for c in CONTENTS if c in items]
        return tuple(known) if len(known) == len(set(items)) else items
    return value


def check_contents(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple):
        raise TypeError(f"'{attribute.name}' must be a list of strings: {value!r}")
    allowed = ", ".join(repr(c) for c in CONTENTS)
    for item in value:
        if item not in CONTENTS:
            raise ValueError(f"'{attribute.name}' items must be among {allowed}: {item!r}")


def check_path(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be a path: {value!r}")
    if not value.strip():
        raise ValueError(f"'{attribute.name}' must be a non-empty path: {value!r}")
    if "\0" in value:  # the OS refuses it only at the first file written, after configure()
        raise ValueError(f"'{attribute.name}' must be a path without NUL bytes: {value!r}")
    blocking = _file_in_the_way(value)
    if blocking is not None:  # else the first trace fails with a bare FileExistsError, after configure()
        where = "" if blocking == value else f" ({blocking!r} is)"
        raise ValueError(f"'{attribute.name}' is a file, not a directory: {value!r}{where}")


def _file_in_the_way(path: str) -> str | None:
    """The existing non-directory that ``path`` or one of its parents is, or ``None`` (absent or unreadable too)."""
    for candidate in [path, *map(str, Path(path).parents)]:
        try:
            mode = os.stat(candidate).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there yet, or under a file: look further up
        except (OSError, ValueError):
            return None  # cannot tell (permissions, a name too long): the run reports what it meets
        return None if stat.S_ISDIR(mode) else candidate
    return None


def to_path(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def check_command(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be a shell command string: {value!r}")
    if not value.strip():
        raise ValueError(f"'{attribute.name}' must be a non-empty shell command: {value!r}")
    if "\0" in value:  # exec refuses it only when the hook runs, after the last step
        raise ValueError(f"'{attribute.name}' must be a shell command without NUL bytes: {value!r}")


def check_timeout(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{attribute.name}' must be a number of seconds > 0: {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{attribute.name}' must be a finite number of seconds > 0: {value!r}")


def _unknown_keyword(cls: type, key: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)  # a keyword list is short: guess more boldly
    hint = f"did you mean {close[0]!r}?" if close else f"valid keywords: {', '.join(names)}"
    return f"{cls.__name__}() got an unexpected keyword argument {key!r}; {hint}"


def guesses_keywords(cls: type[_T]) -> type[_T]:
    """Unknown keywords still raise ``TypeError``, but with a "did you mean" (as the overrides path says)."""
    init = cls.__init__
    names = tuple(f.alias for f in attrs.fields(cls))  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - it is the class's __init__
        for key in kwargs:
            if key not in names:
                raise TypeError(_unknown_keyword(cls, key, names))
        init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)  # noqa: B010 - mypy refuses assigning a method
    return cls
