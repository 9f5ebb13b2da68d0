"""Backends that record traces (loaded lazily: importing instrument never imports them).

A backend receives plain frozen values (:class:`TraceSpec`), never the session.
"""

from __future__ import annotations

from dataclasses import dataclass

from instrument.schedule import ScheduleLike

__all__ = ["TraceSpec"]


@dataclass(frozen=True)
class TraceSpec:
    """What one trace is of: the values its file name and manifest line are made from."""

    save_path: str
    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    contents: tuple[str, ...]
    schedule: ScheduleLike | None = None
    triggered: bool = False  # profiled on demand: the name carries "_trig"
