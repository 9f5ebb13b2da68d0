"""How every command reads its configuration: a file (optional) and dotted overrides (``key=value``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from instrument.config import ProfilerConfig
from instrument.config import _file as _config_file

__all__ = ["load_config"]


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ProfilerConfig:
    """Read a YAML or JSON configuration file (optional) and apply dotted overrides.

    :meth:`ProfilerConfig.from_file`, plus "no file": every problem is one ``ValueError``
    (``TypeError`` for a wrong type) line naming the file at fault.
    """
    if path is not None:
        return ProfilerConfig.from_file(path, overrides)
    return _config_file.load(None, overrides, ProfilerConfig.from_overrides)
