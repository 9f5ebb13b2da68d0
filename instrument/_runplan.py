"""What a configured run will record: steps, ranks, stages, windows and file names.

``instrument plan`` prints this before a 1,000-GPU job starts, so schedule
mistakes show up as a warning instead of as a missing trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from instrument import naming, ranks, schedule
from instrument.config import ProfilerConfig

__all__ = ["PlannedTrace", "RunPlan", "StageSpec", "plan_run"]


@dataclass(frozen=True)
class StageSpec:
    """A stage of the worker: its name and whether ``profile_window`` advances a schedule in it."""

    name: str
    scheduled: bool = False

    @classmethod
    def parse(cls, text: str) -> StageSpec:
        """Read ``NAME`` or ``NAME:scheduled``."""
        name, _, flag = text.partition(":")
        if not name.strip():
            raise ValueError(f"stage must look like NAME or NAME:scheduled: {text!r}")
        if flag not in ("", "scheduled"):
            raise ValueError(f"stage flag must be 'scheduled': {text!r}")
        naming.sanitize_label(name)  # fail now on a name that cannot become a file name
        return cls(name.strip(), flag == "scheduled")


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


@dataclass(frozen=True)
class RunPlan:
    """The answer of :func:`plan_run`."""

    config: ProfilerConfig
    role: str
    num_steps: int
    world_size: int
    num_mini_batches: int
    stages: tuple[StageSpec, ...]
    steps: tuple[int, ...]
    ranks: tuple[int, ...]
    windows: tuple[schedule.Window, ...]
    traces: tuple[PlannedTrace, ...]
    finish_ranks: tuple[int, ...]
    warnings: tuple[str, ...] = field(default=())


def _describe(s: schedule.ScheduleLike) -> str:
    first_skip = f"skip_first={s.skip_first}" + (" (first wait skipped)" if s.skip_first_wait else "")
    return f"{first_skip}, wait={s.wait}, warmup={s.warmup}, active={s.active}, repeat={s.repeat}"


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
    if num_mini_batches < 0:
        raise ValueError(f"'num_mini_batches' must be >= 0: {num_mini_batches}")
    if not stages:
        raise ValueError("at least one stage is needed")
    notes: list[str] = []
    if config.active:
        ranks.validate_ranks(config.ranks, world_size)
    if config.finish_hook is not None:
        ranks.validate_ranks(config.finish_hook.ranks, world_size, field="finish_hook.ranks")

    if not config.active:
        why = "enable is false" if not config.enable else "tool is 'none'"
        notes.append(f"profiling is off ({why}): nothing is recorded and no finish hook runs")
        steps: tuple[int, ...] = ()
        profiled: tuple[int, ...] = ()
    else:
        wanted = config.steps if config.steps is not None else tuple(range(1, num_steps + 1))
        steps = tuple(s for s in wanted if s <= num_steps)
        beyond = [s for s in wanted if s > num_steps]
        if beyond:
            notes.append(f"steps {beyond} are never reached in a {num_steps}-step run")
        profiled = ranks.profiled_ranks(config.ranks, config.all_ranks, world_size)

    sched = config.schedule
    scheduled = [stage for stage in stages if stage.scheduled]
    windows: tuple[schedule.Window, ...] = ()
    if config.active and not config.discrete and sched is not None:
        notes.append("continuous mode writes one trace per step; the schedule applies only in discrete mode")
    elif config.active and sched is not None:
        if not scheduled:
            notes.append("a schedule is set but no stage is scheduled (use NAME:scheduled): it never applies")
        windows = tuple(schedule.plan(num_mini_batches, sched))
        if scheduled and not windows:
            notes.append(
                f"no mini-batch is ever recorded: {num_mini_batches} mini-batches per update, but the first "
                f"window starts at mini-batch {schedule.first_recorded(sched)} ({_describe(sched)})"
            )
        for window in windows:
            if window.partial and scheduled:
                notes.append(
                    f"window mb{window.first}-{window.first + sched.active - 1} cannot complete with "
                    f"{num_mini_batches} mini-batches: it is saved partial as mb{window.first}-{window.last}"
                )
    elif config.active and scheduled:
        notes.append("no schedule is set: scheduled stages are recorded whole, one trace each")

    traces: list[PlannedTrace] = []
    for step in steps:
        for rank in profiled:
            traces.extend(_traces_of(config, role, step, rank, world_size, stages, windows))

    finish_ranks: tuple[int, ...] = ()
    if config.finish_hook is not None and config.active:
        hook = config.finish_hook
        finish_ranks = ranks.profiled_ranks(hook.ranks, hook.all_ranks, world_size)
        idle = sorted(set(finish_ranks) - set(profiled))
        if idle:
            notes.append(
                f"finish hook ranks {idle} profile nothing themselves; their command sees the other "
                "ranks' files only on a shared filesystem"
            )
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
        traces=tuple(traces),
        finish_ranks=finish_ranks,
        warnings=tuple(notes),
    )


def _traces_of(
    config: ProfilerConfig,
    role: str,
    step: int,
    rank: int,
    world_size: int,
    stages: tuple[StageSpec, ...],
    windows: tuple[schedule.Window, ...],
) -> list[PlannedTrace]:
    def trace(stage: str, window: schedule.Window | None = None) -> PlannedTrace:
        prefix = naming.trace_prefix(
            role=role,
            stage=stage,
            step=step,
            rank=rank,
            world_size=world_size,
            window=None if window is None else (window.first, window.last),
            partial=window is not None and window.partial,
        )
        return PlannedTrace(step=step, rank=rank, stage=stage, prefix=prefix, window=window)

    if not config.discrete:
        return [trace(naming.CONTINUOUS_STAGE)]
    out: list[PlannedTrace] = []
    for stage in stages:
        if stage.scheduled and config.schedule is not None:
            out.extend(trace(stage.name, window) for window in windows)
        else:
            out.append(trace(stage.name))
    return out
