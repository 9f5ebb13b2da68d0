"""What :func:`~instrument.analyze.analyze` reads of a directory: one run's files, and what its filters missed.

A :class:`Selection` holds the names of the chosen run's files (``None``: every file) and what that run
holds (ranks, steps, stages: from the files' names and manifests, the timeline files and what was read).
A filter naming something partly absent gets one note; one that matches nothing at all is a
:class:`NothingMatchedError` saying what was asked and what there is, with a "did you mean" for a stage.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from instrument.analyze.model import Filters, IntRanges, Skipped, StageStats, TraceFile, label_key
from instrument.analyze.traces._discover import NO_RUN_ID, Run
from instrument.naming import SDK_STAGE_PREFIX
from instrument.timeline import SpanColumns, Timeline

__all__ = ["NothingMatchedError", "Selection"]


class NothingMatchedError(ValueError):
    """No file and no timeline span of the run analysed is kept by the filters (or there is none at all).

    ``str()`` is the first line; :attr:`lines` the whole message: what was asked, then what there is;
    :attr:`skipped` the files that could not be read (named before the message).
    """

    def __init__(self, lines: list[str], skipped: Iterable[Skipped] = ()) -> None:
        super().__init__(lines[0])
        self.lines = tuple(lines)
        self.skipped = tuple(skipped)


@dataclass
class Selection:
    """The run analysed (its file names; ``None``: every file) and the ranks, steps and stages it holds."""

    run: Run | None
    ranks: set[int] = field(default_factory=set)
    steps: set[int] = field(default_factory=set)
    stages: dict[str, str] = field(default_factory=dict)  # label key -> the name shown

    def keeps(self, path: str) -> bool:
        """Whether the file at ``path`` is of the run analysed."""
        return self.run is None or os.path.basename(path) in self.run.names

    def add_files(self, files: Iterable[TraceFile]) -> None:
        """What the files' names and manifest lines say they hold."""
        for trace in files:
            if trace.rank is not None:
                self.ranks.add(trace.rank)
            if trace.inside:
                continue  # its steps and stages are known once read
            if trace.step is not None:
                self.steps.add(trace.step)
            if not trace.continuous:
                self.stages.setdefault(label_key(trace.stage), trace.stage)

    def add_timelines(self, timelines: Iterable[Timeline]) -> None:
        """Every rank, step and stage the timeline files hold (read before the filters)."""
        for timeline in timelines:
            self.ranks.add(timeline.rank)
            spans = timeline.spans
            if isinstance(spans, SpanColumns):  # the columns themselves: no span object made (millions at scale)
                self.steps.update(spans.step)
                labels = {spans.names[i] for i in set(spans.name)}
            else:
                self.steps.update(span.step for span in spans)
                labels = {(span.kind, span.role, span.stage) for span in spans}
            for kind, _role, stage in labels:
                if kind != "step" and not stage.startswith(SDK_STAGE_PREFIX):  # the SDK's own spans: no user stage
                    self.stages.setdefault(label_key(stage), stage)

    def add_read(self, stages: Iterable[StageStats]) -> None:
        """What reading found inside the files (continuous traces' stages, steps inside foreign traces)."""
        for stats in stages:
            if stats.step is not None:
                self.steps.add(stats.step)
            self.stages.setdefault(label_key(stats.stage), stats.stage)
            self.ranks.update(r.rank for r in stats.ranks if r.rank is not None)

    def hopeless(self, filters: Filters, asked_stages: Iterable[str] | None) -> bool:
        """Whether some filter names nothing the run holds (then only bare step spans could be left: no match)."""
        stages = list(asked_stages or ())
        return (
            (filters.ranks is not None and not any(rank in filters.ranks for rank in self.ranks))
            or (filters.steps is not None and not any(step in filters.steps for step in self.steps))
            or (bool(stages) and not any(label_key(stage) in self.stages for stage in stages))
        )

    def absent(self, root: Path, filters: Filters, asked_stages: Iterable[str] | None) -> list[Skipped]:
        """One note per filter that names values the run does not hold (the others are analysed)."""
        notes = []
        for words in self._missing(filters, asked_stages):
            notes.append(Skipped(str(root), f"{words}; the rest is analysed"))
        return notes

    def nothing(
        self, root: Path, filters: Filters, asked_stages: Iterable[str] | None, skipped: list[Skipped]
    ) -> NothingMatchedError:
        """The error for filters that kept nothing (or a directory with no trace): what was asked, what there is."""
        where = f"{root}" if self.run is None or self.run.id == NO_RUN_ID else f"{root} (run {self.run.id})"
        asked = _asked(filters, asked_stages)
        if not (self.ranks or self.steps or self.stages):
            why = (
                f"none of its {len(skipped)} trace files could be read (each named above)"
                if skipped
                else "no *.json / *.json.gz trace and no step timeline"
            )
            return NothingMatchedError([f"no trace to analyse in {where}: {why}"], skipped)
        lines = [f"nothing in {where} matches {asked}" if asked else f"nothing to analyse in {where}"]
        lines += [f"  {words}" for words in self._missing(filters, asked_stages)]
        lines.append(f"  there: {self._there()}")
        return NothingMatchedError(lines, skipped)

    def _missing(self, filters: Filters, asked_stages: Iterable[str] | None) -> list[str]:
        said = []
        if filters.ranks is not None and (gone := _without(filters.ranks, self.ranks)):
            said.append(f"--ranks {gone}: no such rank here (ranks: {_ints(self.ranks)})")
        if filters.steps is not None and (gone := _without(filters.steps, self.steps)):
            said.append(f"--steps {gone}: no such step here (steps: {_ints(self.steps)})")
        for stage in dict.fromkeys(asked_stages or ()):
            if label_key(stage) in self.stages:
                continue
            close = difflib.get_close_matches(label_key(stage), list(self.stages), n=1, cutoff=0.6)
            hint = f"; did you mean {self.stages[close[0]]!r}?" if close else ""
            said.append(f"--stage {stage}: no such stage here (stages: {self._stage_names()}){hint}")
        return said

    def _there(self) -> str:
        return f"ranks {_ints(self.ranks)}; steps {_ints(self.steps)}; stages {self._stage_names()}"

    def _stage_names(self) -> str:
        return ", ".join(sorted(self.stages.values())) or "none"


def _asked(filters: Filters, asked_stages: Iterable[str] | None) -> str:
    parts = []
    if filters.ranks is not None:
        parts.append(f"--ranks {filters.ranks}")
    if filters.steps is not None:
        parts.append(f"--steps {filters.steps}")
    parts += [f"--stage {stage}" for stage in dict.fromkeys(asked_stages or ())]
    return " ".join(parts)


def _ints(values: set[int]) -> str:
    return str(IntRanges.of(values)) or "none"


def _without(asked: IntRanges, there: set[int]) -> str:
    """The values of ``asked`` not in ``there``, as intervals (a wide ``--ranks 0-99999`` is never expanded)."""
    gone: list[tuple[int, int]] = []
    for first, last in asked.intervals:
        start = first
        for value in sorted(v for v in there if first <= v <= last):
            if value > start:
                gone.append((start, value - 1))
            start = value + 1
        if start <= last:
            gone.append((start, last))
    return str(IntRanges(gone))
