"""The values of an analysis and of a comparison, at the bottom of :mod:`instrument.analyze`.

Plain, frozen values: reading (:mod:`..traces`) makes the files, the analyzers (:mod:`..analyzers`) the
numbers, the renderers (:mod:`..render`) take a :class:`Report` or a :class:`Comparison`; nothing here
imports any of them, so a result never depends on how it is read or shown. :meth:`Report.to_dict` /
:meth:`Report.from_dict` are the ``instrument analyze --json`` contract, :meth:`Comparison.to_dict`
``instrument compare --json``'s.
"""

from __future__ import annotations

from instrument.analyze.model._compare import (
    Cause,
    Change,
    CompareFinding,
    Comparison,
    MachineShift,
    Method,
    OpTable,
    Overlap,
    PathShare,
    RoleIdle,
    TimelineComparison,
    Verdict,
)
from instrument.analyze.model._filters import Filters, IntRanges
from instrument.analyze.model._report import (
    CLOCK_CAVEAT,
    ENGINE_STAGES,
    GENERATION_STAGES,
    STRAGGLER_MIN_MS,
    STRAGGLER_MIN_SHARE,
    MemoryFile,
    RankStats,
    Report,
    RunFacts,
    Skipped,
    StageOps,
    StageStats,
    TraceFile,
    label_key,
)
from instrument.analyze.model._spans import SpanRow, TimelineLane, TimelineSpans
from instrument.analyze.model._timeline import (
    ClockInfo,
    Finding,
    RankTable,
    RankTimeline,
    RoleTimeline,
    StepTimeline,
    TimelineReport,
    TimeShare,
    WaitRow,
    findings_text,
)

__all__ = [
    "CLOCK_CAVEAT",
    "ENGINE_STAGES",
    "GENERATION_STAGES",
    "STRAGGLER_MIN_MS",
    "STRAGGLER_MIN_SHARE",
    "Cause",
    "Change",
    "ClockInfo",
    "CompareFinding",
    "Comparison",
    "Filters",
    "Finding",
    "IntRanges",
    "MachineShift",
    "MemoryFile",
    "Method",
    "OpTable",
    "Overlap",
    "PathShare",
    "RankStats",
    "RankTable",
    "RankTimeline",
    "Report",
    "RoleIdle",
    "RoleTimeline",
    "RunFacts",
    "Skipped",
    "SpanRow",
    "StageOps",
    "StageStats",
    "StepTimeline",
    "TimeShare",
    "TimelineComparison",
    "TimelineLane",
    "TimelineReport",
    "TimelineSpans",
    "TraceFile",
    "Verdict",
    "WaitRow",
    "findings_text",
    "label_key",
]
