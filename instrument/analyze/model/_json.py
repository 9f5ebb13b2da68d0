"""Reading ``instrument analyze --json`` back: field readers that name what is wrong, for the ``from_json`` of
every value (:meth:`~._report.Report.from_dict` is their entry).

Keys a newer writer adds are ignored and keys an older one lacked take their defaults, so a saved analysis
stays readable across versions; a value of the wrong type is a ``ValueError`` naming the key and the value
(``'wall_ms' must be a number (got '9')``), never a ``KeyError`` or a ``TypeError`` from deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MISSING",
    "boolean",
    "integer",
    "mapping",
    "number",
    "opt_int",
    "opt_number",
    "opt_str",
    "pair",
    "rows",
    "rows_or_pairs",
    "text",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""The default of a required key."""


def _get(data: Mapping[str, Any], key: str, default: Any, what: str) -> Any:
    value = data.get(key, default)
    if value is MISSING:
        raise ValueError(f"{what or repr(key)} is missing")
    return value


def number(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> float:
    """A finite number (an int is one; a bool is not)."""
    value = _get(data, key, default, what)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what or repr(key)} must be a number (got {value!r})")
    return float(value)


def opt_number(data: Mapping[str, Any], key: str, what: str = "") -> float | None:
    """A finite number or ``null`` (absent: ``None``)."""
    return None if data.get(key) is None else number(data, key, what=what)


def integer(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> int:
    """An int (a bool is not one)."""
    value = _get(data, key, default, what)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what or repr(key)} must be an int (got {value!r})")
    return value


def opt_int(data: Mapping[str, Any], key: str, what: str = "") -> int | None:
    """An int or ``null`` (absent: ``None``)."""
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{what or repr(key)} must be an int or null (got {value!r})")
    return value


def text(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> str:
    """A string."""
    value = _get(data, key, default, what)
    if not isinstance(value, str):
        raise ValueError(f"{what or repr(key)} must be a string (got {value!r})")
    return value


def opt_str(data: Mapping[str, Any], key: str, what: str = "") -> str | None:
    """A string or ``null`` (absent: ``None``)."""
    return None if data.get(key) is None else text(data, key, what=what)


def boolean(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> bool:
    """``true`` or ``false``."""
    value = _get(data, key, default, what)
    if not isinstance(value, bool):
        raise ValueError(f"{what or repr(key)} must be true or false (got {value!r})")
    return value


def rows(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> list[Mapping[str, Any]]:
    """A list of objects."""
    value = _get(data, key, default, what)
    if not isinstance(value, list) or not all(isinstance(r, Mapping) for r in value):
        raise ValueError(f"{what or repr(key)} must be a list of objects")
    return value


def mapping(data: Mapping[str, Any], key: str, default: Any = MISSING, what: str = "") -> Mapping[str, Any]:
    """An object."""
    value = _get(data, key, default, what)
    if not isinstance(value, Mapping):
        raise ValueError(f"{what or repr(key)} must be an object (got {value!r})")
    return value


def rows_or_pairs(data: Mapping[str, Any], key: str) -> list[Any]:
    """A list (of window pairs; absent: empty)."""
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key!r} must be a list (got {value!r})")
    return value


def pair(value: Any, what: str) -> tuple[int, int]:
    """A ``[first, last]`` pair of ints (a window)."""
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{what} must be a pair of ints (got {value!r})")
    return (value[0], value[1])
