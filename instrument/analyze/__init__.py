"""Trace analysis across ranks, steps and mini-batches: ``instrument analyze DIR``.

>>> from instrument.analyze import analyze
>>> report = analyze("outputs/profile", steps=[2, 4])       # doctest: +SKIP
>>> worst = report.stages[0]                                 # sorted by straggler ratio, worst first
>>> worst.stage, worst.straggler_rank, worst.ratio            # doctest: +SKIP
>>> print(report.render_text()); report.write_png("a.png"); report.write_html("a.html")  # doctest: +SKIP

Reading streams every file once (``ijson``), so memory follows the largest file, not the set.
Importing this package loads neither ``rich``, ``matplotlib`` nor ``torch``: the renderers import
them when called.  See ``docs/analyze.md``.
"""

from __future__ import annotations

from instrument.analyze._ray import RayUnavailableError
from instrument.analyze._reader import Skipped, TraceFile
from instrument.analyze._report import CLOCK_CAVEAT, RankStats, Report, StageStats, analyze
from instrument.analyze._snapshots import MemoryFile

__all__ = [
    "CLOCK_CAVEAT",
    "MemoryFile",
    "RankStats",
    "RayUnavailableError",
    "Report",
    "Skipped",
    "StageStats",
    "TraceFile",
    "analyze",
]
