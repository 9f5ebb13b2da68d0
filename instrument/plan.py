"""What a configured run will record: steps, ranks, stages, windows and file names.

``instrument plan`` prints this before a 1,000-GPU job starts, so schedule
mistakes show up as a warning instead of as a missing trace.  Everything is
worked out by arithmetic: steps and ranks stay ``range`` objects when every step
or rank is profiled, windows come from :func:`instrument.schedule.window_series`
and :class:`PlannedTraces` computes the ``i``-th file name on demand, so a plan
of 10**8 steps x 10**8 ranks costs what a plan of one step does.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from instrument import naming, ranks, schedule
from instrument.config import ProfilerConfig

__all__ = ["PlannedTrace", "PlannedTraces", "RunPlan", "StageSpec", "count", "int_runs", "plan_run"]

_NO_WINDOWS = schedule.WindowSeries(start=0, cycle=1, active=1, end=0, total=0)

# Up to this many idle finish-hook ranks are listed one by one in the warning, as before; more become runs.
_LISTED_RANKS = 32


@dataclass(frozen=True)
class StageSpec:
    """A stage of the worker: its name, whether ``profile_window`` advances a schedule in it, and the role
    its traces are named after when not the worker's (``profiled_stage(name, role="critic")``)."""

    name: str
    scheduled: bool = False
    role: str | None = None

    @classmethod
    def parse(cls, text: str) -> StageSpec:
        """Read ``[ROLE:]NAME[:scheduled]`` (``update_actor``, ``critic:update_critic:scheduled``)."""
        parts = text.split(":")
        scheduled = len(parts) > 1 and parts[-1] == "scheduled"
        if scheduled:
            parts.pop()
        elif len(parts) > 1 and _looks_like_the_flag(parts[-1]):  # NAME:sched is a typo, not ROLE:NAME
            raise ValueError(f"stage flag must be 'scheduled': {text!r}")
        if len(parts) > 2 or not all(p.strip() for p in parts):
            raise ValueError(f"stage must look like NAME, NAME:scheduled or ROLE:NAME[:scheduled]: {text!r}")
        *role, name = (p.strip() for p in parts)
        for label in (*role, name):
            naming.sanitize_label(label)  # fail now on a name that cannot become a file name
        return cls(name, scheduled, role[0] if role else None)


def _looks_like_the_flag(word: str) -> bool:
    word = word.strip().lower()
    return len(word) >= 3 and ("scheduled".startswith(word) or bool(difflib.get_close_matches(word, ["scheduled"])))


@dataclass(frozen=True)
class PlannedTrace:
    """One trace file a rank will write."""

    step: int
    rank: int
    stage: str
    prefix: str
    window: schedule.Window | None = None

    @property
    def pattern(self) -> str:
        """The file name with host, pid and timestamp left as placeholders."""
        return f"{self.prefix}_{{host}}_pid{{pid}}_{{timestamp}}{naming.TRACE_SUFFIX}"


def count(values: Sequence[int]) -> int:
    """How many values: like ``len`` but also for sequences longer than a machine integer."""
    if isinstance(values, range):
        return max(0, (values.stop - values.start + values.step - 1) // values.step)
    if isinstance(values, (schedule.WindowSeries, PlannedTraces)):
        return values.total
    return len(values)


def int_runs(values: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct ints as ``(first, last)`` runs of consecutive values: ``0,1,2,5`` -> ``(0,2), (5,5)``.

    A unit-step ``range`` is one run at O(1) cost; anything else is walked (it came from a config).
    """
    if isinstance(values, range) and values.step == 1:
        return [(values.start, values.stop - 1)] if values.stop > values.start else []
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


@dataclass(frozen=True)
class _Segment:
    """The traces one stage writes per step and rank: one, or one per window."""

    stage: str
    windows: schedule.WindowSeries | None
    role: str | None = None  # the stage's own role; None: the worker's

    @property
    def size(self) -> int:
        return 1 if self.windows is None else self.windows.total


@dataclass(frozen=True, eq=False)
class PlannedTraces(Sequence[PlannedTrace]):
    """Every trace of a run, in the order step, rank, stage, window, computed on demand.

    ``total`` is the number of files; ``per_rank`` the number each profiled rank
    writes over the run.  ``len()`` works while ``total`` fits a machine integer.
    """

    role: str
    world_size: int
    steps: Sequence[int]
    ranks: Sequence[int]
    segments: tuple[_Segment, ...]

    @property
    def per_step_and_rank(self) -> int:
        """Traces one profiled rank writes in one profiled step."""
        return sum(segment.size for segment in self.segments)

    @property
    def per_rank(self) -> int:
        """Traces one profiled rank writes over the run."""
        return count(self.steps) * self.per_step_and_rank

    @property
    def total(self) -> int:
        """Traces of the whole run."""
        return count(self.ranks) * self.per_rank

    def of_rank(self, rank: int) -> int:
        """Traces global rank ``rank`` writes over the run (0 when it is not profiled)."""
        return self.per_rank if rank in self.ranks else 0

    def _trace(self, step: int, rank: int, segment: _Segment, k: int) -> PlannedTrace:
        window = None if segment.windows is None else segment.windows[k]
        prefix = naming.trace_prefix(
            role=self.role if segment.role is None else segment.role,
            stage=segment.stage,
            step=step,
            rank=rank,
            world_size=self.world_size,
            window=None if window is None else (window.first, window.last),
            partial=window is not None and window.partial,
        )
        return PlannedTrace(step=step, rank=rank, stage=segment.stage, prefix=prefix, window=window)

    def _at(self, index: int) -> PlannedTrace:
        per_pair = self.per_step_and_rank
        pair, offset = divmod(index, per_pair)
        step_index, rank_index = divmod(pair, count(self.ranks))
        for segment in self.segments:
            if offset < segment.size:
                return self._trace(self.steps[step_index], self.ranks[rank_index], segment, offset)
            offset -= segment.size
        raise AssertionError("offset beyond the segments")  # pragma: no cover - divmod keeps it inside

    @overload
    def __getitem__(self, index: int) -> PlannedTrace: ...
    @overload
    def __getitem__(self, index: slice) -> list[PlannedTrace]: ...
    def __getitem__(self, index: int | slice) -> PlannedTrace | list[PlannedTrace]:
        positions = range(self.total)  # a range does the index arithmetic, big ints included
        if isinstance(index, slice):
            return [self._at(i) for i in positions[index]]
        return self._at(positions[index])

    def __len__(self) -> int:
        return self.total

    def __bool__(self) -> bool:
        return self.total > 0

    def __iter__(self) -> Iterator[PlannedTrace]:
        for step in self.steps:
            for rank in self.ranks:
                for segment in self.segments:
                    for k in range(segment.size):
                        yield self._trace(step, rank, segment, k)


@dataclass(frozen=True)
class RunPlan:
    """The answer of :func:`plan_run`.

    ``steps``, ``ranks`` and ``finish_ranks`` are sorted: a ``range`` when every step
    or rank is selected, else a tuple.  Use :func:`count` and :func:`int_runs` on them
    rather than ``len`` or a loop: a range may hold 10**8 values.
    """

    config: ProfilerConfig
    role: str
    num_steps: int
    world_size: int
    num_mini_batches: int
    stages: tuple[StageSpec, ...]
    steps: Sequence[int]
    ranks: Sequence[int]
    windows: schedule.WindowSeries
    traces: PlannedTraces
    finish_ranks: Sequence[int]
    warnings: tuple[str, ...] = field(default=())


def _describe(s: schedule.ScheduleLike) -> str:
    first_skip = f"skip_first={s.skip_first}" + (" (first wait skipped)" if s.skip_first_wait else "")
    return f"{first_skip}, wait={s.wait}, warmup={s.warmup}, active={s.active}, repeat={s.repeat}"


def _selected(chosen: tuple[int, ...], all_ranks: bool, world_size: int) -> Sequence[int]:
    """``ranks.profiled_ranks`` without materialising ``all_ranks`` as a tuple."""
    return range(world_size) if all_ranks else ranks.profiled_ranks(chosen, False, world_size)


def _missing(wanted: Sequence[int], present: Sequence[int]) -> list[tuple[int, int]]:
    """Runs of the values of ``wanted`` not in ``present`` (both sorted); no loop over a range."""
    if isinstance(present, range):
        return []  # a range is every rank of the world (all_ranks): wanted lies inside it
    if isinstance(wanted, range):  # every rank minus a configured list: the gaps between its values
        runs, start = [], wanted.start
        for value in present:
            if value > start:
                runs.append((start, value - 1))
            start = value + 1
        if start < wanted.stop:
            runs.append((start, wanted.stop - 1))
        return runs
    kept = set(present)
    return int_runs([value for value in wanted if value not in kept])


def _idle_hook_warning(idle: list[tuple[int, int]]) -> str:
    total = sum(last - first + 1 for first, last in idle)
    if total <= _LISTED_RANKS:
        shown = str([rank for first, last in idle for rank in range(first, last + 1)])
    else:
        shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in idle[:8])
        shown += (", ..." if len(idle) > 8 else "") + f" ({total} ranks)"
    return (
        f"finish hook ranks {shown} profile nothing themselves; their command sees the other "
        "ranks' files only on a shared filesystem"
    )


def _steps_and_ranks(
    config: ProfilerConfig, num_steps: int, world_size: int, notes: list[str]
) -> tuple[Sequence[int], Sequence[int]]:
    """The profiled steps and ranks: ranges when every one is, never a list of 10**8 ints."""
    if not config.active:
        why = "enable is false" if not config.enable else "tool is 'none'"
        notes.append(f"profiling is off ({why}): nothing is recorded and no finish hook runs")
        return (), ()
    profiled = _selected(config.ranks, config.all_ranks, world_size)
    if config.steps is None:
        return range(1, num_steps + 1), profiled
    beyond = [s for s in config.steps if s > num_steps]
    if beyond:
        notes.append(f"steps {beyond} are never reached in a {num_steps}-step run")
    return tuple(s for s in config.steps if s <= num_steps), profiled


def _windows(
    config: ProfilerConfig, stages: tuple[StageSpec, ...], num_mini_batches: int, notes: list[str]
) -> schedule.WindowSeries:
    """The windows of every scheduled stage (by arithmetic), with the warnings the schedule earns."""
    sched = config.schedule
    scheduled = any(stage.scheduled for stage in stages)
    if not config.active:
        return _NO_WINDOWS
    if sched is None:
        if scheduled:
            notes.append("no schedule is set: scheduled stages are recorded whole, one trace each")
        return _NO_WINDOWS
    if not config.discrete:
        if config.dialect != "verl":
            notes.append("continuous mode writes one trace per step; the schedule applies only in discrete mode")
            return _NO_WINDOWS
        # verl's dialect: one schedule over the step, advanced by every scheduled stage's mini-batches (docs/modes.md)
        num_mini_batches *= sum(stage.scheduled for stage in stages)
        if not scheduled:
            recorded = schedule.first_recorded(sched) == 0
            notes.append(
                "no stage is scheduled (use NAME:scheduled): "
                + ("each step is recorded whole" if recorded else "the schedule never records, nothing is written")
            )
            return _NO_WINDOWS
    if not scheduled:
        notes.append("a schedule is set but no stage is scheduled (use NAME:scheduled): it never applies")
    windows = schedule.window_series(num_mini_batches, sched)
    if scheduled and not windows:
        notes.append(
            f"no mini-batch is ever recorded: {num_mini_batches} mini-batches per update, but the first "
            f"window starts at mini-batch {schedule.first_recorded(sched)} ({_describe(sched)})"
        )
    if windows and windows[-1].partial and scheduled:  # only the last window can be cut short
        window = windows[-1]
        notes.append(
            f"window mb{window.first}-{window.first + sched.active - 1} cannot complete with "
            f"{num_mini_batches} mini-batches: it is saved partial as mb{window.first}-{window.last}"
        )
    return windows


def plan_run(
    config: ProfilerConfig,
    *,
    num_steps: int,
    world_size: int,
    num_mini_batches: int = 1,
    role: str = "actor",
    stages: tuple[StageSpec, ...] = (StageSpec("update_actor", scheduled=True),),
) -> RunPlan:
    """Work out every trace a run of ``num_steps`` steps on ``world_size`` ranks writes, with warnings."""
    if num_steps < 1:
        raise ValueError(f"'num_steps' must be >= 1: {num_steps}")
    if world_size < 1:
        raise ValueError(f"'world_size' must be >= 1: {world_size}")
    if num_mini_batches < 0:
        raise ValueError(f"'num_mini_batches' must be >= 0: {num_mini_batches}")
    if not stages:
        raise ValueError("at least one stage is needed")
    notes: list[str] = []
    if config.active:
        ranks.validate_ranks(config.ranks, world_size)
    if config.finish_hook is not None:
        ranks.validate_ranks(config.finish_hook.ranks, world_size, field="finish_hook.ranks")
    steps, profiled = _steps_and_ranks(config, num_steps, world_size, notes)
    windows = _windows(config, tuple(stages), num_mini_batches, notes)

    if not config.discrete:
        # verl's dialect keeps a scheduled step's windows; a step without scheduled mini-batches is saved
        # whole when the schedule records from its start
        sched = config.schedule if config.dialect == "verl" else None
        whole = sched is None or (windows.total == 0 and schedule.first_recorded(sched) == 0)
        segments: tuple[_Segment, ...] = (_Segment(naming.CONTINUOUS_STAGE, None if whole else windows),)
    else:
        segments = tuple(
            _Segment(stage.name, windows if stage.scheduled and config.schedule is not None else None, stage.role)
            for stage in stages
        )
    traces = PlannedTraces(role=role, world_size=world_size, steps=steps, ranks=profiled, segments=segments)

    finish_ranks: Sequence[int] = ()
    if config.finish_hook is not None and config.active:
        hook = config.finish_hook
        finish_ranks = _selected(hook.ranks, hook.all_ranks, world_size)
        idle = _missing(finish_ranks, profiled)
        if idle:
            notes.append(_idle_hook_warning(idle))
    return RunPlan(
        config=config,
        role=role,
        num_steps=num_steps,
        world_size=world_size,
        num_mini_batches=num_mini_batches,
        stages=tuple(stages),
        steps=steps,
        ranks=profiled,
        windows=windows,
        traces=traces,
        finish_ranks=finish_ranks,
        warnings=tuple(notes),
    )
