"""OmegaConf interpolations in verl's profiler values, resolved within the document given.

verl's shipped YAMLs link keys to others (``tool: ${oc.select:global_profiler.tool,null}``) and verl
resolves them over the whole configuration before a worker reads it. :func:`resolve` does the same
over a flat document (dotted key -> value): with OmegaConf itself when it is installed
(``instrument-rl[omegaconf]``), else with the forms verl uses, ``${oc.select:KEY}``,
``${oc.select:KEY,DEFAULT}`` and ``${KEY}`` (absolute keys, nested and inside text); anything else
is named in a ``ValueError``. Standard library only; OmegaConf is imported when first needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MISSING", "has_interpolation", "omegaconf_available", "resolve"]

MISSING = "???"
"""OmegaConf's "mandatory, not set" value: ``oc.select`` takes its default for it."""

_KEY = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")
_ABSENT = object()


def has_interpolation(value: Any) -> bool:
    """Whether ``value`` is text holding a ``${...}`` (an unescaped one)."""
    return isinstance(value, str) and "${" in value.replace("\\${", "")


def omegaconf_available() -> bool:
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(document: Mapping[str, Any], keys: Iterable[str], *, use_omegaconf: bool | None = None) -> dict[str, Any]:
    """The values of ``keys`` of the flat ``document``, their interpolations resolved within it.

    ``use_omegaconf`` ``None`` uses OmegaConf when it is installed. A failure is a ``ValueError``
    naming the key, its value and why.
    """
    wanted = [k for k in keys if has_interpolation(document.get(k))]
    if not wanted:
        return {}
    if use_omegaconf is None:
        use_omegaconf = omegaconf_available()
    if use_omegaconf:
        return _with_omegaconf(document, wanted)
    resolver = _Resolver(document)
    return {key: resolver.value_of(key) for key in wanted}


# --------------------------------------------------------------------------- with OmegaConf


def _nested(document: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in document.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if isinstance(value, Mapping) and not value and isinstance(node.get(leaf), dict):
            continue  # an empty mapping beside its own keys (as the flattening yields) adds nothing
        node[leaf] = dict(value) if isinstance(value, Mapping) else value
    return out


def _with_omegaconf(document: Mapping[str, Any], keys: list[str]) -> dict[str, Any]:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        config = OmegaConf.create(_nested(document))
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        raise ValueError(f"cannot read the configuration for its interpolations: {_line(exc)}") from None
    out: dict[str, Any] = {}
    for key in keys:
        try:
            value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except (OmegaConfBaseException, ValueError, TypeError) as exc:
            raise ValueError(f"cannot resolve {key!r} ({document[key]!r}): {_line(exc)}") from None
        out[key] = value
    return out


def _line(exc: Exception) -> str:
    return " ".join(str(exc).split("\n")[0].split()) or type(exc).__name__


# --------------------------------------------------------------------------- without OmegaConf


class _Resolver:
    """Resolves the simple forms over a flat document, following links with cycle detection."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.active: list[str] = []

    def value_of(self, key: str) -> Any:
        value = self.lookup(key)
        if value is _ABSENT:
            raise ValueError(f"interpolation key {key!r} not found")
        return value

    def lookup(self, key: str) -> Any:
        """The resolved value at ``key`` (a mapping when keys lie below it), or ``_ABSENT``."""
        if key in self.active:
            chain = " -> ".join([*self.active[self.active.index(key) :], key])
            raise ValueError(f"interpolation cycle: {chain}")
        self.active.append(key)
        try:
            if key in self.document:
                return self.resolve_value(key, self.document[key])
            prefix = key + "."
            below = {k[len(prefix) :]: k for k in self.document if k.startswith(prefix)}
            if not below:
                return _ABSENT
            return _nested({sub: self.resolve_value(full, self.document[full]) for sub, full in below.items()})
        finally:
            self.active.pop()

    def resolve_value(self, key: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: self.resolve_value(f"{key}.{k}", v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve_value(key, v) for v in value]
        if not has_interpolation(value):
            return value.replace("\\${", "${") if isinstance(value, str) else value
        try:
            return self.text(value)
        except _UnsupportedError as exc:
            raise ValueError(
                f"cannot resolve {key!r} ({value!r}): {exc} is not one of the forms resolved without OmegaConf "
                "(${oc.select:KEY}, ${oc.select:KEY,DEFAULT}, ${KEY}); pip install 'instrument-rl[omegaconf]'"
            ) from None
        except ValueError as exc:
            if str(exc).startswith("cannot resolve "):
                raise
            raise ValueError(f"cannot resolve {key!r} ({value!r}): {exc}") from None

    def text(self, text: str) -> Any:
        """A value with interpolations: the interpolated value itself when it is the whole text, else a string."""
        pieces = _pieces(text)
        if len(pieces) == 1 and isinstance(pieces[0], _Interp):
            return self.interpolation(pieces[0].body)
        return "".join(p if isinstance(p, str) else _as_text(self.interpolation(p.body)) for p in pieces)

    def interpolation(self, body: str) -> Any:
        body = body.strip()
        if body.startswith("oc.select:"):
            args = _split_args(body[len("oc.select:") :])
            if len(args) not in (1, 2) or not _KEY.match(args[0].strip()):
                raise _UnsupportedError("${" + body + "}")
            value = self.lookup(args[0].strip())
            if value is _ABSENT or value == MISSING:
                return self.element(args[1]) if len(args) == 2 else None
            return value
        if _KEY.match(body):
            value = self.lookup(body)
            if value is _ABSENT:
                raise ValueError(f"interpolation key {body!r} not found")
            if value == MISSING:
                raise ValueError(f"interpolation key {body!r} is missing (???)")
            return value
        raise _UnsupportedError("${" + body + "}")

    def element(self, text: str) -> Any:
        """An OmegaConf grammar element (a default): null, bool, number, quoted text, list, interpolation."""
        text = text.strip()
        if has_interpolation(text):
            return self.text(text)
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        if text.startswith("[") and text.endswith("]"):
            inner = text[1:-1].strip()
            return [self.element(item) for item in _split_args(inner)] if inner else []
        if text.startswith("{"):
            raise _UnsupportedError(text)
        return _scalar(text)


class _UnsupportedError(Exception):
    """An interpolation form this module does not resolve (OmegaConf would)."""


class _Interp:
    __slots__ = ("body",)

    def __init__(self, body: str) -> None:
        self.body = body


def _pieces(text: str) -> list[str | _Interp]:
    """Literal text and ``${...}`` bodies, in order (nested ones stay inside their body)."""
    out: list[str | _Interp] = []
    literal, i = "", 0
    while i < len(text):
        if text.startswith("\\${", i):
            literal += "${"
            i += 3
        elif text.startswith("${", i):
            end = _closing(text, i + 2)
            if literal:
                out.append(literal)
                literal = ""
            out.append(_Interp(text[i + 2 : end]))
            i = end + 1
        else:
            literal += text[i]
            i += 1
    if literal:
        out.append(literal)
    return out


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` closing the interpolation whose body starts at ``start``."""
    depth, quote, i = 0, "", start
    while i < len(text):
        char = text[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif text.startswith("${", i):
            depth += 1
            i += 1
        elif char == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    raise ValueError(f"unterminated interpolation in {text!r}")


def _split_args(text: str) -> list[str]:
    """Split at top-level commas (outside quotes, brackets and nested interpolations)."""
    items, current, depth, quote = [], "", 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        current += char
    items.append(current)
    return items


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.match(text.replace("_", "")):
        return int(text.replace("_", ""))
    if _FLOAT.match(text) or lowered.lstrip("+-") in ("inf", "nan"):
        return float(text)
    return text


def _as_text(value: Any) -> str:
    return str(value)
