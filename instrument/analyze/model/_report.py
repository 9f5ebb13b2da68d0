"""The values an analysis is made of: who wrote a file (:class:`TraceFile`), what was left out
(:class:`Skipped`), one rank's stage (:class:`RankStats`), a stage across ranks (:class:`StageStats`),
a memory file (:class:`MemoryFile`), the page's details (:class:`RunFacts`, :class:`StageOps`) and the whole
result (:class:`Report`), which holds the step timeline's (:mod:`._timeline`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from instrument import naming
from instrument.analyze.model import _json
from instrument.analyze.model._spans import TimelineSpans
from instrument.analyze.model._timeline import TimelineReport

__all__ = [
    "CLOCK_CAVEAT",
    "ENGINE_STAGES",
    "GENERATION_STAGES",
    "STRAGGLER_MIN_MS",
    "STRAGGLER_MIN_SHARE",
    "MemoryFile",
    "RankStats",
    "Report",
    "RunFacts",
    "Skipped",
    "StageOps",
    "StageStats",
    "TraceFile",
    "label_key",
]


ENGINE_STAGES = frozenset({"engine", "frontend"})
"""The stages of rollout engine traces (vLLM / SGLang): a replica's engine and its frontend profile the same
seconds, inside the stage that generates, so they never add to a step's time."""
GENERATION_STAGES = frozenset({"generate_sequences", "generate"})
"""Stages that generate (the engine's work lies inside them); the step timeline's analysis reads the same."""
STRAGGLER_MIN_MS = 5.0
"""The slowest rank's wall time under which a stage names no straggler (:attr:`StageStats.below_floor`): "a few
ms", where noise and jitter rule."""
STRAGGLER_MIN_SHARE = 0.01
"""Share of its step (the slowest rank's wall time over the step's) under which a stage names no straggler."""
CLOCK_CAVEAT = "Clocks of different hosts are not aligned: ranks are compared by durations only, never by timestamps."


def label_key(label: str) -> str:
    """The form two labels are compared in: ``update_actor`` and ``update-actor`` are one stage."""
    try:
        return naming.sanitize_label(label)
    except (TypeError, ValueError):
        return str(label)


@dataclass(frozen=True)
class Skipped:
    """A file left out of the analysis, and why."""

    path: str
    reason: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Skipped:
        """The inverse of the ``{"path", "reason"}`` object ``--json`` writes."""
        return cls(_json.text(data, "path", what="a skipped file's 'path'"), _json.text(data, "reason", ""))


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryFile:
        """The inverse of :meth:`to_dict`; ``ValueError`` names the key."""
        window = data.get("window")
        return cls(
            _json.text(data, "path", what="a memory file's 'path'"),
            _json.text(data, "kind", what="a memory file's 'kind'"),
            _json.text(data, "role", what="a memory file's 'role'"),
            _json.text(data, "stage", what="a memory file's 'stage'"),
            _json.integer(data, "step", what="a memory file's 'step'"),
            _json.integer(data, "rank", what="a memory file's 'rank'"),
            None if window is None else _json.pair(window, "a memory file's 'window'"),
            _json.integer(data, "bytes", 0, what="a memory file's 'bytes'"),
            _json.opt_int(data, "peak_allocated", "a memory file's 'peak_allocated'"),
            _json.text(data, "note", ""),
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any], step: int | None, role: str, stage: str) -> RankStats:
        """The inverse of :meth:`to_dict`, for one row of the stage ``(step, role, stage)``."""
        files = data.get("files", [])
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError(f"a rank's 'files' must be a list of strings (got {files!r})")
        return cls(
            step=step,
            role=role,
            stage=stage,
            rank=_json.opt_int(data, "rank", "a rank"),
            replica=_json.opt_int(data, "replica", "a rank's 'replica'"),
            wall_ms=_json.number(data, "wall_ms"),
            basis=_json.text(data, "basis", "stage"),
            minibatch_ms=_json.number(data, "minibatch_ms", 0.0),
            mini_batches=_json.integer(data, "mini_batches", 0),
            cpu_ms=_json.number(data, "cpu_ms", 0.0),
            kernel_ms=_json.opt_number(data, "kernel_ms"),
            kernels=_json.integer(data, "kernels", 0),
            events=_json.integer(data, "events", 0),
            files=tuple(files),
            windows=tuple(_json.pair(w, "a rank's window") for w in _json.rows_or_pairs(data, "windows")),
            partial=_json.boolean(data, "partial", False),
            worker=_json.opt_str(data, "worker"),
            comm_ms=_json.number(data, "comm_ms", 0.0),
            work_ms=_json.opt_number(data, "work_ms"),
            iterations=_json.integer(data, "iterations", 0),
            tokens=_json.integer(data, "tokens", 0),
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageStats:
        """The inverse of :meth:`to_dict`; ``ValueError`` names the key."""
        step = _json.opt_int(data, "step", "a stage's 'step'")
        role, stage = data.get("role"), data.get("stage")
        if not isinstance(role, str) or not isinstance(stage, str):
            raise ValueError("a stage's 'role' and 'stage' must be strings")
        ratio = _json.opt_number(data, "straggler_ratio")
        return cls(
            step=step,
            role=role,
            stage=stage,
            ranks=tuple(RankStats.from_json(r, step, role, stage) for r in _json.rows(data, "per_rank")),
            median_ms=_json.number(data, "median_ms", 0.0),
            max_ms=_json.number(data, "max_ms", 0.0),
            min_ms=_json.number(data, "min_ms", 0.0),
            straggler=_json.opt_str(data, "straggler"),
            straggler_rank=_json.opt_int(data, "straggler_rank"),
            ratio=ratio,
            minibatch_ms=_json.number(data, "median_minibatch_ms", 0.0),
            cpu_ms=_json.number(data, "median_cpu_ms", 0.0),
            kernel_ms=_json.opt_number(data, "median_kernel_ms"),
            events=_json.number(data, "median_events", 0.0),
            judged_by=_json.text(data, "straggler_by", "wall"),
            median_work_ms=_json.number(data, "median_work_ms", 0.0),
            lost_ms=_json.number(data, "lost_ms", 0.0),
            below_floor=_json.opt_str(data, "below_floor"),
        )


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
    in its last step): the page's top ops (:mod:`..traces._details`)."""

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
    """What the run's manifests and file names say about it: the page's run information (:mod:`..traces._details`)."""

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
    """CUDA memory snapshots and CPU memory timelines beside the traces (:mod:`..traces._snapshots`)."""
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """A report from its :meth:`to_dict` (``instrument analyze --json`` read back): the one reader of that
        form, so a saved analysis compares, renders and round-trips as the live one (without the spans behind
        the timeline and the page's details, which ``--json`` does not hold; percentages are made again from the
        milliseconds kept, so their last digit may move). ``ValueError`` names what is not an analysis; keys a
        newer version adds are ignored, keys an older one lacked take their defaults."""
        if not isinstance(data, Mapping) or not isinstance(data.get("stages"), list) or "directory" not in data:
            raise ValueError("no 'directory' and 'stages' in it")
        timeline = data.get("timeline")
        if timeline is not None and not isinstance(timeline, Mapping):
            raise ValueError("'timeline' must be an object or null")
        return cls(
            directory=_json.text(data, "directory"),
            stages=tuple(StageStats.from_json(s) for s in _json.rows(data, "stages")),
            skipped=tuple(Skipped.from_json(s) for s in _json.rows(data, "skipped", [])),
            files=_json.integer(data, "files", 0),
            bytes=_json.integer(data, "bytes", 0),
            events=_json.integer(data, "events", 0),
            elapsed_s=_json.number(data, "elapsed_s", 0.0),
            jobs=_json.integer(data, "jobs", 1),
            caveat=_json.text(data, "caveat", CLOCK_CAVEAT),
            gpu=tuple(dict(g) for g in _json.rows(data, "gpu", [])),
            memory=tuple(MemoryFile.from_json(m) for m in _json.rows(data, "memory", [])),
            gpu_kernels=tuple(dict(g) for g in _json.rows(data, "gpu_kernels", [])),
            gpu_idle=tuple(dict(g) for g in _json.rows(data, "gpu_idle", [])),
            notes=tuple(Skipped.from_json(s) for s in _json.rows(data, "notes", [])),
            timeline=None if timeline is None else TimelineReport.from_json(data),
            timeline_note=_json.opt_str(data, "timeline_note"),
        )
