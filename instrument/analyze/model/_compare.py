"""The values a comparison of two runs is made of (:class:`Comparison` and what it holds).

Plain values, like :mod:`._report` beside them: :mod:`..analyzers._compare` makes them, the renderers
(:mod:`..render._compare`) show them, and :meth:`Comparison.to_dict` is the ``instrument compare --json``
contract (``docs/compare.md``). Every duration is per stage instance — one rank's stage in one step, the
unit the medians are taken over — unless its name says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Cause",
    "Change",
    "Comparison",
    "CompareFinding",
    "MachineShift",
    "Method",
    "OpTable",
    "Overlap",
    "PathShare",
    "RoleIdle",
    "TimelineComparison",
    "Verdict",
]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class Verdict:
    """What a comparison of two sets of durations concluded (the ``verdict`` strings of the JSON)."""

    CHANGED = "changed"
    """Beyond noise and at least ``min_change_pct``: reported."""
    SMALL = "small"
    """Beyond noise, but under ``min_change_pct``."""
    NOISE = "noise"
    """Within noise."""
    TOO_FEW = "too_few_samples"
    """Too few samples on a side for the test to reach its level: no verdict."""
    MACHINE = "machine"
    """Beyond noise against the machine-wide shift, but within the spread of the stages around it: the
    machine's, not the stage's own."""


@dataclass(frozen=True)
class MachineShift:
    """A change common to the stages of a run (a machine that got slower or faster): the median of the stages'
    log ratios, which one stage that changed cannot move."""

    pct: float
    """The median of the stages' log ratios (candidate median over baseline median), as a % change."""
    stages: int
    """Stages it is the median of (those with a verdict)."""
    moved: int
    """Of them, those whose median moved by ``min_change_pct`` or more its way."""
    along: int
    """Of them, those beyond noise its way (each judged against the baseline itself)."""
    spread_pct: float
    """1.4826 x the median absolute deviation of the stages' log ratios around it, as a %: how far from one
    factor the stages moved."""
    common: bool
    """At least 3 stages, more than half of them moved by ``min_change_pct`` or more its way and at least one
    beyond noise that way: reported once, and every stage is judged against it."""

    @property
    def factor(self) -> float:
        """The candidate's time over the baseline's that the shift alone explains."""
        return 1.0 + self.pct / 100.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "change_pct": _r(self.pct, 2),
            "common": self.common,
            "stages": self.stages,
            "moved": self.moved,
            "along": self.along,
            "spread_pct": _r(self.spread_pct, 2),
        }


@dataclass(frozen=True)
class Cause:
    """One op, kernel, mini-batch window or nested stage, its time per stage instance in each run."""

    kind: str
    """``op`` (CPU, self time), ``kernel`` (GPU event), ``window`` (a ``profile_window``, ``mb{i}``) or
    ``stage`` (a stage nested inside this one)."""
    name: str
    baseline_ms: float
    candidate_ms: float
    baseline_count: float
    """Calls per stage instance (mean)."""
    candidate_count: float
    communication: bool = False
    """A collective (``nccl``, ``gloo``, ``c10d``) op or kernel."""

    @property
    def delta_ms(self) -> float:
        """The candidate's time minus the baseline's."""
        return self.candidate_ms - self.baseline_ms

    @property
    def status(self) -> str:
        """``new`` (only in the candidate), ``vanished`` (only in the baseline) or ``changed``."""
        if self.baseline_count == 0:
            return "new"
        if self.candidate_count == 0:
            return "vanished"
        return "changed"

    def mean_us(self, candidate: bool) -> float | None:
        """Time per call (µs) in one run; ``None`` where it never ran."""
        count = self.candidate_count if candidate else self.baseline_count
        spent = self.candidate_ms if candidate else self.baseline_ms
        return 1000.0 * spent / count if count else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "kind": self.kind,
            "name": self.name,
            "baseline_ms": _r(self.baseline_ms),
            "candidate_ms": _r(self.candidate_ms),
            "delta_ms": _r(self.delta_ms),
            "status": self.status,
            "count": [_r(self.baseline_count), _r(self.candidate_count)],
            "mean_us": [_r(self.mean_us(False)), _r(self.mean_us(True))],
            "communication": self.communication,
        }


@dataclass(frozen=True)
class Change:
    """One quantity in both runs — the step's wall time, or a (role, stage) — and whether it changed."""

    role: str | None
    """``None`` for the step."""
    stage: str | None
    baseline_ms: float
    """Median of the baseline's samples (per stage instance; per step for the step)."""
    candidate_ms: float
    change_pct: float | None
    """Candidate median over baseline median, minus 1, in %; ``None`` when the baseline's is 0."""
    ci_pct: tuple[float, float] | None
    """The (1 - alpha) interval of the ratio (Hodges-Lehmann on log durations), in %; ``None``: no verdict."""
    p_value: float | None
    verdict: str
    """One of :class:`Verdict`'s strings."""
    samples: tuple[int, int]
    """Per-(step, rank) durations on each side (steps, for the step)."""
    source: str
    """``timeline``, ``traces``, ``mixed`` (one side each) or ``json`` (an analysis given as JSON)."""
    ranks: tuple[int, int] = (0, 0)
    """Ranks the samples come from, on each side."""
    steps: tuple[int, int] = (0, 0)
    """Steps the samples come from, on each side."""
    moved_ranks: tuple[str, ...] = ()
    """Ranks whose own median moved by at least ``min_change_pct`` the same way (a reported change only)."""
    causes: tuple[Cause, ...] = ()
    """Largest ``|delta_ms|`` first (a reported change only)."""
    causes_from: str | None = None
    """Where the causes come from, in words (``traces: 8 and 8 stage instances``)."""
    causes_note: str | None = None
    """Why there are no causes of a given kind, when there are none."""
    comm_share: tuple[float | None, float | None] | None = None
    """Share (%) of the stage's wall time its CPU side was blocked in collectives (traces), per run."""
    kernel_comm_share: tuple[float | None, float | None] | None = None
    """Share (%) of the stage's GPU time in communication kernels (the traces read for causes), per run."""
    machine_pct: float | None = None
    """The machine-wide shift the stage was judged against (``None``: none was common); ``verdict`` and
    ``p_value`` are then the test of the candidate against the baseline times it."""
    relative_pct: float | None = None
    """The change beyond the machine-wide shift: candidate median over (baseline median x shift), minus 1."""
    relative_ci_pct: tuple[float, float] | None = None
    """The interval of that ratio (the one the verdict's test inverts)."""

    @property
    def significant(self) -> bool:
        """Beyond noise and at least ``min_change_pct``: the change is reported."""
        return self.verdict == Verdict.CHANGED

    @property
    def beyond_noise(self) -> bool:
        """The test rejects "no change" at its level, whatever the size."""
        return self.verdict in (Verdict.CHANGED, Verdict.SMALL)

    @property
    def delta_ms(self) -> float:
        """Candidate median minus baseline median."""
        return self.candidate_ms - self.baseline_ms

    @property
    def label(self) -> str:
        """``actor update_actor``, or ``step``."""
        return "step" if self.stage is None else f"{self.role} {self.stage}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the contract's keys, then the rest)."""
        data: dict[str, Any] = {}
        if self.stage is not None:
            data.update(role=self.role, stage=self.stage)
        data.update(
            baseline_ms=_r(self.baseline_ms),
            candidate_ms=_r(self.candidate_ms),
            change_pct=_r(self.change_pct, 2),
            ci_pct=None if self.ci_pct is None else [_r(self.ci_pct[0], 2), _r(self.ci_pct[1], 2)],
            significant=self.significant,
            samples=list(self.samples),
        )
        if self.stage is not None:
            data["causes"] = [c.to_dict() for c in self.causes]
        data.update(
            verdict=self.verdict,
            beyond_noise=self.beyond_noise,
            p_value=None if self.p_value is None else float(f"{self.p_value:.4g}"),
            delta_ms=_r(self.delta_ms),
            source=self.source,
            ranks=list(self.ranks),
            steps=list(self.steps),
        )
        if self.stage is not None:
            data.update(
                machine_pct=_r(self.machine_pct, 2),
                relative_pct=_r(self.relative_pct, 2),
                relative_ci_pct=(
                    None
                    if self.relative_ci_pct is None
                    else [_r(self.relative_ci_pct[0], 2), _r(self.relative_ci_pct[1], 2)]
                ),
                moved_ranks=list(self.moved_ranks),
                causes_from=self.causes_from,
                causes_note=self.causes_note,
                comm_share_pct=None if self.comm_share is None else [_r(v, 2) for v in self.comm_share],
                kernel_comm_share_pct=(
                    None if self.kernel_comm_share is None else [_r(v, 2) for v in self.kernel_comm_share]
                ),
            )
        return data


@dataclass(frozen=True)
class RoleIdle:
    """A role's idle share of its rank-time over the compared steps, in each run (``None``: absent there)."""

    role: str
    baseline_pct: float | None
    candidate_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"role": self.role, "baseline_pct": _r(self.baseline_pct, 2), "candidate_pct": _r(self.candidate_pct, 2)}


@dataclass(frozen=True)
class PathShare:
    """A (role, stage)'s time on the critical path, per step (mean over steps), in each run; stage ``idle``
    is time on the path when no stage ran."""

    role: str | None
    stage: str
    baseline_ms: float
    candidate_ms: float
    baseline_pct: float
    candidate_pct: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "role": self.role,
            "stage": self.stage,
            "baseline_ms": _r(self.baseline_ms),
            "candidate_ms": _r(self.candidate_ms),
            "baseline_pct": _r(self.baseline_pct, 2),
            "candidate_pct": _r(self.candidate_pct, 2),
        }


@dataclass(frozen=True)
class TimelineComparison:
    """The step timeline's view, before and after: idle per role and the critical path's composition."""

    steps: tuple[int, int]
    roles: tuple[RoleIdle, ...]
    critical_path: tuple[PathShare, ...]
    """Largest time on either side first; empty when a side's clocks are not aligned (no path)."""
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "steps": list(self.steps),
            "idle": [r.to_dict() for r in self.roles],
            "critical_path": [p.to_dict() for p in self.critical_path],
            "note": self.note,
        }


@dataclass(frozen=True)
class CompareFinding:
    """One sentence with its numbers; ``delta_ms`` is the time it changed per step (0 for a statement)."""

    kind: str
    """``step``, ``machine``, ``stage``, ``nothing_else``, ``nothing``, ``idle``, ``too_few``, ``mismatch``."""
    text: str
    delta_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"kind": self.kind, "text": self.text, "delta_ms": _r(self.delta_ms)}


@dataclass(frozen=True)
class Overlap:
    """What the two runs share (what was compared) and what only one of them holds (listed, not compared)."""

    ranks: tuple[int, int]
    """Ranks seen on each side."""
    common_ranks: tuple[str, ...]
    only_baseline_ranks: tuple[str, ...] = ()
    only_candidate_ranks: tuple[str, ...] = ()
    only_baseline_roles: tuple[str, ...] = ()
    only_candidate_roles: tuple[str, ...] = ()
    only_baseline_stages: tuple[tuple[str, str], ...] = ()
    """(role, stage) pairs."""
    only_candidate_stages: tuple[tuple[str, str], ...] = ()
    hosts: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """The host names each run's files carry (trace names, timeline headers)."""

    @property
    def machines_differ(self) -> bool:
        """Both runs name their hosts and they are not the same set."""
        return bool(self.hosts[0]) and bool(self.hosts[1]) and set(self.hosts[0]) != set(self.hosts[1])

    @property
    def matched(self) -> bool:
        """Both runs hold the same ranks, roles and stages."""
        return not (
            self.only_baseline_ranks
            or self.only_candidate_ranks
            or self.only_baseline_roles
            or self.only_candidate_roles
            or self.only_baseline_stages
            or self.only_candidate_stages
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ranks": list(self.ranks),
            "common_ranks": list(self.common_ranks),
            "only_baseline": {
                "ranks": list(self.only_baseline_ranks),
                "roles": list(self.only_baseline_roles),
                "stages": [{"role": r, "stage": s} for r, s in self.only_baseline_stages],
            },
            "only_candidate": {
                "ranks": list(self.only_candidate_ranks),
                "roles": list(self.only_candidate_roles),
                "stages": [{"role": r, "stage": s} for r, s in self.only_candidate_stages],
            },
            "hosts": {"baseline": list(self.hosts[0]), "candidate": list(self.hosts[1])},
        }


@dataclass(frozen=True)
class Method:
    """How changes were judged."""

    alpha: float
    min_change_pct: float
    min_samples: int
    test: str = "Mann-Whitney U (two-sided; exact under 30 samples a side without ties, else normal)"
    interval: str = "Hodges-Lehmann on log durations (the interval the rank-sum test inverts)"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "test": self.test,
            "interval": self.interval,
            "alpha": self.alpha,
            "min_change_pct": self.min_change_pct,
            "min_samples": self.min_samples,
        }


@dataclass(frozen=True)
class Comparison:
    """Two runs compared; :meth:`to_dict` is what ``instrument compare --json`` prints."""

    baseline: str
    candidate: str
    step: Change
    changes: tuple[Change, ...]
    """One per (role, stage) in both runs, significant or not, the largest ``|delta_ms|`` first."""
    findings: tuple[CompareFinding, ...]
    method: Method
    overlap: Overlap
    timeline: TimelineComparison | None = None
    machine: MachineShift | None = None
    """The change common to the stages (``None``: under 3 stages with a verdict); said once when common."""
    skipped: tuple[tuple[str, str], ...] = ()
    """(path, reason) of files either analysis left out."""
    notes: tuple[str, ...] = ()
    elapsed_s: float = 0.0

    @property
    def significant(self) -> tuple[Change, ...]:
        """The reported changes."""
        return tuple(c for c in self.changes if c.significant)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "step": self.step.to_dict(),
            "machine": None if self.machine is None else self.machine.to_dict(),
            "changes": [c.to_dict() for c in self.changes],
            "findings": [f.to_dict() for f in self.findings],
            "method": self.method.to_dict(),
            "overlap": self.overlap.to_dict(),
            "timeline": None if self.timeline is None else self.timeline.to_dict(),
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "notes": list(self.notes),
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)


@dataclass
class OpTable:
    """Ops and kernels of one stage instance (or of one file's part of it), by name."""

    rows: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(``op`` | ``kernel``, name) -> [ms, calls]."""
    comm: set[tuple[str, str]] = field(default_factory=set)
    """The rows that are collectives."""
    kernel_ms: float = 0.0
    kernel_comm_ms: float = 0.0

    def add(self, other: OpTable) -> None:
        """Fold in another part of the same instance (a second window's file)."""
        for key, (spent, calls) in other.rows.items():
            held = self.rows.setdefault(key, [0.0, 0.0])
            held[0] += spent
            held[1] += calls
        self.comm |= other.comm
        self.kernel_ms += other.kernel_ms
        self.kernel_comm_ms += other.kernel_comm_ms
