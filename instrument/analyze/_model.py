"""The values an analysis is made of: who wrote a file (:class:`TraceFile`), what was left out
(:class:`Skipped`), one rank's stage (:class:`RankStats`), a stage across ranks (:class:`StageStats`),
a memory file (:class:`MemoryFile`) and the whole result (:class:`Report`).

Plain values at the bottom of the package: reading (:mod:`.traces`) makes the files, the analyzers
(:mod:`.analyzers`) the numbers, and the renderers (:mod:`.render`) take a :class:`Report`; nothing
here imports any of them, so a result never depends on how it is shown.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import FrozenInstanceError, asdict, dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, overload

from instrument import naming
from instrument.timeline import SpanColumns, SpanTable

if TYPE_CHECKING:
    from instrument.timeline import Span

__all__ = [
    "CLOCK_CAVEAT",
    "ENGINE_STAGES",
    "GENERATION_STAGES",
    "ClockInfo",
    "Finding",
    "MemoryFile",
    "RankStats",
    "RankTable",
    "RankTimeline",
    "Report",
    "RoleTimeline",
    "RunFacts",
    "Skipped",
    "StageOps",
    "StageStats",
    "StepTimeline",
    "TimeShare",
    "TimelineLane",
    "TimelineReport",
    "TimelineSpans",
    "TraceFile",
    "WaitRow",
    "findings_text",
    "label_key",
]

ENGINE_STAGES = frozenset({"engine", "frontend"})
"""The stages of rollout engine traces (vLLM / SGLang): a replica's engine and its frontend profile the same
seconds, inside the stage that generates, so they never add to a step's time."""
GENERATION_STAGES = frozenset({"generate_sequences", "generate"})
"""Stages that generate (the engine's work lies inside them); the step timeline's analysis reads the same."""
CLOCK_CAVEAT = "Clocks of different hosts are not aligned: ranks are compared by durations only, never by timestamps."


def label_key(label: str) -> str:
    """The form two labels are compared in: ``update_actor`` and ``update-actor`` are one stage."""
    try:
        return naming.sanitize_label(label)
    except (TypeError, ValueError):
        return str(label)


# --------------------------------------------------------------------------- the step timeline


_NS_PER_MS = 1_000_000


def _round(value: float) -> float:
    return round(value, 3)


@dataclass(frozen=True, slots=True)
class TimeShare:
    """Time given to one stage on one rank (a critical-path part, or what a rank waited for).

    ``stage`` is ``"idle"`` for critical-path time when no stage ran and ``"unattributed"`` for a wait
    with no cause (then ``role`` and ``rank`` are ``None``)."""

    role: str | None
    stage: str
    rank: int | None
    ms: float

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "stage": self.stage, "rank": self.rank, "ms": _round(self.ms)}


WaitRow = tuple[str | None, str, int | None, int]
"""One cause a lane waited for, as stored: (role, stage, rank, ns); role and rank ``None`` when unattributed."""


class RankTimeline:
    """One lane in one step: busy (its stages' union), idle (the rest of its step span), and the causes.

    Immutable, and equal by its values as a dataclass is. ``waited_for`` is given as :class:`TimeShare` values,
    or as ``(table, lane)``, a lane of a step's :class:`RankTable`: the analysis stores millions of waits that
    way, and each read makes the tuple afresh."""

    __slots__ = ("_lane", "_waits", "busy_ms", "idle_ms", "rank", "role")
    __match_args__ = ("rank", "role", "busy_ms", "idle_ms", "waited_for")

    rank: int
    role: str
    busy_ms: float
    idle_ms: float
    _waits: tuple[TimeShare, ...] | RankTable
    _lane: int

    def __init__(
        self,
        rank: int,
        role: str,
        busy_ms: float,
        idle_ms: float,
        waited_for: tuple[TimeShare, ...] | tuple[RankTable, int] = (),
    ) -> None:
        setter = object.__setattr__
        setter(self, "rank", rank)
        setter(self, "role", role)
        setter(self, "busy_ms", busy_ms)
        setter(self, "idle_ms", idle_ms)
        if len(waited_for) == 2 and isinstance(waited_for[0], RankTable):
            setter(self, "_waits", waited_for[0])
            setter(self, "_lane", waited_for[1])
        else:
            setter(self, "_waits", tuple(waited_for))
            setter(self, "_lane", 0)

    @property
    def waited_for(self) -> tuple[TimeShare, ...]:
        """What it waited for, largest first; empty when clocks are not aligned."""
        waits = self._waits
        if isinstance(waits, tuple):
            return waits
        return tuple(TimeShare(role, stage, rank, ns / _NS_PER_MS) for role, stage, rank, ns in waits.waits(self._lane))

    def waits(self) -> Iterator[tuple[str | None, str, int | None, float]]:
        """:attr:`waited_for` as (role, stage, rank, ms) tuples, no :class:`TimeShare` made."""
        waits = self._waits
        if isinstance(waits, tuple):
            return ((w.role, w.stage, w.rank, w.ms) for w in waits)
        return ((role, stage, rank, ns / _NS_PER_MS) for role, stage, rank, ns in waits.waits(self._lane))

    def _values(self) -> tuple[int, str, float, float, tuple[TimeShare, ...]]:
        return (self.rank, self.role, self.busy_ms, self.idle_ms, self.waited_for)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, RankTimeline)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[type[RankTimeline], tuple[int, str, float, float, tuple[TimeShare, ...]]]:
        return (RankTimeline, self._values())

    def __repr__(self) -> str:
        return (
            f"RankTimeline(rank={self.rank!r}, role={self.role!r}, busy_ms={self.busy_ms!r}, "
            f"idle_ms={self.idle_ms!r}, waited_for={self.waited_for!r})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "role": self.role,
            "busy_ms": _round(self.busy_ms),
            "idle_ms": _round(self.idle_ms),
            "waited_for": [
                {"role": role, "stage": stage, "rank": rank, "ms": _round(ms)} for role, stage, rank, ms in self.waits()
            ],
        }


class RankTable(Sequence["RankTimeline"]):
    """One step's lanes as columns: a :class:`RankTimeline` (and its :class:`TimeShare` waits) is made only when
    one is read. Compares equal to any sequence of the same rows.

    At 4,096 ranks a report holds ~400k lanes and ~4M waits: ~150 and ~96 bytes each as objects, 26 and 20 here.
    Lane ``i`` is ``roles[role[i]]``, ``rank[i]``, ``busy_ns[i]``, ``idle_ns[i]``; its waits are rows ``at[i]``
    to ``at[i + 1]`` of ``causes[cause[j]]`` (role, stage), ``wait_rank[j]`` (ignored when the role is ``None``:
    unattributed) and ``wait_ns[j]``, in the order they are reported."""

    __slots__ = (
        "_causes",
        "_roles",
        "at",
        "busy_ns",
        "cause",
        "causes",
        "idle_ns",
        "rank",
        "role",
        "roles",
        "wait_ns",
        "wait_rank",
    )

    def __init__(self) -> None:
        self.roles: list[str] = []
        self.role = array("H")
        self.rank = array("q")
        self.busy_ns = array("q")
        self.idle_ns = array("q")
        self.causes: list[tuple[str | None, str]] = []
        self.cause = array("I")
        self.wait_rank = array("q")
        self.wait_ns = array("q")
        self.at = array("I", [0])
        self._roles: dict[str, int] = {}
        self._causes: dict[tuple[str | None, str], int] = {}

    def add(self, rank: int, role: str, busy_ns: int, idle_ns: int, waits: list[WaitRow]) -> None:
        """Append one lane: its busy and idle time and its waits (in order)."""
        roles = self._roles
        self.role.append(roles.setdefault(role, len(roles)))
        if len(roles) != len(self.roles):
            self.roles = list(roles)
        self.rank.append(rank)
        self.busy_ns.append(busy_ns)
        self.idle_ns.append(idle_ns)
        causes = self._causes
        self.cause.extend([causes.setdefault((r, stage), len(causes)) for r, stage, _, _ in waits])
        if len(causes) != len(self.causes):
            self.causes = list(causes)
        self.wait_rank.extend([-1 if k is None else k for _, _, k, _ in waits])
        self.wait_ns.extend([ns for _, _, _, ns in waits])
        self.at.append(len(self.wait_ns))

    def waits(self, lane: int) -> Iterator[WaitRow]:
        """Lane ``lane``'s waits as (role, stage, rank, ns)."""
        causes, cause, rank, ns = self.causes, self.cause, self.wait_rank, self.wait_ns
        for j in range(self.at[lane], self.at[lane + 1]):
            role, stage = causes[cause[j]]
            yield role, stage, None if role is None else rank[j], ns[j]

    def __len__(self) -> int:
        return len(self.rank)

    @overload
    def __getitem__(self, index: int) -> RankTimeline: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[RankTimeline, ...]: ...
    def __getitem__(self, index: int | slice) -> RankTimeline | tuple[RankTimeline, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("lane index out of range")
        return RankTimeline(
            self.rank[index],
            self.roles[self.role[index]],
            self.busy_ns[index] / _NS_PER_MS,
            self.idle_ns[index] / _NS_PER_MS,
            (self, index),
        )

    def __iter__(self) -> Iterator[RankTimeline]:
        return map(self.__getitem__, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # grows while its step is analysed

    def __repr__(self) -> str:
        return f"RankTable({len(self)} lanes, {len(self.wait_ns)} waits)"


@dataclass(frozen=True, slots=True)
class RoleTimeline:
    """A role's lanes in one step, in rank-time (summed over its ``ranks`` lanes)."""

    role: str
    ranks: int
    busy_ms: float
    idle_ms: float
    waited_for: tuple[TimeShare, ...]  # by (role, stage) of the cause; rank None; largest first

    @property
    def idle_pct(self) -> float:
        total = self.busy_ms + self.idle_ms
        return 100.0 * self.idle_ms / total if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "busy_ms": _round(self.busy_ms),
            "idle_ms": _round(self.idle_ms),
            "idle_pct": round(self.idle_pct, 2),
            "waited_for": [{"role": w.role, "stage": w.stage, "ms": _round(w.ms)} for w in self.waited_for],
        }


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """One step across all lanes."""

    step: int
    wall_ms: float
    critical_path: tuple[TimeShare, ...]  # in time order; sums to wall_ms; empty when clocks are not aligned
    roles: Mapping[str, RoleTimeline]
    ranks: Sequence[RankTimeline]  # by (role, rank); from the analysis a RankTable, its rows made as read
    generation_ms: float

    @property
    def generation_pct(self) -> float:
        return 100.0 * self.generation_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "wall_ms": _round(self.wall_ms),
            "critical_path": [p.to_json() for p in self.critical_path],
            "roles": {name: role.to_json() for name, role in sorted(self.roles.items())},
            "ranks": [r.to_json() for r in self.ranks],
            "generation_ms": _round(self.generation_ms),
            "generation_pct": round(self.generation_pct, 2),
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """One sentence with its numbers; ``lost_ms`` is per step, averaged over the analysed steps."""

    kind: str  # "straggler" | "bubble" | "dominant_stage" | "slow_step"
    text: str
    lost_ms: float
    role: str | None
    stage: str | None
    rank: int | None
    steps: tuple[int, ...]
    waiting_for: tuple[str, str] | None = None  # a bubble's main cause: (role, stage)

    def to_json(self) -> dict[str, Any]:
        cause = self.waiting_for
        return {
            "kind": self.kind,
            "text": self.text,
            "lost_ms": _round(self.lost_ms),
            "role": self.role,
            "stage": self.stage,
            "rank": self.rank,
            "steps": list(self.steps),
            "waiting_for": None if cause is None else {"role": cause[0], "stage": cause[1]},
        }


@dataclass(frozen=True, slots=True)
class ClockInfo:
    aligned: bool
    max_uncertainty_ms: float | None  # None when not aligned
    note: str | None  # why waits and critical paths are missing, when they are

    def to_json(self) -> dict[str, Any]:
        return {"aligned": self.aligned, "max_uncertainty_ms": self.max_uncertainty_ms, "note": self.note}


@dataclass(frozen=True, slots=True)
class TimelineReport:
    clock: ClockInfo
    steps: tuple[StepTimeline, ...]  # by step
    findings: tuple[Finding, ...]  # largest lost_ms first
    skipped_spans: int  # spans that end before they start, or of an unknown kind
    source: str = "files"  # "traces": built from the traces' step and stage ranges (only the traced steps and ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "timeline": {
                "clock": self.clock.to_json(),
                "steps": [s.to_json() for s in self.steps],
                "skipped_spans": self.skipped_spans,
                "source": self.source,
            },
            "findings": [f.to_json() for f in self.findings],
        }


def findings_text(report: TimelineReport, limit: int = 5) -> list[str]:
    """The first ``limit`` findings' sentences, largest loss first."""
    return [f.text for f in report.findings[:limit]]


def _column(code: str, values: Sequence[int]) -> array[int]:
    """``values`` as an array of ``code``: the same array when it is one already (columns read are not changed)."""
    return values if isinstance(values, array) and values.typecode == code else array(code, values)


SpanRow = tuple[str, str, str, int, int, int, int]
"""One span of a :class:`TimelineLane`: kind, role, stage, step, start ns, end ns, thread index."""


@dataclass(frozen=True)
class TimelineLane:
    """One process's timeline spans on the report's axis (ns since its first span), as columns.

    Columns, not :class:`~instrument.timeline.Span` objects: at 4,096 ranks a report holds millions of
    spans, 24 bytes each here against ~150 as objects. Span ``i`` is ``names[name[i]]`` (kind, role,
    stage) with ``step[i]``, ``start_ns[i]``, ``end_ns[i]`` and ``thread[i]`` (the file's thread index)."""

    role: str
    rank: int
    host: str
    pid: int
    names: tuple[tuple[str, str, str], ...]
    name: array[int]
    step: array[int]
    start_ns: array[int]
    end_ns: array[int]
    thread: array[int]

    @classmethod
    def of(
        cls,
        *,
        role: str,
        rank: int,
        host: str,
        pid: int,
        spans: Iterable[Span] | SpanColumns | SpanTable,
        shift_ns: int = 0,
    ) -> TimelineLane:
        """The lane of one process's spans, each moved by ``-shift_ns``.

        Columns (a :class:`SpanColumns`, or a :class:`SpanTable` of one part) are copied as columns, no Span
        made; their name, step and thread columns are shared, not copied, where they already fit."""
        if isinstance(spans, SpanTable) and len(spans.parts) == 1:
            columns, part_shift = spans.parts[0]
            return cls._of_columns(role, rank, host, pid, columns, shift_ns + part_shift)
        if isinstance(spans, SpanColumns):
            return cls._of_columns(role, rank, host, pid, spans, shift_ns)
        index: dict[tuple[str, str, str], int] = {}
        name, step, start, end, thread = array("H"), array("I"), array("q"), array("q"), array("H")
        for span in spans:
            key = (span.kind, span.role, span.stage)
            name.append(index.setdefault(key, len(index)))
            step.append(span.step)
            start.append(span.start_ns - shift_ns)
            end.append(span.end_ns - shift_ns)
            thread.append(span.thread)
        return cls(role, rank, host, pid, tuple(index), name, step, start, end, thread)

    @classmethod
    def _of_columns(
        cls, role: str, rank: int, host: str, pid: int, columns: SpanColumns, shift_ns: int
    ) -> TimelineLane:
        # The lane its Span values give (names in the order first used), no Span made.
        index: dict[tuple[str, str, str], int] = {}
        remap = {n: index.setdefault(columns.names[n], len(index)) for n in dict.fromkeys(columns.name)}
        if all(n == m for n, m in remap.items()):
            name = _column("H", columns.name)
        else:
            name = array("H", map(remap.__getitem__, columns.name))
        start = array("q", [s - shift_ns for s in columns.start_ns] if shift_ns else columns.start_ns)
        end = array("q", map(int.__add__, start, columns.duration_ns))
        step, thread = _column("I", columns.step), _column("H", columns.thread)
        return cls(role, rank, host, pid, tuple(index), name, step, start, end, thread)

    @property
    def label(self) -> str:
        """``actor rank 3``."""
        return f"{self.role} rank {self.rank}"

    def __len__(self) -> int:
        return len(self.name)

    def rows(self) -> Iterator[SpanRow]:
        """Every span as (kind, role, stage, step, start ns, end ns, thread), in the file's order."""
        names = self.names
        columns = (self.name, self.step, self.start_ns, self.end_ns, self.thread)
        for n, step, start, end, thread in zip(*columns, strict=True):
            kind, role, stage = names[n]
            yield kind, role, stage, step, start, end, thread


@dataclass(frozen=True)
class TimelineSpans:
    """The spans the step analysis kept, per process on one axis: what the page, the picture and the merged
    trace draw (never in ``--json``).

    ``aligned`` false: the hosts' clocks are not aligned, and each host was shifted so that its first step
    starts with the reference host's (``note`` says so): durations are right, cross-host timing is not."""

    lanes: tuple[TimelineLane, ...]  # by (role, rank, pid)
    aligned: bool
    note: str | None = None

    @property
    def spans(self) -> int:
        """How many spans the lanes hold."""
        return sum(len(lane) for lane in self.lanes)


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class Skipped:
    """A file left out of the analysis, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class TraceFile:
    """One trace file and who wrote it."""

    path: str
    role: str
    stage: str
    step: int | None  # None when the name carries no step (plain engine traces); 0 is a step
    rank: int | None  # global rank; None for a frontend (see replica) or before the header is read
    world_size: int | None
    window: tuple[int, int] | None = None
    partial: bool = False
    tool: str = "torch"
    replica: int | None = None
    source: str = "manifest"  # manifest | name | engine | trace
    inside: bool = False
    """Steps (``ProfilerStep#N``) and stages (user annotations) are found inside the file."""
    worker: str | None = None
    """A label for a file no one gives a rank (the file's name): analysed all the same."""

    @property
    def continuous(self) -> bool:
        """A continuous-mode trace: one file per step holding every stage as a range."""
        return self.stage == naming.CONTINUOUS_STAGE

    def key(self) -> tuple[int | None, str, str, str, int | str, tuple[int, int] | None]:
        """What two files must not share: step, role, stage, rank (or replica, or worker), window."""
        who: str
        number: int | str | None
        if self.rank is not None:
            who, number = "rank", self.rank
        elif self.worker is not None:
            who, number = "worker", self.worker
        else:
            who, number = "replica", self.replica
        return (
            self.step,
            label_key(self.role),
            label_key(self.stage),
            who,
            -1 if number is None else number,
            self.window,
        )


@dataclass(frozen=True)
class MemoryFile:
    """One memory file: what its name says, its size and (snapshots read here) peak allocated bytes."""

    path: str
    kind: str  # "snapshot" | "oom snapshot" | "timeline"
    role: str
    stage: str
    step: int
    rank: int
    window: tuple[int, int] | None
    bytes: int
    peak_allocated: int | None = None
    note: str = ""  # why no peak: too large to read here, not a snapshot

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["window"] = None if self.window is None else list(self.window)
        return data


# --------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class RankStats:
    """One rank's numbers for one stage of one step (summed over its files: windows of one stage)."""

    step: int | None
    """``None``: no step (a trace whose name and content give none)."""
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
    """Time the CPU side was blocked in collectives within the stage: the call (``c10d::…``) and its gloo
    worker thread's range until the next op; never GPU kernels, which run beside the CPU's work."""
    work_ms: float | None = None
    """What the rank is judged by: wall minus :attr:`comm_ms`, an engine's execution time; ``None``: the wall time."""
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

    step: int | None
    role: str
    stage: str
    ranks: tuple[RankStats, ...]
    median_ms: float
    max_ms: float
    min_ms: float
    straggler: str | None
    """Label of the slowest rank (argmax of its work, see :attr:`judged_by`; the lowest rank on a tie);
    ``None`` when the stage is below the floor (:attr:`below_floor`)."""
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
    lost_ms: float = 0.0
    """Time lost to the straggler: its work over the median work, times the other ranks (each waits that
    long at the next synchronisation); 0 when no straggler is named."""
    below_floor: str | None = None
    """Why no straggler is named: its slowest rank took ``under 5 ms`` or ``under 1% of its step (…)``;
    ``None``: one is."""

    @property
    def engine_side(self) -> bool:
        """A rollout engine's or frontend's row (:data:`ENGINE_STAGES`): beside a stage, not one of the step's."""
        return self.stage in ENGINE_STAGES

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
            "lost_ms": _r(self.lost_ms),
            "below_floor": self.below_floor,
            "median_minibatch_ms": _r(self.minibatch_ms),
            "median_cpu_ms": _r(self.cpu_ms),
            "median_kernel_ms": None if self.kernel_ms is None else _r(self.kernel_ms),
            "median_events": self.events,
            "per_rank": [r.to_dict() for r in self.ranks],
        }


def _r(value: float) -> float:
    return round(value, 3)


_GENERATION_KEYS = frozenset(label_key(name) for name in GENERATION_STAGES)


def _first_starts(spans: TimelineSpans | None) -> dict[tuple[int, str, str], int]:
    """The earliest start (ns, on the timeline's axis) of every (step, role key, stage key) of ``spans``."""
    first: dict[tuple[int, str, str], int] = {}
    if spans is None:
        return first
    for lane in spans.lanes:
        keys = [(kind == "stage", label_key(role), label_key(stage)) for kind, role, stage in lane.names]
        for n, step, start in zip(lane.name, lane.step, lane.start_ns, strict=True):
            is_stage, role, stage = keys[n]
            if is_stage:
                key = (step, role, stage)
                held = first.get(key)
                if held is None or start < held:
                    first[key] = start
    return first


@dataclass(frozen=True)
class StageOps:
    """The ops of most self time in one role's stage, from the files of one of its instances (its slowest rank
    in its last step): the page's top ops (:mod:`.._details`)."""

    role: str
    stage: str
    step: int | None
    rank: str
    """The label of the rank read (:attr:`RankStats.label`)."""
    ops: tuple[tuple[str, float, int], ...]
    """(name, self ms, calls), the most self time first."""
    files: tuple[str, ...]


@dataclass(frozen=True)
class RunFacts:
    """What the run's manifests and file names say about it: the page's run information (:mod:`.._details`)."""

    hosts: tuple[str, ...]
    first_ns: int | None
    """The earliest and latest file-name timestamp (wall clock, ns since the epoch); ``None`` when no name says."""
    last_ns: int | None
    tools: tuple[str, ...]
    roles: tuple[tuple[str, int | None, tuple[int, ...]], ...]
    """(role, world size, the ranks that wrote traces), by role."""
    steps: tuple[int, ...]
    """The steps the traces are of (profiled steps)."""
    modes: tuple[str, ...]
    """``discrete`` (a file per stage) and / or ``continuous`` (a file per step)."""
    windows: tuple[tuple[int, int], ...]
    """The mini-batch windows scheduled stages recorded."""
    manifests: int
    triggered: int
    """Files a trigger (slow step, on demand) wrote."""
    partial: int


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Report:
    """The analysis of one directory; :meth:`to_dict` is what ``--json`` prints.

    Shown by :func:`~instrument.analyze.render_text`, :func:`~instrument.analyze.write_png` and
    :func:`~instrument.analyze.write_html`.
    """

    directory: str
    stages: tuple[StageStats, ...]
    """Sorted by the time lost to their straggler (:attr:`StageStats.lost_ms`), the most first (``--json``'s
    order); :attr:`pipeline` has them in the order they ran, as the table, the page and the picture show them."""
    skipped: tuple[Skipped, ...]
    files: int
    """Trace files read."""
    bytes: int
    events: int
    elapsed_s: float
    jobs: int
    caveat: str = CLOCK_CAVEAT
    gpu: tuple[dict[str, Any], ...] = ()
    """GPU time per rank: the whole trace (``step`` None), then each ``ProfilerStep`` (:mod:`.traces._gpu`)."""
    memory: tuple[MemoryFile, ...] = ()
    """CUDA memory snapshots and CPU memory timelines beside the traces (:mod:`.analyzers._snapshots`)."""
    gpu_kernels: tuple[dict[str, Any], ...] = ()
    """Per rank, whole trace: GPU time by kernel type, the top kernels, the launch delay (:mod:`.traces._kernels`)."""
    gpu_idle: tuple[dict[str, Any], ...] = ()
    """Per rank, whole trace: GPU idle time split into host wait, kernel wait and other (:mod:`.traces._kernels`)."""
    notes: tuple[Skipped, ...] = ()
    """Files read, but without a recognisable stage or step (each read as one range), and why."""
    timeline: TimelineReport | None = None
    """Where each step's time went across roles, from the run's timeline files (:mod:`.analyzers._timeline`)."""
    timeline_note: str | None = None
    """Why there is no :attr:`timeline`, when there is none."""
    timeline_spans: TimelineSpans | None = None
    """The spans behind :attr:`timeline`, per process, for the pictures and ``--merged-trace`` (not in ``--json``)."""
    run: RunFacts | None = None
    """What the files say about the run, for the page (``analyze(..., details=True)``; not in ``--json``)."""
    stage_ops: tuple[StageOps, ...] = ()
    """The top ops of each role's stage, for the page (``analyze(..., details=True)``; not in ``--json``)."""

    @property
    def ok(self) -> bool:
        """Whether every file could be read."""
        return not self.skipped

    @property
    def steps(self) -> tuple[int, ...]:
        """Steps seen (rows without a step are not counted)."""
        return tuple(sorted({s.step for s in self.stages if s.step is not None}))

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks seen."""
        return tuple(sorted({r.rank for s in self.stages for r in s.ranks if r.rank is not None}))

    @property
    def roles(self) -> tuple[str, ...]:
        """Roles seen."""
        return tuple(sorted({s.role for s in self.stages}))

    @cached_property
    def pipeline(self) -> tuple[StageStats, ...]:
        """:attr:`stages` in pipeline order: by step (none last), then by the first start of the stage within
        its step on the step timeline (:attr:`timeline_spans`, on one clock across hosts). An engine or frontend
        row (:attr:`StageStats.engine_side`), which the timeline does not hold, comes right after the step's
        generating stage (:data:`GENERATION_STAGES`), else first (rollout starts a step); other stages the
        timeline does not hold (every stage, without a timeline) come last in their step, in :attr:`stages`' order."""
        starts = _first_starts(self.timeline_spans)
        order = {id(s): i for i, s in enumerate(self.stages)}

        def key(stage: StageStats) -> tuple[bool, int, float, int]:
            step = -1 if stage.step is None else stage.step
            at: float | None = starts.get((step, label_key(stage.role), label_key(stage.stage)))
            if at is None and stage.engine_side:
                generating = [t for (n, _, name), t in starts.items() if n == step and name in _GENERATION_KEYS]
                at = min(generating) + 0.5 if generating else -math.inf  # just after it (ns are ints), else first
            return (stage.step is None, step, math.inf if at is None else at, order[id(stage)])

        return tuple(sorted(self.stages, key=key))

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
            "memory": [m.to_dict() for m in self.memory],
            "gpu_kernels": list(self.gpu_kernels),
            "gpu_idle": list(self.gpu_idle),
            "notes": [{"path": s.path, "reason": s.reason} for s in self.notes],
            **(
                self.timeline.to_json()
                if self.timeline is not None
                else {"timeline": None, "findings": [], "timeline_note": self.timeline_note}
            ),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)
