"""From trace files to numbers: per step x role x stage x rank, then across ranks.

:func:`analyze` finds the files (:func:`instrument.analyze._reader.discover`), applies the
filters, drops duplicates, reads every file once (in worker processes when the set is large)
and folds the per-file segments into :class:`RankStats` and :class:`StageStats`.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from instrument.analyze._gpu import GpuTimes
from instrument.analyze._names import worker_label
from instrument.analyze._reader import (
    FileScan,
    Skipped,
    TraceError,
    TraceFile,
    discover,
    label_key,
    meta_label,
    read_header,
    scan_file,
    with_rank_from_header,
)

__all__ = ["CLOCK_CAVEAT", "PARALLEL_MIN_BYTES", "RankStats", "Report", "StageStats", "analyze"]

CLOCK_CAVEAT = "Clocks of different hosts are not aligned: ranks are compared by durations only, never by timestamps."

PARALLEL_MIN_BYTES = 16 << 20
"""Files on disk (all together) from which they are read in worker processes."""

_US_PER_MS = 1000.0


@dataclass(frozen=True)
class RankStats:
    """One rank's numbers for one stage of one step (summed over its files: windows of one stage)."""

    step: int
    role: str
    stage: str
    rank: int | None
    """Global rank; ``None`` for a vLLM frontend trace, which belongs to a replica."""
    replica: int | None
    wall_ms: float
    """Wall time of the stage range; see :attr:`basis`."""
    basis: str
    """``stage``: the stage's own range; ``mini_batches``: union of the ``mini_batch{i}`` ranges of
    window traces; ``span``: first to last event of a trace with neither (engine traces)."""
    minibatch_ms: float
    mini_batches: int
    cpu_ms: float
    """Time covered by ``cpu_op`` events, nested ops counted once (union per thread, summed over threads)."""
    kernel_ms: float | None
    """Sum of ``kernel`` event durations; ``None`` when the trace has no GPU kernels."""
    kernels: int
    events: int
    """Complete (``ph: X``) events."""
    files: tuple[str, ...]
    windows: tuple[tuple[int, int], ...]
    partial: bool
    worker: str | None = None
    """For a file no one gives a rank: its name (torch's ``{worker}`` part)."""
    comm_ms: float = 0.0
    """Time inside collectives (``c10d::``, ``gloo:``, ``nccl`` ops and kernels) within the stage."""
    work_ms: float | None = None
    """What the rank is judged by: wall minus collectives, an engine's execution time; ``None``: the wall time."""
    iterations: int = 0
    """Engine iterations (execution ranges) of an engine trace."""

    @property
    def label(self) -> str:
        """``3`` for rank 3, ``replica1`` for a frontend, the file's worker name for a file without a rank."""
        if self.rank is not None:
            return str(self.rank)
        return self.worker if self.worker is not None else f"replica{self.replica}"

    @property
    def judged_ms(self) -> float:
        """The rank's work: :attr:`work_ms`, else the wall time."""
        return self.wall_ms if self.work_ms is None else self.work_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "rank": self.rank,
            "replica": self.replica,
            "wall_ms": _r(self.wall_ms),
            "basis": self.basis,
            "minibatch_ms": _r(self.minibatch_ms),
            "mini_batches": self.mini_batches,
            "cpu_ms": _r(self.cpu_ms),
            "kernel_ms": None if self.kernel_ms is None else _r(self.kernel_ms),
            "kernels": self.kernels,
            "events": self.events,
            "windows": [list(w) for w in self.windows],
            "partial": self.partial,
            "files": list(self.files),
            "worker": self.worker,
            "comm_ms": _r(self.comm_ms),
            "work_ms": _r(self.judged_ms),
            "iterations": self.iterations,
        }


@dataclass(frozen=True)
class StageStats:
    """One stage of one step across ranks."""

    step: int
    role: str
    stage: str
    ranks: tuple[RankStats, ...]
    median_ms: float
    max_ms: float
    min_ms: float
    straggler: str
    """Label of the slowest rank (argmax of its work, see :attr:`judged_by`; the lowest rank on a tie)."""
    straggler_rank: int | None
    ratio: float | None
    """max / median of the work; ``None`` when the median is 0."""
    minibatch_ms: float
    cpu_ms: float
    kernel_ms: float | None
    events: float
    """The last four: medians across ranks."""
    judged_by: str = "wall"
    """``wall``: ranks compared by wall time; ``work``: by wall time minus time in collectives (a rank
    waiting in a barrier for a slow peer is not slow), or an engine's execution time, not its window."""
    median_work_ms: float = 0.0

    @property
    def windows(self) -> tuple[tuple[int, int], ...]:
        """The mini-batch windows the ranks' traces hold (empty: the whole stage)."""
        return tuple(sorted({w for r in self.ranks for w in r.windows}))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "step": self.step,
            "role": self.role,
            "stage": self.stage,
            "windows": [list(w) for w in self.windows],
            "n_ranks": len(self.ranks),
            "median_ms": _r(self.median_ms),
            "max_ms": _r(self.max_ms),
            "min_ms": _r(self.min_ms),
            "straggler": self.straggler,
            "straggler_rank": self.straggler_rank,
            "straggler_ratio": None if self.ratio is None else round(self.ratio, 4),
            "straggler_by": self.judged_by,
            "median_work_ms": _r(self.median_work_ms),
            "median_minibatch_ms": _r(self.minibatch_ms),
            "median_cpu_ms": _r(self.cpu_ms),
            "median_kernel_ms": None if self.kernel_ms is None else _r(self.kernel_ms),
            "median_events": self.events,
            "per_rank": [r.to_dict() for r in self.ranks],
        }


@dataclass(frozen=True)
class Report:
    """The analysis of one directory; :meth:`to_dict` is what ``--json`` prints."""

    directory: str
    stages: tuple[StageStats, ...]
    """Sorted by straggler ratio, worst first."""
    skipped: tuple[Skipped, ...]
    files: int
    """Trace files read."""
    bytes: int
    events: int
    elapsed_s: float
    jobs: int
    caveat: str = CLOCK_CAVEAT
    gpu: tuple[dict[str, Any], ...] = ()
    """GPU time per rank: the whole trace (``step`` None), then each ``ProfilerStep`` (:mod:`._gpu`)."""

    @property
    def ok(self) -> bool:
        """Whether every file could be read."""
        return not self.skipped

    @property
    def steps(self) -> tuple[int, ...]:
        """Steps seen."""
        return tuple(sorted({s.step for s in self.stages}))

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks seen."""
        return tuple(sorted({r.rank for s in self.stages for r in s.ranks if r.rank is not None}))

    @property
    def roles(self) -> tuple[str, ...]:
        """Roles seen."""
        return tuple(sorted({s.role for s in self.stages}))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "directory": self.directory,
            "files": self.files,
            "bytes": self.bytes,
            "events": self.events,
            "elapsed_s": round(self.elapsed_s, 3),
            "jobs": self.jobs,
            "steps": list(self.steps),
            "ranks": list(self.ranks),
            "roles": list(self.roles),
            "caveat": self.caveat,
            "stages": [s.to_dict() for s in self.stages],
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "gpu": list(self.gpu),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def render_text(self, *, width: int | None = None, color: bool = False) -> str:
        """The terminal table (``rich``; plain text without it)."""
        from instrument.analyze import _render

        return _render.render_text(self, width=width, color=color)

    def write_png(self, path: str | os.PathLike[str]) -> Path:
        """The picture: stage time per rank and a per-step stacked breakdown (needs matplotlib)."""
        from instrument.analyze import _render

        return _render.write_png(self, path)

    def write_html(self, path: str | os.PathLike[str]) -> Path:
        """One self-contained page with the table and the picture (needs matplotlib)."""
        from instrument.analyze import _render

        return _render.write_html(self, path)


def _r(value: float) -> float:
    return round(value, 3)


# --------------------------------------------------------------------------- analysis


def _ints(values: Iterable[int] | None, name: str) -> frozenset[int] | None:
    if values is None:
        return None
    out = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"'{name}' must hold non-negative ints: {value!r}")
        out.add(value)
    return frozenset(out)


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


def _scan_all(files: list[TraceFile], jobs: int, wanted: frozenset[str] | None = None) -> Iterator[FileScan | Skipped]:
    scan = functools.partial(_scan_or_skip, wanted=wanted)
    if jobs <= 1 or len(files) < 2:
        yield from map(scan, files)
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
            results[i] = result
    for done in results:
        if done is None:  # pragma: no cover - map() returns one result per file
            raise RuntimeError("a worker process returned no result")
        yield done


@dataclass
class _Cell:
    role: str
    stage: str
    rank: int | None
    replica: int | None
    wall_us: float = 0.0
    basis: set[str] = field(default_factory=set)
    minibatch_us: float = 0.0
    mini_batches: int = 0
    cpu_us: float = 0.0
    kernel_us: float = 0.0
    kernels: int = 0
    events: int = 0
    files: list[str] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)
    partial: bool = False
    worker: str | None = None
    comm_us: float = 0.0
    work_us: float | None = None
    iterations: int = 0


@dataclass(frozen=True)
class _Filters:
    ranks: frozenset[int] | None
    steps: frozenset[int] | None
    stages: frozenset[str] | None

    def keeps(self, trace: TraceFile) -> bool:
        if self.ranks is not None and (trace.rank is None or trace.rank not in self.ranks):
            return False
        if self.steps is not None and not trace.inside and trace.step not in self.steps:
            return False  # a file whose steps lie inside it is filtered by segment
        # a continuous trace holds every stage: its segments are filtered after reading
        return self.stages is None or trace.continuous or trace.inside or label_key(trace.stage) in self.stages

    def keeps_stage(self, stage: str) -> bool:
        return self.stages is None or label_key(stage) in self.stages


def analyze(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    stages: Iterable[str] | None = None,
    all_ranks: bool = True,
    jobs: int | None = None,
) -> Report:
    """Analyse the traces in ``path`` (a ``save_path``).

    ``ranks`` / ``steps`` / ``stages`` keep only those (``stages`` compares labels the way file names
    write them, so ``update_actor`` and ``update-actor`` are the same); ``ranks=None`` keeps every rank
    unless ``all_ranks=False``, which keeps rank 0 (as :class:`~instrument.ProfilerConfig` does).
    Frontend traces, which belong to a replica and not to a rank, are dropped by a rank filter.

    ``jobs``: processes reading files. Default: one per CPU (at most 8) once the files add up to
    :data:`PARALLEL_MIN_BYTES` on disk, else this process alone. A process with only one thread
    forks them; otherwise they are spawned, which re-imports the caller's ``__main__`` (guard a
    script with ``if __name__ == "__main__":``, or pass ``jobs=1``).

    Files that cannot be read are listed in :attr:`Report.skipped` with the reason; raises
    ``NotADirectoryError`` / ``OSError`` when ``path`` is no readable directory and ``ValueError``
    on a bad filter.
    """
    started = time.perf_counter()
    root = Path(path)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    rank_filter = _ints(ranks, "ranks")
    if rank_filter is None and not all_ranks:
        rank_filter = frozenset({0})
    if isinstance(stages, str):
        stages = [stages]
    filters = _Filters(
        ranks=rank_filter,
        steps=_ints(steps, "steps"),
        stages=None if stages is None else frozenset(label_key(s) for s in stages),
    )
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"'jobs' must be an int >= 1: {jobs!r}")

    found, skipped = discover(root)
    unique = _without_duplicates(_identified(found, filters, skipped), skipped)
    if jobs is None:
        total = sum(_size(t.path) for t in unique)
        jobs = _default_jobs() if total >= PARALLEL_MIN_BYTES else 1
    fold = _Fold(filters)
    for trace, result in zip(unique, _scan_all(unique, jobs, filters.stages), strict=True):
        if isinstance(result, Skipped):
            skipped.append(result)
        else:
            fold.add(trace, result)
    stage_stats = [_across(members) for members in fold.groups().values()]
    stage_stats.sort(key=lambda s: (-(s.ratio or 0.0), -s.max_ms, s.step, s.role, s.stage))
    skipped.sort(key=lambda s: s.path)
    return Report(
        directory=str(root),
        stages=tuple(stage_stats),
        skipped=tuple(skipped),
        files=fold.files,
        bytes=fold.bytes,
        events=fold.events,
        elapsed_s=time.perf_counter() - started,
        jobs=jobs,
        gpu=fold.gpu_rows(),
    )


def _identified(found: list[TraceFile], filters: _Filters, skipped: list[Skipped]) -> list[TraceFile]:
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


_CellKey = tuple[int, str, str, str, int | str]


class _Fold:
    """Sums the files' segments per step x role x stage x rank."""

    def __init__(self, filters: _Filters) -> None:
        self.filters = filters
        self.cells: dict[_CellKey, _Cell] = {}
        self.names: dict[str, str] = {}  # label key -> the name as the user wrote it
        self.files = self.bytes = self.events = 0
        self.gpu: dict[tuple[int, int], tuple[int | None, int | None, GpuTimes]] = {}

    def add(self, trace: TraceFile, scan: FileScan) -> None:
        self._add_gpu(trace, scan)
        self.files += 1
        self.bytes += scan.bytes
        self.events += scan.events
        role = _role(trace, scan)
        _, _, _, who, number, _ = trace.key()
        steps = self.filters.steps
        for segment in scan.segments:
            if not self.filters.keeps_stage(segment.stage):
                continue
            step = trace.step if segment.step is None else segment.step
            if steps is not None and step not in steps:
                continue
            _remember(self.names, role)
            _remember(self.names, segment.stage)
            key = (step, label_key(role), label_key(segment.stage), who, number)
            cell = self.cells.get(key)
            if cell is None:
                cell = self.cells[key] = _Cell(role, segment.stage, trace.rank, trace.replica, worker=trace.worker)
            cell.comm_us += segment.comm_us
            cell.iterations += segment.iterations
            if segment.work_us is not None or cell.work_us is not None:
                cell.work_us = (cell.work_us if cell.work_us is not None else cell.wall_us) + (
                    segment.wall_us if segment.work_us is None else segment.work_us
                )
            cell.wall_us += segment.wall_us
            cell.basis.add(segment.basis)
            cell.minibatch_us += segment.minibatch_us
            cell.mini_batches += segment.mini_batches
            cell.cpu_us += segment.cpu_us
            cell.kernel_us += segment.kernel_us
            cell.kernels += segment.kernels
            cell.events += segment.events
            if trace.path not in cell.files:
                cell.files.append(trace.path)
            if trace.window is not None:
                cell.windows.append(trace.window)
            cell.partial = cell.partial or trace.partial

    def _add_gpu(self, trace: TraceFile, scan: FileScan) -> None:
        steps = self.filters.steps
        for row in scan.gpu:
            if row.step is not None and steps is not None and row.step not in steps:
                continue
            # sort key: rank (unknown last), whole trace first, then steps
            key = (-1 if trace.rank is None else trace.rank, -1 if row.step is None else row.step)
            held = self.gpu.get(key)
            if held is None:
                self.gpu[key] = (trace.rank, row.step, replace(row.times))
            else:
                held[2].add(row.times)

    def gpu_rows(self) -> tuple[dict[str, Any], ...]:
        """The ``gpu`` rows of the JSON, by rank then step."""
        order = sorted(self.gpu, key=lambda k: (k[0] < 0, k))
        return tuple({"rank": self.gpu[k][0], "step": self.gpu[k][1], **self.gpu[k][2].to_dict()} for k in order)

    def groups(self) -> dict[tuple[int, str, str], list[RankStats]]:
        """The ranks of every step x role x stage."""
        groups: dict[tuple[int, str, str], list[RankStats]] = {}
        names = self.names
        for (step, role_key, stage_key, _, _), cell in self.cells.items():
            groups.setdefault((step, role_key, stage_key), []).append(
                RankStats(
                    step=step,
                    role=names.get(role_key, cell.role),
                    stage=names.get(stage_key, cell.stage),
                    rank=cell.rank,
                    replica=cell.replica,
                    wall_ms=cell.wall_us / _US_PER_MS,
                    basis="+".join(sorted(cell.basis)),
                    minibatch_ms=cell.minibatch_us / _US_PER_MS,
                    mini_batches=cell.mini_batches,
                    cpu_ms=cell.cpu_us / _US_PER_MS,
                    kernel_ms=cell.kernel_us / _US_PER_MS if cell.kernels else None,
                    kernels=cell.kernels,
                    events=cell.events,
                    files=tuple(cell.files),
                    windows=tuple(sorted(cell.windows)),
                    partial=cell.partial,
                    worker=cell.worker,
                    comm_ms=cell.comm_us / _US_PER_MS,
                    work_ms=None if cell.work_us is None else cell.work_us / _US_PER_MS,
                    iterations=cell.iterations,
                )
            )
        return groups


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _remember(names: dict[str, str], label: str) -> None:
    key = label_key(label)
    # The name as written in code ("update_actor") beats its file-name form ("update-actor").
    if key not in names or (names[key] == key and label != key):
        names[key] = label


def _role(trace: TraceFile, scan: FileScan) -> str:
    return meta_label(scan.header.get("instrument"), "role") or trace.role


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _across(members: list[RankStats]) -> StageStats:
    members.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else r.replica or 0, r.worker or ""))
    walls = [r.wall_ms for r in members]
    median = _median(walls)
    # Judged by work: a rank that waits in a collective for a slow peer has a long wall time too, so
    # the slow one is the rank with the most time outside collectives (an engine: its execution time).
    works = [r.judged_ms for r in members]
    median_work = _median(works)
    slowest = max(members, key=lambda r: r.judged_ms)  # max keeps the first of equals: the lowest rank
    by_work = any(r.work_ms is not None for r in members)
    kernels = [r.kernel_ms for r in members if r.kernel_ms is not None]
    first = members[0]
    return StageStats(
        step=first.step,
        role=first.role,
        stage=first.stage,
        ranks=tuple(members),
        median_ms=median,
        max_ms=max(walls),
        min_ms=min(walls),
        straggler=slowest.label,
        straggler_rank=slowest.rank,
        ratio=slowest.judged_ms / median_work if median_work > 0 else None,
        minibatch_ms=_median([r.minibatch_ms for r in members]),
        cpu_ms=_median([r.cpu_ms for r in members]),
        kernel_ms=_median(kernels) if kernels else None,
        events=_median([float(r.events) for r in members]),
        judged_by="work" if by_work else "wall",
        median_work_ms=median_work,
    )
