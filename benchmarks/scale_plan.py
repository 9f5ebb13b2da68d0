"""How planning and naming grow with the world: 512 to 4,096 ranks (issue 17 item 1).

For each world size (512, 1,024, 2,048, 4,096; TP 8, steps 1 and 3, three stages of which one is
scheduled with two windows), the best of ``--repeat`` runs after a warm-up of:

- ``instrument plan --world-size W`` as a user runs it (a fresh process, text output), with every
  rank and with one rank per TP group selected (``ranks=[0,8,...]``: the override alone is 2.4 KB at
  4,096 ranks), and ``--json`` with every rank;
- in this process: :func:`plan_run` (arithmetic: the same cost at any size for ``all_ranks``, linear
  in the ranks listed otherwise), and naming every file of the plan (``trace_basename`` for each, the
  work the job's processes share between them; the names are made, not kept, so only naming is
  timed): linear by nature, so its ratio is the check (``tests/test_scale.py`` proves them distinct).

Growth is judged on CPU time (this process's, or the child's from ``RUSAGE_CHILDREN``), which other
work on a shared machine hardly moves; wall time is printed beside it, and the goal (``instrument
plan --world-size 4096`` answers in under 1 s) is a wall time. "linear or better": CPU time grows as
size^k with k <= 1.15, k fitted to all four sizes (one noisy size moves a fit less than a ratio).
Nothing here is asserted in tests.

Run: ``.venv/bin/python benchmarks/scale_plan.py [--repeat 5]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from instrument import naming  # noqa: E402
from instrument.config import ProfilerConfig, Schedule  # noqa: E402
from instrument.plan import StageSpec, plan_run  # noqa: E402

WORLDS = (512, 1024, 2048, 4096)
TP = 8
SCHEDULE = ("schedule.warmup=1", "schedule.active=2", "schedule.repeat=2")
STAGES = ("--stage", "generate_sequences", "--stage", "compute_log_prob", "--stage", "update_actor:scheduled")
GOAL_S = 1.0
LINEAR_SLOPE = 1.15
"""Most growth exponent (the slope of log time over log size, fitted to all sizes) called linear: one
noisy size moves a fit less than a ratio."""


def slope(sizes: tuple[int, ...], values: list[float]) -> float:
    """The least-squares slope of log(value) over log(size): 1.0 is linear, 2.0 quadratic."""
    import math

    xs = [math.log(n) for n in sizes]
    ys = [math.log(max(v, 1e-12)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _best(run: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The least wall and CPU seconds of ``repeat`` runs after one warm-up (slower runs measure the neighbours)."""
    run()
    walls, cpus = [], []
    for _ in range(repeat):
        cpu, wall = _cpu_s(), time.perf_counter()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu_s() - cpu)
    return min(walls), min(cpus)


def _cli(world: int, *extra: str) -> Callable[[], object]:
    argv = [sys.executable, "-m", "instrument", "plan", "--num-steps=3", f"--world-size={world}", "--mini-batches=8"]
    argv += [*STAGES, "steps=[1,3]", *SCHEDULE, *extra]

    def run() -> object:
        return subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)

    return run


def _config(world: int, every: bool) -> ProfilerConfig:
    chosen = (0,) if every else tuple(range(0, world, TP))
    return ProfilerConfig(steps=(1, 3), ranks=chosen, all_ranks=every, schedule=Schedule(warmup=1, active=2, repeat=2))


def _plan(world: int, every: bool) -> Callable[[], object]:
    stages = (StageSpec("generate_sequences"), StageSpec("compute_log_prob"), StageSpec("update_actor", True))
    config = _config(world, every)

    def run() -> object:
        return plan_run(config, num_steps=3, world_size=world, num_mini_batches=8, stages=stages)

    return run


def _name_all(world: int) -> Callable[[], object]:
    plan = _plan(world, True)()

    def run() -> object:
        names = 0
        for trace in plan.traces:  # type: ignore[attr-defined]
            window = None if trace.window is None else (trace.window.first, trace.window.last)
            names += bool(
                naming.trace_basename(
                    role="actor",
                    stage=trace.stage,
                    step=trace.step,
                    rank=trace.rank,
                    world_size=world,
                    host=f"node{trace.rank // TP}",
                    pid=1000 + trace.rank % TP,
                    timestamp_ns=1,
                    window=window,
                )
            )
        return names

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ranks_override = "ranks=[" + ",".join(str(r) for r in range(0, max(WORLDS), TP)) + "]"
    measures: dict[str, Callable[[int], Callable[[], object]]] = {
        "instrument plan (all ranks)": lambda w: _cli(w, "all_ranks=true"),
        "instrument plan (1 rank per TP group)": lambda w: _cli(
            w, "ranks=[" + ",".join(str(r) for r in range(0, w, TP)) + "]"
        ),
        "instrument plan --json (all ranks)": lambda w: _cli(w, "all_ranks=true", "--json"),
        "plan_run (all ranks)": lambda w: _plan(w, True),
        "plan_run (1 rank per TP group)": lambda w: _plan(w, False),
        "name every file of the plan": _name_all,
    }
    worlds = ", ".join(map(str, WORLDS))
    print(f"world sizes {worlds}; best of {args.repeat}; the ranks override is {len(ranks_override):,} B at 4,096")
    verdicts = []
    for label, make in measures.items():
        best = {w: _best(make(w), args.repeat) for w in WORLDS}
        base = best[WORLDS[0]][1]
        print(label)
        for w in WORLDS:
            wall, cpu = best[w]
            growth = cpu / base if base else float("inf")
            print(
                f"    {w:5d} ranks: wall {_fmt(wall)}, cpu {_fmt(cpu)} (cpu x{growth:.2f} for x{w // WORLDS[0]} ranks)"
            )
        exponent = slope(WORLDS, [best[w][1] for w in WORLDS])
        verdicts.append(exponent <= LINEAR_SLOPE)
        verdict = "linear or better" if exponent <= LINEAR_SLOPE else "FASTER THAN LINEAR"
        print(f"    {verdict}: cpu time grows as size^{exponent:.2f}")
        if label.startswith("instrument plan"):
            wall = best[max(WORLDS)][0]
            print(
                f"    4,096 ranks answered in {wall:.3f} s: "
                f"{'under' if wall < GOAL_S else 'OVER'} the {GOAL_S:g} s goal"
            )
    return 0 if all(verdicts) else 1


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    raise SystemExit(main())
