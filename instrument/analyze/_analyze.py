"""From a directory to a :class:`~instrument.analyze.Report`: :func:`analyze`.

It finds the files (:func:`~instrument.analyze.traces._discover.discover`), applies the filters,
drops duplicates, reads every file once (in worker processes when the set is large, or as Ray tasks:
:mod:`.traces._ray`) and folds the per-file segments (:mod:`.analyzers._fold`) into
:class:`~instrument.analyze.RankStats` and :class:`~instrument.analyze.StageStats`
(:mod:`.analyzers._stats`).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from instrument.analyze.analyzers._fold import Fold
from instrument.analyze.analyzers._stats import compare
from instrument.analyze.analyzers._timeline import analyze_timeline
from instrument.analyze.model import (
    Filters,
    IntRanges,
    MemoryFile,
    Report,
    Skipped,
    TimelineLane,
    TimelineReport,
    TimelineSpans,
    TraceFile,
    label_key,
)
from instrument.analyze.traces._details import with_details
from instrument.analyze.traces._discover import ALL_RUNS, Run, discover, find_runs, select_run
from instrument.analyze.traces._names import worker_label
from instrument.analyze.traces._ray import scan_on_ray
from instrument.analyze.traces._reader import FileScan, TraceError, read_header, scan_file, with_rank_from_header
from instrument.analyze.traces._selection import Selection
from instrument.analyze.traces._snapshots import find_memory_files
from instrument.analyze.traces._timelines import align, find_timelines
from instrument.analyze.traces._trace_spans import FROM_TRACES_NOTE, NO_STEP_RANGES, TraceSpans
from instrument.naming import TIMELINE_SUFFIX
from instrument.timeline import SpanTable, Timeline

__all__ = ["PARALLEL_MIN_BYTES", "ReadProgress", "analyze"]

PARALLEL_MIN_BYTES = 16 << 20
"""Files on disk (all together) from which they are read in worker processes."""


# --------------------------------------------------------------------------- analysis


def _default_jobs() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def _scan_or_skip(trace: TraceFile, wanted: frozenset[str] | None = None) -> FileScan | Skipped:
    try:
        return scan_file(trace, wanted)
    except TraceError as exc:
        return Skipped(trace.path, str(exc))


class ReadProgress(Protocol):
    """What :func:`analyze` tells about its reading (``instrument analyze`` draws it on a terminal)."""

    def begin(self, files: int, total_bytes: int) -> None:
        """Reading starts: this many files, this many bytes on disk."""

    def file_done(self, path: str, size: int, seconds: float) -> None:
        """One file was read (or skipped) in ``seconds``."""


def _timed_scan(trace: TraceFile, wanted: frozenset[str] | None = None) -> tuple[FileScan | Skipped, float]:
    started = time.perf_counter()  # in the process that reads it: a worker's own time, not the queue's
    return _scan_or_skip(trace, wanted), time.perf_counter() - started


def _scan_all(
    files: list[TraceFile],
    jobs: int,
    wanted: frozenset[str] | None = None,
    progress: ReadProgress | None = None,
) -> Iterator[FileScan | Skipped]:
    scan = functools.partial(_timed_scan, wanted=wanted)

    def told(trace: TraceFile, done: tuple[FileScan | Skipped, float]) -> FileScan | Skipped:
        if progress is not None:
            progress.file_done(trace.path, _size(trace.path), done[1])
        return done[0]

    if jobs <= 1 or len(files) < 2:
        yield from (told(trace, scan(trace)) for trace in files)
        return
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor

    # fork is cheap and re-imports nothing, but copies other threads' locks mid-state: only a process with
    # one thread (the command line) forks; a caller with threads (torch, an export thread) gets spawn.
    forkable = (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1
        and "torch" not in sys.modules  # its native thread pools are invisible to threading
    )
    context = multiprocessing.get_context("fork" if forkable else "spawn")
    largest_first = sorted(range(len(files)), key=lambda i: -_size(files[i].path))
    results: list[FileScan | Skipped | None] = [None] * len(files)
    with ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=context) as pool:
        for i, result in zip(largest_first, pool.map(scan, [files[i] for i in largest_first]), strict=True):
            results[i] = told(files[i], result)
    for done in results:
        if done is None:  # pragma: no cover - map() returns one result per file
            raise RuntimeError("a worker process returned no result")
        yield done


def analyze(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    stages: Iterable[str] | None = None,
    all_ranks: bool = True,
    jobs: int | None = None,
    progress: ReadProgress | None = None,
    ray: str | bool | None = None,
    run: str | Run | None = None,
    strict: bool = False,
    details: bool = False,
) -> Report:
    """Analyse the traces in ``path`` (a ``save_path``).

    ``run``: which run of ``path`` (see ``docs/analyze.md``, Runs): ``None`` the newest; an id (or a unique
    start of one), or a :class:`~.traces._discover.Run` found before: that run; ``"all"`` every file.
    ``strict``: raise :class:`~.traces._selection.NothingMatchedError` (a ``ValueError``) when the filters keep
    nothing, or ``path`` holds no trace, instead of an empty report. A filter naming values partly absent
    gets a note in :attr:`Report.notes`.

    ``details``: also the run's facts (hosts, dates, tools, roles) and each stage's top ops by self time
    (:attr:`Report.run`, :attr:`Report.stage_ops`; a second read of one instance's files per stage), which
    the page shows (``instrument analyze --html`` asks for them).

    ``ranks`` / ``steps`` / ``stages`` keep only those (``stages`` compares labels the way file names
    write them, so ``update_actor`` and ``update-actor`` are the same); ``ranks=None`` keeps every rank
    unless ``all_ranks=False``, which keeps rank 0 (as :class:`~instrument.ProfilerConfig` does).
    Frontend traces, which belong to a replica and not to a rank, are dropped by a rank filter.

    ``jobs``: processes reading files. Default: one per CPU (at most 8) once the files add up to
    :data:`PARALLEL_MIN_BYTES` on disk, else this process alone. A process with only one thread
    forks them; otherwise they are spawned, which re-imports the caller's ``__main__`` (guard a
    script with ``if __name__ == "__main__":``, or pass ``jobs=1``).

    ``progress`` (a :class:`ReadProgress`) hears when reading begins and as each file is done.

    ``ray``: read the files as Ray tasks instead, on the cluster at this address (``True``: Ray's own
    choice, see :func:`~instrument.analyze.traces._ray.scan_on_ray`); every node must see ``path`` at the same
    place. The report is the same; ``jobs`` is then the cluster's CPUs. See ``docs/scale.md``.

    Files that cannot be read are listed in :attr:`Report.skipped` with the reason; raises
    ``NotADirectoryError`` / ``OSError`` when ``path`` is no readable directory, ``ValueError``
    on a bad filter and :class:`RayUnavailableError` when ``ray`` is asked for and Ray is not
    installed or the cluster cannot be reached.
    """
    started = time.perf_counter()
    root = Path(path)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    stages = [stages] if isinstance(stages, str) else None if stages is None else list(stages)  # read twice
    filters = Filters.of(ranks, steps, stages, all_ranks)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"'jobs' must be an int >= 1: {jobs!r}")

    found, skipped = discover(root)
    chosen = run if isinstance(run, Run) else None if run == ALL_RUNS else select_run(find_runs(root), run, root)
    selection = Selection(chosen)  # above: ValueError naming the runs for an unknown id
    found = [trace for trace in found if selection.keeps(trace.path)]
    selection.add_files(found)
    unique = _without_duplicates(_identified(found, filters, skipped), skipped)
    total = sum(_size(t.path) for t in unique)
    if jobs is None:
        jobs = _default_jobs() if total >= PARALLEL_MIN_BYTES else 1
    if progress is not None:
        progress.begin(len(unique), total)
    fold = Fold(filters)
    traced = TraceSpans()  # the step timeline's spans from the traces, for a run without timeline files
    results: Iterable[FileScan | Skipped]
    if ray is not None and ray is not False:
        # scan_on_ray imports ray itself only when called: a local run never loads it
        results, jobs = scan_on_ray(unique, filters.stages, progress, [_size(t.path) for t in unique], ray)
    else:
        results = _scan_all(unique, jobs, filters.stages, progress)
    for trace, result in zip(unique, results, strict=True):
        if isinstance(result, Skipped):
            skipped.append(result)
        else:
            fold.add(trace, result)
            traced.add(trace, result)
    stage_stats = compare(fold.groups(), fold.step_ms())
    timeline, timeline_note, timeline_spans = _timeline(
        root, filters, skipped, notes := list(fold.notes), traced, selection
    )
    memory = [m for m in _memory_files(root, filters) if selection.keeps(m.path)]
    selection.add_read(stage_stats)
    if strict and not fold.files and not memory and (timeline is None or selection.hopeless(filters, stages)):
        raise selection.nothing(root, filters, stages, sorted(skipped, key=lambda s: s.path))
    notes += selection.absent(root, filters, stages)
    skipped.sort(key=lambda s: s.path)
    report = Report(
        directory=str(root),
        stages=tuple(stage_stats),
        skipped=tuple(skipped),
        files=fold.files,
        bytes=fold.bytes,
        events=fold.events,
        elapsed_s=time.perf_counter() - started,
        jobs=jobs,
        gpu=fold.gpu_rows(),
        memory=tuple(memory),
        gpu_kernels=fold.kernel_rows(),
        gpu_idle=fold.idle_rows(),
        notes=tuple(notes),
        timeline=timeline,
        timeline_note=timeline_note,
        timeline_spans=timeline_spans,
    )
    return with_details(report) if details else report


def _timeline(
    root: Path,
    filters: Filters,
    skipped: list[Skipped],
    notes: list[Skipped],
    traced: TraceSpans,
    selection: Selection,
) -> tuple[TimelineReport | None, str | None, TimelineSpans | None]:
    """The step timeline from the run's timeline files, else from its traces' step and stage ranges, under
    the filters, and its spans per process; else why there is none."""
    timelines, unread = find_timelines(root)
    timelines = [t for t in timelines if selection.keeps(t.path)]  # the run analysed only
    unread = [problem for problem in unread if selection.keeps(problem.path)]
    selection.add_timelines(timelines)
    for problem in unread:  # a torn file is read up to its last record: a note, not a file left out
        (notes if any(t.path == problem.path for t in timelines) else skipped).append(problem)
    from_traces = not timelines
    if from_traces:
        timelines = traced.timelines()
    if not timelines:
        return (
            None,
            (
                f"no step timeline in {root}: the run wrote no *{TIMELINE_SUFFIX} file "
                "(ProfilerConfig(timeline=False), or a run from before timelines)"
                + (f", and {NO_STEP_RANGES}" if traced.traces else "")
            ),
            None,
        )
    on_axis = align(timelines)
    opened = on_axis.spans.steps("step")  # a span outside any step: not analysed
    wanted = filters.stages
    kept = on_axis.spans.where(  # columns kept as columns: no span object per span here
        ranks=filters.ranks,
        steps=opened if filters.steps is None else {step for step in opened if step in filters.steps},  # intervals
    )
    # --stage chooses what is shown, never what is analysed: the stages left out still ran, so their time is
    # no one's idle; the findings and the picture keep to the stages asked for.
    shown = kept
    if wanted is not None:
        shown = kept.where(names=lambda kind, _role, stage: kind == "step" or label_key(stage) in wanted)
    if not len(shown):
        held = "the traces' step and stage ranges" if from_traces else "the timeline files"
        return None, f"{held} hold no span the filters keep", None
    report = analyze_timeline(kept, aligned=on_axis.aligned, clock_uncertainty_ns=on_axis.max_uncertainty_ns or 0)
    if wanted is not None:
        asked = tuple(f for f in report.findings if f.stage is None or label_key(f.stage) in wanted)
        report = replace(report, findings=asked)
    report = _traced_steps(report, traced.steps(), root, None if from_traces else notes)
    # one part per timeline, in order: each process's spans for the pictures and the merged trace
    per_process = [(t, SpanTable([part])) for t, part in zip(on_axis.timelines, shown.parts, strict=True)]
    if from_traces:  # said where the notes are read: the findings, the page and the JSON's clock
        said = " ".join(filter(None, (f"Step timeline {FROM_TRACES_NOTE}.", report.clock.note)))
        report = replace(report, source="traces", clock=replace(report.clock, note=said))
    return report, None, _lanes(per_process, on_axis.aligned)


OLDER_TIMELINE_NOTE = (
    "its timeline files hold no span of instrument's own work (written by an older instrument): on the traced "
    "steps ({steps}), the profiler's start-up, stop and export count as stage and idle time"
)


def _traced_steps(report: TimelineReport, steps: set[int], root: Path, notes: list[Skipped] | None) -> TimelineReport:
    """Steps a trace file holds are traced too; a timeline file without the SDK's own spans where traces exist is
    older than them: said once in ``notes`` (its traced steps' numbers hold the profiler's cost)."""
    if not steps:
        return report
    marked = [s if s.traced or s.step not in steps else replace(s, traced=True) for s in report.steps]
    if notes is not None and not any(s.instrument_ms or s.traced for s in report.steps):
        notes.append(Skipped(str(root), OLDER_TIMELINE_NOTE.format(steps=IntRanges.of(steps))))
    return replace(report, steps=tuple(marked))


_SHIFTED_NOTE = (
    "clocks of different hosts are not aligned: each host is drawn shifted so that its first step starts with "
    "the reference host's; durations are right, the timing between hosts is not"
)


def _lanes(per_process: list[tuple[Timeline, SpanTable]], aligned: bool) -> TimelineSpans:
    """The kept spans per process (each a table of one part: its columns and its shift), from the first span on.

    Not aligned: a host's lanes are moved so that its first step starts with the reference host's (the
    lowest rank's), so the picture is readable; its clock's own origin (days since boot) would put it anywhere.
    Read from the columns: no span object is made here."""
    parts = [(timeline, *table.parts[0]) for timeline, table in per_process if len(table)]
    shift: dict[str, int] = {}
    if not aligned:
        first: dict[str, dict[int, int]] = {}  # host -> step -> its earliest start there
        for timeline, columns, moved in parts:
            starts = first.setdefault(timeline.host, {})
            step_names = {i for i, (kind, _, _) in enumerate(columns.names) if kind == "step"}
            for name, step, start in zip(columns.name, columns.step, columns.start_ns, strict=True):
                if name in step_names and start - moved < starts.get(step, start - moved + 1):
                    starts[step] = start - moved
        reference = min((t for t, _, _ in parts), key=lambda t: (t.rank, t.pid), default=None)
        ours = first.get(reference.host, {}) if reference is not None else {}
        for host, starts in first.items():
            common = sorted(set(starts) & set(ours)) or sorted(starts)
            if reference is not None and host != reference.host and common and ours:
                step = common[0]
                shift[host] = starts[step] - ours.get(step, min(ours.values()))
    origin = min((min(columns.start_ns) - moved - shift.get(t.host, 0) for t, columns, moved in parts), default=0)
    lanes = [
        TimelineLane.of(
            role=timeline.role,
            rank=timeline.rank,
            host=timeline.host,
            pid=timeline.pid,
            spans=SpanTable([(columns, moved)]),
            shift_ns=origin + shift.get(timeline.host, 0),
        )
        for timeline, columns, moved in parts
    ]
    lanes.sort(key=lambda lane: (lane.role, lane.rank, lane.pid))
    return TimelineSpans(tuple(lanes), aligned=aligned, note=None if aligned else _SHIFTED_NOTE)


def _memory_files(root: Path, filters: Filters) -> list[MemoryFile]:
    """Snapshots and timelines under the same filters; a listing that fails only leaves them out."""
    try:
        return find_memory_files(root, ranks=filters.ranks, steps=filters.steps, stages=filters.stages)
    except OSError:
        return []


def _identified(found: list[TraceFile], filters: Filters, skipped: list[Skipped]) -> list[TraceFile]:
    """The files with a rank (or a frontend's replica) that the filters keep; the rest go to ``skipped``."""
    wanted: list[TraceFile] = []
    for trace in found:
        if trace.rank is None and trace.source == "trace":
            try:
                completed = with_rank_from_header(trace, read_header(trace.path))
            except TraceError as exc:
                skipped.append(Skipped(trace.path, str(exc)))
                continue
            # no rank anywhere (a single-process run): analysed all the same, named after the file
            trace = completed or replace(trace, worker=worker_label(trace.path))  # noqa: PLW2901
        elif trace.rank is None and trace.worker is None and (trace.stage != "frontend" or trace.replica is None):
            skipped.append(Skipped(trace.path, "no rank: relocated as rank-unknown"))
            continue
        if filters.keeps(trace):
            wanted.append(trace)
    return wanted


def _without_duplicates(wanted: list[TraceFile], skipped: list[Skipped]) -> list[TraceFile]:
    """The first file (by path) of each step, role, stage, rank and window."""
    first_of: dict[Any, str] = {}
    unique: list[TraceFile] = []
    for trace in wanted:
        key = trace.key()
        if key in first_of:
            reason = f"duplicate: same step, role, stage, rank and window as {first_of[key]}"
            skipped.append(Skipped(trace.path, reason))
            continue
        first_of[key] = trace.path
        unique.append(trace)
    return unique


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
