"""Argument checks shared by the pure modules (standard library only, like them)."""

from __future__ import annotations

__all__ = ["check_int"]


def check_int(field: str, value: int, minimum: int) -> None:
    """Raise ``TypeError`` unless ``value`` is an int (not a bool), ``ValueError`` if below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{field}' must be an int: {value!r}")
    if value < minimum:
        raise ValueError(f"'{field}' must be >= {minimum}: {value}")
