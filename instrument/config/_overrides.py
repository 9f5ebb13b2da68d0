"""Overrides as text: ``steps=[1,2]``, ``schedule.active=2``, ``tool=null`` (read and written), and hydra's
``+key=value`` (add), ``++key=value`` (add or replace) and ``~key`` / ``~key=value`` (delete)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ADD", "DELETE", "FORCE", "SET", "Override", "format_value", "parse_value", "split_override", "string_value"]

SET, ADD, FORCE, DELETE = "set", "add", "force", "delete"


class Override(NamedTuple):
    """One override, split: what it does (``SET``, ``ADD``, ``FORCE``, ``DELETE``), its key and value text."""

    op: str
    key: str
    text: str | None
    """The text after ``=``; ``None`` for a ``~key`` without a value."""


def split_override(override: str) -> Override:
    """Split ``key=v``, ``+key=v``, ``++key=v``, ``~key`` or ``~key=v`` (hydra's forms), or say what is wrong."""
    text = str(override)
    op, rest = (
        (FORCE, text[2:])
        if text.startswith("++")
        else (ADD, text[1:])
        if text.startswith("+")
        else (DELETE, text[1:])
        if text.startswith("~")
        else (SET, text)
    )
    key, sep, value = rest.partition("=")
    key = key.strip()
    if op == DELETE:
        if not key or key.startswith(("+", "~")):
            raise ValueError(f"a delete override must look like '~key' or '~key=value': {override!r}")
        return Override(op, key, value if sep else None)
    if not sep or not key or key.startswith(("+", "~")):
        forms = "'key=value', '+key=value', '++key=value' or '~key'"
        raise ValueError(f"override must look like {forms}: {override!r}")
    return Override(op, key, value)


def parse_value(text: str) -> Any:
    """Read an override value: ``null``, ``true``/``false``, ints, floats, quoted strings and flat lists."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [] if not inner else [_parse_scalar(item) for item in _split_list(inner)]
    if text.startswith("{"):
        raise ValueError(f"mappings are set key by key (e.g. 'schedule.active=2'): {text!r}")
    return _parse_scalar(text)


def _split_list(inner: str) -> list[str]:
    items, current, quote = [], "", ""
    for char in inner:
        if quote:
            current += char
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
            current += char
        elif char == ",":
            items.append(current)
            current = ""
        else:
            current += char
    if quote:
        raise ValueError(f"unterminated quote in list: [{inner}]")
    items.append(current)
    return items


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def string_value(text: str) -> str | None:
    """A string field's override: the text as written, unquoted; a bare ``null`` or ``~`` is null."""
    return None if text.strip() in ("null", "~") else _unquote(text)


def _parse_scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered in ("null", "none", "~", ""):
        return None
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def format_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, str):
        # Quote only what reading back would change (outer quotes, edge spaces, empty).
        return f"'{value}'" if not value or value != string_value(value) else value
    return repr(value)
