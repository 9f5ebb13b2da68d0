"""Recorders: what records a profiled stage or step (loaded lazily: importing instrument never imports them).

A recorder receives plain frozen values (:class:`TraceSpec`, its options), never the session, and
hands back each file it saved through the ``publish`` callable it was built with; the session
alone writes the manifest. Recorders are found by tool name in one registry
(:mod:`._registry`: built-ins, :func:`register`, the entry-point group ``instrument.recorders``),
so the core has no if/elif on tool names; ``"a+b"`` drives several as one (:class:`Recorders`).
A new recorder is one module plus one registration. The protocol is in :mod:`._protocol`;
:class:`FastRanges` is its optional per-call fast path.
"""

from __future__ import annotations

from instrument.recorders._combined import Recorders
from instrument.recorders._protocol import (
    FastRange,
    FastRanges,
    FastScope,
    Publish,
    Recorder,
    RecorderFactory,
    Report,
    TraceSpec,
)
from instrument.recorders._registry import (
    BUILT_IN_TOOLS,
    ENTRY_POINT_GROUP,
    Registration,
    build,
    override,
    recorder_class,
    register,
    registered_tools,
    registration,
    uses_cupti,
)

register_recorder = register
"""The earlier name of :func:`register` (the same function)."""

__all__ = [
    "BUILT_IN_TOOLS",
    "ENTRY_POINT_GROUP",
    "FastRange",
    "FastRanges",
    "FastScope",
    "Publish",
    "Recorder",
    "RecorderFactory",
    "Recorders",
    "Registration",
    "Report",
    "TraceSpec",
    "build",
    "override",
    "recorder_class",
    "register",
    "register_recorder",
    "registered_tools",
    "registration",
    "uses_cupti",
]
