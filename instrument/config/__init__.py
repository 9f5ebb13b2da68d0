"""Configuration: validated, frozen settings and every way to build them.

``ProfilerConfig``, ``Schedule``, ``FinishHook``, ``SlowStep`` and ``MemorySnapshots`` check each
field at construction (:mod:`._settings`, with the checks in :mod:`._validators`); verl's key
names and defaults (:mod:`._verl`), dotted overrides (:mod:`._overrides`) and YAML / JSON files
(:mod:`._file`, read for the CLI by :mod:`._cli`) all end in the same constructors.
"""

from __future__ import annotations

from instrument.config._settings import (
    CONTENTS,
    TOOLS,
    FinishHook,
    MemorySnapshots,
    ProfilerConfig,
    Schedule,
    SlowStep,
    parse_value,
)

__all__ = [
    "CONTENTS",
    "TOOLS",
    "FinishHook",
    "MemorySnapshots",
    "ProfilerConfig",
    "Schedule",
    "SlowStep",
    "parse_value",
]
