"""Read a configuration file (YAML or JSON) into a :class:`~instrument.config.ProfilerConfig`.

The engine of ``ProfilerConfig.from_file`` and of the command line's ``--config``. Every problem
is one line: a ``ValueError`` (``TypeError`` for a wrong type found by the configuration's own
checks) that names the file, and the line and column of a parse error.

This module imports neither ``instrument.config`` nor PyYAML at the top: ``config.py`` imports
it, so the configuration class comes in as an argument (no import cycle), and PyYAML is loaded
only when a YAML file is read (``import instrument`` stays light).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "load", "read_mapping"]

# A profiler section is a few hundred bytes; these bounds keep a hostile or mistaken file
# (a 10 GB log, a YAML alias bomb, a thousand-deep nesting) from costing more than a second.
MAX_BYTES = 256 * 1024
MAX_VALUES = 10_000
MAX_DEPTH = 32

_Config = TypeVar("_Config")
_Build = Callable[[Iterable[str], Mapping[str, Any]], _Config]


def load(path: str | os.PathLike[str] | None, overrides: Iterable[str], build: _Build[_Config]) -> _Config:
    """``build(overrides, base=<the file's mapping>)``, every error on one line naming what is wrong.

    ``path`` ``None`` reads no file (the overrides alone). A complaint is blamed on the file only
    when the file alone, without the overrides, draws the same complaint.
    """
    if isinstance(overrides, str):  # list("steps=[1]") would be nine one-character overrides
        raise TypeError(f"overrides must be a list of 'key=value' strings, not one string: {overrides!r}")
    overrides = list(overrides)
    base: dict[str, Any] = {} if path is None else read_mapping(path)
    try:
        return build(overrides, base)
    except (ValueError, TypeError) as exc:
        if path is None or not overrides:
            raise _one_line(exc, None if path is None else _shown(path)) from None
        try:
            build([], base)
        except (ValueError, TypeError) as alone:
            if str(alone) == str(exc):
                raise _one_line(exc, _shown(path)) from None
        raise _one_line(exc, None) from None


def read_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's top-level mapping (``{}`` for an empty file), bounded in size, values and depth."""
    shown = _shown(path)
    text = _read_text(path, shown)
    try:
        loaded = _parse_json(text, shown) if os.fspath(path).endswith(".json") else _parse_yaml(text, shown)
    except RecursionError:
        raise ValueError(f"{shown}: the configuration is nested too deeply") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{shown}: the configuration must be a mapping at the top level")
    _check_shape(loaded, shown)
    return loaded


def _shown(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


def _one_line(exc: Exception, where: str | None) -> Exception:
    """The same kind of error, on one line of at most ~500 characters, prefixed with the file."""
    text = " ".join(str(exc).split())
    if len(text) > 500:
        text = text[:480] + " ... (cut)"
    kind = TypeError if isinstance(exc, TypeError) else ValueError
    return kind(f"{where}: {text}" if where else text)


def _read_text(path: str | os.PathLike[str], shown: str) -> str:
    """The file's text; only a regular file is read (a FIFO or /dev/zero would block or never end)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ValueError(f"cannot read configuration {shown}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ValueError(f"cannot read configuration {shown}: it is {kind}")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read configuration {shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{shown}: larger than {MAX_BYTES // 1024} KiB; is it really a configuration?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{shown}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})") from None


def _parse_json(text: str, shown: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{shown}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def _parse_yaml(text: str, shown: str) -> Any:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - yaml ships with the dev extra
        raise ValueError(f"reading {shown} needs PyYAML (pip install 'instrument-rl[yaml]') or a .json file") from exc
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 5x faster on big files
    try:
        return yaml.load(text, Loader=loader)  # a safe loader: plain data only
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(exc.problem or exc.context or "unreadable").split())
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        raise ValueError(f"{shown}: invalid YAML{where}: {what}{context}") from None
    except yaml.YAMLError as exc:  # ReaderError: a character YAML does not allow
        position = getattr(exc, "position", None)
        where = f" at line {text.count(chr(10), 0, position) + 1}" if isinstance(position, int) else ""
        what = " ".join(str(getattr(exc, "reason", "") or exc).split()[:12])
        raise ValueError(f"{shown}: invalid YAML{where}: {what}") from None


def _check_shape(loaded: dict[str, Any], shown: str) -> None:
    """Bound the values (aliases counted at every use) and the depth before anything walks the tree."""
    pending: list[tuple[Any, int]] = [(loaded, 1)]
    seen = 0
    while pending:
        value, depth = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ValueError(f"{shown}: more than {MAX_VALUES} values (YAML aliases count at every use)")
        if depth > MAX_DEPTH:
            raise ValueError(f"{shown}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, (list, tuple, set)):
            pending.extend((item, depth + 1) for item in value)
