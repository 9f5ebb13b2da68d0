"""The step timeline's values: where a step's time went on each rank (:class:`RankTimeline`, kept as columns in
:class:`RankTable`), per role (:class:`RoleTimeline`), per step (:class:`StepTimeline`), the findings
(:class:`Finding`) and the whole (:class:`TimelineReport`); the spans kept for drawing are in :mod:`._spans`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass
from itertools import islice, repeat
from operator import truediv
from typing import TYPE_CHECKING, Any, overload

from instrument.analyze.model import _json

if TYPE_CHECKING:
    pass

__all__ = [
    "ClockInfo",
    "Finding",
    "RankTable",
    "RankTimeline",
    "RoleTimeline",
    "StepTimeline",
    "TimeShare",
    "TimelineReport",
    "WaitRow",
    "findings_text",
]

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any], what: str = "a time share") -> TimeShare:
        """The inverse of :meth:`to_json` (``rank`` may be absent: a role's cause); ``ValueError`` names the key."""
        return cls(
            _json.opt_str(data, "role", f"{what}'s 'role'"),
            _json.text(data, "stage", what=f"{what}'s 'stage'"),
            _json.opt_int(data, "rank", f"{what}'s 'rank'"),
            _json.number(data, "ms", what=f"{what}'s 'ms'"),
        )


WaitRow = tuple[str | None, str, int | None, int]
"""One cause a lane waited for, as stored: (role, stage, rank, ns); role and rank ``None`` when unattributed."""


class RankTimeline:
    """One lane in one step: busy (its stages' union), ``instrument_ms`` (the SDK's own spans, and waits for them
    on other ranks), idle (the rest of its step span), and the causes.

    Immutable, and equal by its values as a dataclass is. ``waited_for`` is given as :class:`TimeShare` values,
    or as ``(table, lane)``, a lane of a step's :class:`RankTable`: the analysis stores millions of waits that
    way, and each read makes the tuple afresh."""

    __slots__ = ("_lane", "_waits", "busy_ms", "idle_ms", "instrument_ms", "rank", "role")
    __match_args__ = ("rank", "role", "busy_ms", "idle_ms", "waited_for", "instrument_ms")

    rank: int
    role: str
    busy_ms: float
    idle_ms: float
    instrument_ms: float
    _waits: tuple[TimeShare, ...] | RankTable
    _lane: int

    def __init__(
        self,
        rank: int,
        role: str,
        busy_ms: float,
        idle_ms: float,
        waited_for: tuple[TimeShare, ...] | tuple[RankTable, int] = (),
        instrument_ms: float = 0.0,
    ) -> None:
        setter = object.__setattr__
        setter(self, "rank", rank)
        setter(self, "role", role)
        setter(self, "busy_ms", busy_ms)
        setter(self, "idle_ms", idle_ms)
        setter(self, "instrument_ms", instrument_ms)
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
        return waits.waits_ms(self._lane)

    def _values(self) -> tuple[int, str, float, float, tuple[TimeShare, ...], float]:
        return (self.rank, self.role, self.busy_ms, self.idle_ms, self.waited_for, self.instrument_ms)

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

    def __reduce__(self) -> tuple[type[RankTimeline], tuple[int, str, float, float, tuple[TimeShare, ...], float]]:
        return (RankTimeline, self._values())

    def __repr__(self) -> str:
        return (
            f"RankTimeline(rank={self.rank!r}, role={self.role!r}, busy_ms={self.busy_ms!r}, "
            f"idle_ms={self.idle_ms!r}, waited_for={self.waited_for!r}, instrument_ms={self.instrument_ms!r})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "role": self.role,
            "busy_ms": _round(self.busy_ms),
            "idle_ms": _round(self.idle_ms),
            "instrument_ms": _round(self.instrument_ms),
            "waited_for": [
                {"role": role, "stage": stage, "rank": rank, "ms": _round(ms)} for role, stage, rank, ms in self.waits()
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankTimeline:
        """The inverse of :meth:`to_json`; ``ValueError`` names the key."""
        return cls(
            _json.integer(data, "rank", what="a timeline rank's 'rank'"),
            _json.text(data, "role", what="a timeline rank's 'role'"),
            _json.number(data, "busy_ms", 0.0),
            _json.number(data, "idle_ms", 0.0),
            tuple(TimeShare.from_json(w, "a wait") for w in _json.rows(data, "waited_for", [])),
            _json.number(data, "instrument_ms", 0.0),
        )


class RankTable(Sequence["RankTimeline"]):
    """One step's lanes as columns: a :class:`RankTimeline` (and its :class:`TimeShare` waits) is made only when
    one is read. Compares equal to any sequence of the same rows.

    At 4,096 ranks a report holds ~400k lanes and ~4M waits: ~150 and ~96 bytes each as objects, 26 and 20 here.
    Lane ``i`` is ``roles[role[i]]``, ``rank[i]``, ``busy_ns[i]``, ``idle_ns[i]``, ``instrument_ns[i]``; its waits are
    rows ``at[i]`` to ``at[i + 1]`` of ``causes[cause[j]]`` (role, stage), ``wait_rank[j]`` (ignored when the role
    is ``None``: unattributed) and ``wait_ns[j]``, in the order they are reported."""

    __slots__ = (
        "_causes",
        "_named",
        "_roles",
        "at",
        "busy_ns",
        "cause",
        "causes",
        "idle_ns",
        "instrument_ns",
        "rank",
        "role",
        "roles",
        "wait_ns",
        "wait_rank",
    )

    def __init__(self, causes: Sequence[tuple[str | None, str]] = ()) -> None:
        """``causes``: the (role, stage) table that :meth:`add_numbered`'s cause numbers index (not copied)."""
        self.roles: list[str] = []
        self.role = array("H")
        self.rank = array("q")
        self.busy_ns = array("q")
        self.idle_ns = array("q")
        self.instrument_ns = array("q")
        self.causes: Sequence[tuple[str | None, str]] = causes
        self.cause = array("I")
        self.wait_rank = array("q")
        self.wait_ns = array("q")
        self.at = array("I", [0])
        self._roles: dict[str, int] = {}
        self._causes: dict[tuple[str | None, str], int] | None = None if causes else {}
        self._named: tuple[list[str | None], list[str], frozenset[int]] | None = None  # made as first read

    def _lane(self, rank: int, role: str, busy_ns: int, idle_ns: int, instrument_ns: int) -> None:
        roles = self._roles
        self.role.append(roles.setdefault(role, len(roles)))
        if len(roles) != len(self.roles):
            self.roles = list(roles)
        self.rank.append(rank)
        self.busy_ns.append(busy_ns)
        self.idle_ns.append(idle_ns)
        self.instrument_ns.append(instrument_ns)

    def add(
        self, rank: int, role: str, busy_ns: int, idle_ns: int, waits: list[WaitRow], instrument_ns: int = 0
    ) -> None:
        """Append one lane: its busy, idle (and the SDK's) time and its waits (in order)."""
        self._lane(rank, role, busy_ns, idle_ns, instrument_ns)
        causes = self._causes
        if causes is None:  # numbered by a table given at the start: grown from it
            self._causes = causes = {cause: i for i, cause in reversed(list(enumerate(self.causes)))}
        self.cause.extend([causes.setdefault((r, stage), len(causes)) for r, stage, _, _ in waits])
        if len(causes) != len(self.causes):
            self.causes = list(causes)
        self.wait_rank.extend([-1 if k is None else k for _, _, k, _ in waits])
        self.wait_ns.extend([ns for _, _, _, ns in waits])
        self.at.append(len(self.wait_ns))

    def add_numbered(
        self,
        rank: int,
        role: str,
        busy_ns: int,
        idle_ns: int,
        causes: Sequence[int],
        ranks: Sequence[int],
        ns: Sequence[int],
        instrument_ns: int = 0,
    ) -> None:
        """Append one lane whose waits are columns already: ``causes`` numbers into :attr:`causes` (the table
        given at the start), ``ranks`` (-1 where unattributed) and ``ns``, in order."""
        self._lane(rank, role, busy_ns, idle_ns, instrument_ns)
        self.cause.extend(causes)
        self.wait_rank.extend(ranks)
        self.wait_ns.extend(ns)
        self.at.append(len(self.wait_ns))

    def add_lanes(
        self,
        ranks: Sequence[int],
        roles: Sequence[str],
        busy_ns: Sequence[int],
        idle_ns: Sequence[int],
        bounds: Sequence[int],
        causes: Sequence[int],
        wait_ranks: Sequence[int],
        wait_ns: Sequence[int],
        instrument_ns: Sequence[int] | None = None,
    ) -> None:
        """Append lanes as columns, what :meth:`add_numbered` lane after lane gives: lane ``i``'s waits are rows
        ``bounds[i]`` to ``bounds[i + 1]`` of ``causes`` / ``wait_ranks`` / ``wait_ns`` (``bounds[0]`` is 0)."""
        numbers = self._roles
        for role in dict.fromkeys(roles):
            numbers.setdefault(role, len(numbers))
        if len(numbers) != len(self.roles):
            self.roles = list(numbers)
        self.role.extend(map(numbers.__getitem__, roles))
        self.rank.extend(ranks)
        self.busy_ns.extend(busy_ns)
        self.idle_ns.extend(idle_ns)
        self.instrument_ns.extend(repeat(0, len(ranks)) if instrument_ns is None else instrument_ns)
        base = len(self.wait_ns)
        self.at.extend(map(base.__add__, islice(bounds, 1, None)))
        self.cause.extend(causes)
        self.wait_rank.extend(wait_ranks)
        self.wait_ns.extend(wait_ns)

    def waits(self, lane: int) -> Iterator[WaitRow]:
        """Lane ``lane``'s waits as (role, stage, rank, ns)."""
        causes, cause, rank, ns = self.causes, self.cause, self.wait_rank, self.wait_ns
        for j in range(self.at[lane], self.at[lane + 1]):
            role, stage = causes[cause[j]]
            yield role, stage, None if role is None else rank[j], ns[j]

    def waits_ms(self, lane: int) -> Iterator[tuple[str | None, str, int | None, float]]:
        """Lane ``lane``'s waits as (role, stage, rank, ms), as :meth:`waits` gives them: zipped from the columns,
        no Python loop a wait (the stragglers' finding reads millions of them)."""
        named = self._named
        if named is None or len(named[0]) != len(self.causes):
            roles = [role for role, _ in self.causes]
            stages = [stage for _, stage in self.causes]
            self._named = named = (roles, stages, frozenset(i for i, role in enumerate(roles) if role is None))
        roles, stages, unattributed = named
        first, past = self.at[lane], self.at[lane + 1]
        ids = self.cause[first:past]
        ms = map(truediv, self.wait_ns[first:past], repeat(_NS_PER_MS))
        wait_ranks: Sequence[int | None] = self.wait_rank[first:past]
        if not unattributed.isdisjoint(ids):  # no rank where no cause
            wait_ranks = list(wait_ranks)
            for cause in unattributed.intersection(ids):
                at = -1
                for _ in range(ids.count(cause)):
                    at = ids.index(cause, at + 1)
                    wait_ranks[at] = None
        return zip(map(roles.__getitem__, ids), map(stages.__getitem__, ids), wait_ranks, ms, strict=True)

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
            self.instrument_ns[index] / _NS_PER_MS,
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
    """A role's lanes in one step, in rank-time (summed over its ``ranks`` lanes).

    ``instrument_ms``: the SDK's own spans and the waits for them (neither busy nor idle). A ``driver`` (a role
    that ran no stage in the run: a controller holding the step open) is never idle: ``idle_ms`` is 0 and
    ``waited_for`` says what it waited on."""

    role: str
    ranks: int
    busy_ms: float
    idle_ms: float
    waited_for: tuple[TimeShare, ...]  # by (role, stage) of the cause; rank None; largest first
    instrument_ms: float = 0.0
    driver: bool = False

    @property
    def idle_pct(self) -> float:
        total = self.busy_ms + self.idle_ms + self.instrument_ms
        return 100.0 * self.idle_ms / total if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "busy_ms": _round(self.busy_ms),
            "idle_ms": _round(self.idle_ms),
            "idle_pct": round(self.idle_pct, 2),
            "instrument_ms": _round(self.instrument_ms),
            "driver": self.driver,
            "waited_for": [{"role": w.role, "stage": w.stage, "ms": _round(w.ms)} for w in self.waited_for],
        }

    @classmethod
    def from_json(cls, role: str, data: Mapping[str, Any]) -> RoleTimeline:
        """The inverse of :meth:`to_json` (the role is its key in the step's ``roles``)."""
        return cls(
            role,
            _json.integer(data, "ranks", 1, what=f"role {role}'s 'ranks'"),
            _json.number(data, "busy_ms", 0.0),
            _json.number(data, "idle_ms", 0.0),
            tuple(TimeShare.from_json(w, "a wait") for w in _json.rows(data, "waited_for", [])),
            _json.number(data, "instrument_ms", 0.0),
            _json.boolean(data, "driver", False, what=f"role {role}'s 'driver'"),
        )


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """One step across all lanes. ``instrument_ms``: the SDK's own time in its wall (on the critical path; unaligned,
    the most on one rank); ``traced``: a profiler recorded it (the SDK's spans, or trace files, say so)."""

    step: int
    wall_ms: float
    critical_path: tuple[TimeShare, ...]  # in time order; sums to wall_ms; empty when clocks are not aligned
    roles: Mapping[str, RoleTimeline]
    ranks: Sequence[RankTimeline]  # by (role, rank); from the analysis a RankTable, its rows made as read
    generation_ms: float
    instrument_ms: float = 0.0
    traced: bool = False

    @property
    def generation_pct(self) -> float:
        return 100.0 * self.generation_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    @property
    def user_wall_ms(self) -> float:
        """The wall time without the SDK's own: what the user's code took (slow steps are judged on it)."""
        return max(0.0, self.wall_ms - self.instrument_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "wall_ms": _round(self.wall_ms),
            "critical_path": [p.to_json() for p in self.critical_path],
            "roles": {name: role.to_json() for name, role in sorted(self.roles.items())},
            "ranks": [r.to_json() for r in self.ranks],
            "generation_ms": _round(self.generation_ms),
            "generation_pct": round(self.generation_pct, 2),
            "instrument_ms": _round(self.instrument_ms),
            "traced": self.traced,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepTimeline:
        """The inverse of :meth:`to_json`; ``ValueError`` names the key."""
        roles = _json.mapping(data, "roles", {}, what="a timeline step's 'roles'")
        return cls(
            _json.integer(data, "step", what="a timeline step's 'step'"),
            _json.number(data, "wall_ms", what="a step's 'wall_ms'"),
            tuple(TimeShare.from_json(p, "a path part") for p in _json.rows(data, "critical_path", [])),
            {name: RoleTimeline.from_json(name, _json.mapping(roles, name)) for name in roles},
            tuple(RankTimeline.from_json(r) for r in _json.rows(data, "ranks", [])),
            _json.number(data, "generation_ms", 0.0),
            _json.number(data, "instrument_ms", 0.0),
            _json.boolean(data, "traced", False, what="a step's 'traced'"),
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """The inverse of :meth:`to_json`; ``ValueError`` names the key."""
        steps = data.get("steps", [])
        if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise ValueError(f"a finding's 'steps' must be a list of ints (got {steps!r})")
        cause = data.get("waiting_for")
        return cls(
            _json.text(data, "kind", what="a finding's 'kind'"),
            _json.text(data, "text", what="a finding's 'text'"),
            _json.number(data, "lost_ms", what="a finding's 'lost_ms'"),
            _json.opt_str(data, "role"),
            _json.opt_str(data, "stage"),
            _json.opt_int(data, "rank", "a finding's 'rank'"),
            tuple(steps),
            None
            if cause is None
            else (
                _json.text(_json.mapping(data, "waiting_for"), "role", what="'waiting_for.role'"),
                _json.text(_json.mapping(data, "waiting_for"), "stage", what="'waiting_for.stage'"),
            ),
        )


@dataclass(frozen=True, slots=True)
class ClockInfo:
    aligned: bool
    max_uncertainty_ms: float | None  # None when not aligned
    note: str | None  # why waits and critical paths are missing, when they are

    def to_json(self) -> dict[str, Any]:
        return {"aligned": self.aligned, "max_uncertainty_ms": self.max_uncertainty_ms, "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClockInfo:
        """The inverse of :meth:`to_json`."""
        return cls(
            _json.boolean(data, "aligned", False, what="'clock.aligned'"),
            _json.opt_number(data, "max_uncertainty_ms", "'clock.max_uncertainty_ms'"),
            _json.opt_str(data, "note", "'clock.note'"),
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimelineReport:
        """The inverse of :meth:`to_json`: ``data`` holds ``timeline`` (an object) and ``findings``."""
        timeline = _json.mapping(data, "timeline", what="'timeline'")
        return cls(
            ClockInfo.from_json(_json.mapping(timeline, "clock", {}, what="'timeline.clock'")),
            tuple(StepTimeline.from_json(s) for s in _json.rows(timeline, "steps", what="'timeline.steps'")),
            tuple(Finding.from_json(f) for f in _json.rows(data, "findings", [], what="'findings'")),
            _json.integer(timeline, "skipped_spans", 0, what="'timeline.skipped_spans'"),
            _json.text(timeline, "source", "files", what="'timeline.source'"),
        )


def findings_text(report: TimelineReport, limit: int = 5) -> list[str]:
    """The first ``limit`` findings' sentences, largest loss first."""
    return [f.text for f in report.findings[:limit]]
