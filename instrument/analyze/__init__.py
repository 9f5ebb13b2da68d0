"""Trace analysis across ranks, steps and mini-batches: ``instrument analyze DIR``.

>>> from instrument.analyze import analyze, render_text, write_html, write_png
>>> report = analyze("outputs/profile", steps=[2, 4])       # doctest: +SKIP
>>> worst = report.stages[0]                                 # sorted by time lost to the straggler, most first
>>> worst.stage, worst.straggler_rank, worst.ratio            # doctest: +SKIP
>>> print(render_text(report)); write_png(report, "a.png"); write_html(report, "a.html")  # doctest: +SKIP

Four layers, each importing only those below it: the values (:mod:`.model`: :class:`Report` and
what it holds), reading the files (:mod:`.traces`), the numbers (:mod:`.analyzers`, joined up by
:func:`analyze`), and the renderers (:mod:`.render`), which take a :class:`Report`.
Reading streams every file once (``ijson``), so memory follows the largest file, not the set.
Importing this package loads neither ``rich``, ``matplotlib`` nor ``torch``: the renderers import
them when called.  See ``docs/analyze.md``.
"""

from __future__ import annotations

from instrument.analyze._analyze import analyze
from instrument.analyze._compare_runs import compare
from instrument.analyze.analyzers._findings import (
    FindingRule,
    TimelineAnalysis,
    register_finding,
    registered_findings,
    unregister_finding,
)
from instrument.analyze.model import (
    CLOCK_CAVEAT,
    Comparison,
    Finding,
    MemoryFile,
    RankStats,
    Report,
    Skipped,
    StageStats,
    TraceFile,
)
from instrument.analyze.render import render_text, write_html, write_png
from instrument.analyze.traces._ray import RayUnavailableError

__all__ = [
    "CLOCK_CAVEAT",
    "Comparison",
    "Finding",
    "FindingRule",
    "MemoryFile",
    "RankStats",
    "RayUnavailableError",
    "Report",
    "Skipped",
    "StageStats",
    "TimelineAnalysis",
    "TraceFile",
    "analyze",
    "compare",
    "register_finding",
    "registered_findings",
    "render_text",
    "unregister_finding",
    "write_html",
    "write_png",
]
