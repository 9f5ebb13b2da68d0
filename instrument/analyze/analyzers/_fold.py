"""Per-file segments summed per step x role x stage x rank (:class:`Fold`), through the analysis's
:class:`~instrument.analyze.model.Filters`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from instrument.analyze.analyzers._stats import US_PER_MS
from instrument.analyze.model import Filters, RankStats, Skipped, TraceFile, label_key
from instrument.analyze.traces._gpu import GpuTimes
from instrument.analyze.traces._kernels import KernelTimes
from instrument.analyze.traces._reader import FileScan, meta_label

__all__ = ["Fold"]


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
    tokens: int = 0


_CellKey = tuple[int | None, str, str, str, int | str]


class Fold:
    """Sums the files' segments per step x role x stage x rank."""

    def __init__(self, filters: Filters) -> None:
        self.filters = filters
        self.cells: dict[_CellKey, _Cell] = {}
        self.names: dict[str, str] = {}  # label key -> the name as the user wrote it
        self.files = self.bytes = self.events = 0
        self.gpu: dict[tuple[int, int], tuple[int | None, int | None, GpuTimes]] = {}
        self.kernels: dict[int, tuple[int | None, KernelTimes]] = {}
        self.steps: dict[int, list[float]] = {}  # ProfilerStep#N -> its µs on each file that has it
        self.notes: list[Skipped] = []

    def add(self, trace: TraceFile, scan: FileScan) -> None:
        """Add one file's segments and GPU rows to its cells."""
        self._add_gpu(trace, scan)
        self.notes.extend(Skipped(trace.path, note) for note in scan.notes)
        if trace.inside:  # elsewhere (the SDK's window traces) a ProfilerStep is a mini-batch, not a step
            for step_number, wall_us in scan.steps:
                if self.filters.steps is None or step_number in self.filters.steps:
                    self.steps.setdefault(step_number, []).append(wall_us)
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
            cell.tokens += segment.tokens
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
        if scan.kernels is not None:
            rank = -1 if trace.rank is None else trace.rank
            held_kernels = self.kernels.get(rank)
            if held_kernels is None:
                self.kernels[rank] = (trace.rank, scan.kernels)
            else:
                held_kernels[1].add(scan.kernels)
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

    def kernel_rows(self) -> tuple[dict[str, Any], ...]:
        """The ``gpu_kernels`` rows of the JSON, by rank (unknown last)."""
        order = sorted(self.kernels, key=lambda k: (k < 0, k))
        return tuple(self.kernels[k][1].kernels_row(self.kernels[k][0]) for k in order)

    def idle_rows(self) -> tuple[dict[str, Any], ...]:
        """The ``gpu_idle`` rows of the JSON, by rank (unknown last)."""
        order = sorted(self.kernels, key=lambda k: (k < 0, k))
        return tuple(self.kernels[k][1].idle_row(self.kernels[k][0]) for k in order)

    def step_ms(self) -> dict[int, float]:
        """Each ``ProfilerStep#N``'s time in ms, the median over the files that hold it."""
        return {n: statistics.median(walls) / US_PER_MS for n, walls in self.steps.items()}

    def groups(self) -> dict[tuple[int | None, str, str], list[RankStats]]:
        """The ranks of every step x role x stage."""
        groups: dict[tuple[int | None, str, str], list[RankStats]] = {}
        names = self.names
        for (step, role_key, stage_key, _, _), cell in self.cells.items():
            groups.setdefault((step, role_key, stage_key), []).append(
                RankStats(
                    step=step,
                    role=names.get(role_key, cell.role),
                    stage=names.get(stage_key, cell.stage),
                    rank=cell.rank,
                    replica=cell.replica,
                    wall_ms=cell.wall_us / US_PER_MS,
                    basis="+".join(sorted(cell.basis)),
                    minibatch_ms=cell.minibatch_us / US_PER_MS,
                    mini_batches=cell.mini_batches,
                    cpu_ms=cell.cpu_us / US_PER_MS,
                    kernel_ms=cell.kernel_us / US_PER_MS if cell.kernels else None,
                    kernels=cell.kernels,
                    events=cell.events,
                    files=tuple(cell.files),
                    windows=tuple(sorted(cell.windows)),
                    partial=cell.partial,
                    worker=cell.worker,
                    comm_ms=cell.comm_us / US_PER_MS,
                    work_ms=None if cell.work_us is None else cell.work_us / US_PER_MS,
                    iterations=cell.iterations,
                    tokens=cell.tokens,
                )
            )
        return groups


def _remember(names: dict[str, str], label: str) -> None:
    key = label_key(label)
    # The name as written in code ("update_actor") beats its file-name form ("update-actor").
    if key not in names or (names[key] == key and label != key):
        names[key] = label


def _role(trace: TraceFile, scan: FileScan) -> str:
    return meta_label(scan.header.get("instrument"), "role") or trace.role
