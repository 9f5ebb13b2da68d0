"""Speed of the step-timeline analysis, projected to 4,096 ranks x 100 steps x 10 stages (4M stage spans).

Builds a synthetic disaggregated run (half the ranks rollout, half actor; rollout generates in chunks while
the actor ranks wait outside any stage, then the actor ranks run their stages; one slow rollout rank; a few
µs to ms of jitter everywhere), times :func:`analyze_timeline` on it and prints spans/s and the time the
analysis would take at 4M spans, growing linearly. Prints, asserts nothing. Run:
``.venv/bin/python benchmarks/timeline_analysis.py [--ranks 512] [--steps 100] [--stages 10]``
(``--ranks 4096`` runs the full size: 4.5M ``Span`` objects, about 1.3 GB before the analysis starts).
"""

from __future__ import annotations

import argparse
import random
import resource
import time

from instrument.analyze.analyzers._timeline import analyze_timeline
from instrument.timeline import Span

MS = 1_000_000
TARGET_SPANS = 4_096 * 100 * 10
BUDGET_S = 60.0


def synthetic_run(ranks: int, steps: int, stages: int, seed: int = 0) -> list[Span]:
    """``stages`` stage spans per rank per step plus one step span; rank 1 (rollout) is 1.5x its peers."""
    rng = random.Random(seed)
    rollout = max(1, ranks // 2)
    generate = [f"generate_{i}" for i in range(stages)]  # one string per name, as a reader would keep them
    update = [f"update_{i}" for i in range(stages)]
    spans: list[Span] = []
    step_start = 0
    for step in range(1, steps + 1):
        generation_end = step_start
        for rank in range(rollout):  # chunks of generation, back to back
            t = step_start + rng.randrange(0, MS)
            for i in range(stages):
                length = (30 * MS + rng.randrange(0, 3 * MS)) * (3 if rank == 1 else 2) // 2
                spans.append(Span("stage", "rollout", generate[i], step, rank, t, t + length))
                t += length + rng.randrange(10_000, 100_000)
            generation_end = max(generation_end, t)
        actor_start = generation_end + MS  # the hand-off
        step_end = actor_start
        for rank in range(rollout, ranks):
            t = actor_start + rng.randrange(0, 200_000)
            for i in range(stages):
                length = 10 * MS + rng.randrange(0, MS)
                spans.append(Span("stage", "actor", update[i], step, rank, t, t + length))
                t += length + rng.randrange(10_000, 100_000)
            step_end = max(step_end, t)
        for rank in range(ranks):
            spans.append(Span("step", "rollout" if rank < rollout else "actor", "", step, rank, step_start, step_end))
        step_start = step_end + 5 * MS
    return spans


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--stages", type=int, default=10)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    spans = synthetic_run(args.ranks, args.steps, args.stages)
    built = time.perf_counter() - began
    stage_spans = args.ranks * args.steps * args.stages
    input_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"input: {args.ranks} ranks x {args.steps} steps x {args.stages} stages = {len(spans):,} spans ({built:.1f} s)"
    )
    for aligned in (True, False):
        began = time.perf_counter()
        report = analyze_timeline(spans, aligned=aligned, clock_uncertainty_ns=200_000)
        took = time.perf_counter() - began
        projected = took * TARGET_SPANS / stage_spans
        print(
            f"aligned={aligned!s:5}  {took:6.2f} s  {stage_spans / took:12,.0f} stage spans/s  "
            f"projected at {TARGET_SPANS:,}: {projected:5.1f} s (budget {BUDGET_S:.0f} s)"
        )
        if aligned:
            for text in [f.text for f in report.findings[:5]]:
                print("  -", text)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS {peak_kb / 1024:,.0f} MB, of which the input spans {input_kb / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
