"""Synthetic runs whose pages must fit a browser window: many steps, many ranks, uneven steps.

Each writes timeline files with ``instrument.timeline``'s encoders (through :func:`write_timeline`) on a made-up
clock with planted durations: nothing sleeps, nothing reads a clock. The role and stage names are long on
purpose, so the page's tables carry long cells.
"""

from __future__ import annotations

from pathlib import Path

from tests.analyze.render.test_timeline_render import BASE, MS, SpanSpec, write_timeline

ACTOR, ROLLOUT = "actor_rollout_ref", "rollout_engine_replica"  # long role names make long cells


def many_steps(directory: Path, steps: int = 20, first_ms: int = 8_000) -> Path:
    """Two actor and two rollout ranks over ``steps`` steps of 700-1,300 ms (rollout rank 3 generates 5x as long
    on every step); step 1 takes ``first_ms``, as a traced step does (its profiler starting), so the others'
    labels crowd."""
    for rank in range(4):
        role = ACTOR if rank < 2 else ROLLOUT
        spans: list[SpanSpec] = []
        t = BASE
        for step in range(1, steps + 1):
            length = first_ms if step == 1 else 700 + (step * 137) % 600
            spans.append(("step", role, "", step, t, t + length * MS, 0))
            if role == ROLLOUT:
                spans.append(("stage", role, "generate_sequences", step, t, t + (250 if rank == 3 else 50) * MS, 0))
            else:
                spans.append(("stage", role, "compute_ref_log_prob", step, t + 260 * MS, t + 300 * MS, 0))
                spans.append(("stage", role, "update_actor", step, t + 310 * MS, t + 600 * MS, 0))
            t += (length + 20) * MS
        write_timeline(directory, role, rank, spans)
    return directory


def many_ranks(directory: Path, world: int = 64, steps: int = 6) -> Path:
    """``world`` ranks, half actors and half rollout, ``steps`` steps of 1.5 s; rollout rank ``world // 2 + 8``
    generates 3x as long on every step (role bands with a straggler's lane)."""
    half = world // 2
    for rank in range(world):
        role = ACTOR if rank < half else ROLLOUT
        spans: list[SpanSpec] = []
        for step in range(1, steps + 1):
            t = BASE + step * 2_000 * MS
            spans.append(("step", role, "", step, t, t + 1_500 * MS, 0))
            if role == ROLLOUT:
                length = (300 if rank == half + 8 else 100 + rank % 7) * MS
                spans.append(("stage", role, "generate_sequences", step, t, t + length, 0))
            else:
                spans.append(("stage", role, "update_actor", step, t + 1_000 * MS, t + (1_100 + rank % 5) * MS, 0))
        write_timeline(directory, role, rank, spans, world=world)
    return directory
