"""The numbers of a report: one rank's stage (:class:`RankStats`) and a stage across ranks (:class:`StageStats`).

:func:`across` names the straggler. Ranks are judged by work when a trace says what work is (time
outside collectives; an engine's execution time), else by wall time: a rank waiting in a barrier for
a slow peer has as long a wall time as the peer, so wall time would name a waiter.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["US_PER_MS", "RankStats", "StageStats", "across"]

US_PER_MS = 1000.0


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
    tokens: int = 0
    """Tokens those iterations scheduled, where the engine's range names say (vLLM's do)."""

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
            "tokens": self.tokens,
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


def _r(value: float) -> float:
    return round(value, 3)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def across(members: list[RankStats]) -> StageStats:
    """The ranks of one step x role x stage together (``members`` is sorted in place: by rank)."""
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
