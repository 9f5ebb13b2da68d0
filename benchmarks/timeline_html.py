"""Size and time of the page (``--html``) and the merged trace at 4,096 ranks x 100 steps x 10 stages.

Builds the report synthetically, as :func:`~instrument.analyze.analyze` would hand it to the renderers: the
timeline's spans per process (the layout of ``benchmarks/timeline_analysis.py``: half the ranks rollout,
generating in chunks while the actor ranks wait, then the actors' stages; rollout rank 1 is 1.5x its peers)
and the step analysis's values (per step, rank and role; a straggler finding naming rank 1), without
running the analysis itself (``benchmarks/timeline_analysis.py`` times that). Then writes the page and the
merged trace and prints their sizes and times against the page's budget (20 MB). Prints, asserts nothing.
Run: ``.venv/bin/python benchmarks/timeline_html.py [--ranks 4096] [--steps 100] [--stages 10] [--no-merged]``
"""

from __future__ import annotations

import argparse
import random
import resource
import tempfile
import time
from array import array
from pathlib import Path

from instrument.analyze import write_html
from instrument.analyze.model import (
    ClockInfo,
    Finding,
    RankTimeline,
    Report,
    RoleTimeline,
    StepTimeline,
    TimelineLane,
    TimelineReport,
    TimelineSpans,
    TimeShare,
)
from instrument.analyze.render._lanes import timeline_view
from instrument.analyze.render._merged import write_merged_trace

MS = 1_000_000
BUDGET_MB = 20.0
SLOW = 1  # the rollout rank that is 1.5x its peers


class _Columns:
    def __init__(self, role: str, stages: list[str]) -> None:
        self.role = role
        self.names = (("step", role, ""), *(("stage", role, s) for s in stages))
        self.name, self.step, self.start, self.end, self.thread = (
            array("H"),
            array("I"),
            array("q"),
            array("q"),
            array("H"),
        )
        self.busy: dict[int, int] = {}

    def add(self, name: int, step: int, start: int, end: int) -> None:
        self.name.append(name)
        self.step.append(step)
        self.start.append(start)
        self.end.append(end)
        self.thread.append(0)
        if name:
            self.busy[step] = self.busy.get(step, 0) + end - start

    def lane(self, rank: int) -> TimelineLane:
        return TimelineLane(
            self.role, rank, f"node{rank // 8}", 1000 + rank, self.names, self.name, self.step, self.start, self.end,
            self.thread,
        )  # fmt: skip


def synthetic_report(ranks: int, steps: int, stages: int, seed: int = 0) -> Report:
    """A report with ``ranks`` processes' spans and the step values an analysis of them gives (approximately)."""
    rng = random.Random(seed)
    rollout = max(1, ranks // 2)
    columns = [
        _Columns("rollout", [f"generate_{i}" for i in range(stages)])
        if rank < rollout
        else _Columns("actor", [f"update_{i}" for i in range(stages)])
        for rank in range(ranks)
    ]
    step_start = 0
    walls: list[tuple[int, int, int, int]] = []  # step, start, end, generation's end
    for step in range(1, steps + 1):
        generation_end = step_start
        for rank in range(rollout):
            t = step_start + rng.randrange(0, MS)
            for i in range(stages):
                length = (30 * MS + rng.randrange(0, 3 * MS)) * (3 if rank == SLOW else 2) // 2
                columns[rank].add(1 + i, step, t, t + length)
                t += length + rng.randrange(10_000, 100_000)
            generation_end = max(generation_end, t)
        actor_start = step_end = generation_end + MS
        for rank in range(rollout, ranks):
            t = actor_start + rng.randrange(0, 200_000)
            for i in range(stages):
                length = 10 * MS + rng.randrange(0, MS)
                columns[rank].add(1 + i, step, t, t + length)
                t += length + rng.randrange(10_000, 100_000)
            step_end = max(step_end, t)
        for rank in range(ranks):
            columns[rank].add(0, step, step_start, step_end)
        walls.append((step, step_start, step_end, generation_end))
        step_start = step_end + 5 * MS
    lanes = tuple(c.lane(rank) for rank, c in enumerate(columns))
    return Report(
        directory="synthetic",
        stages=(),
        skipped=(),
        files=0,
        bytes=0,
        events=0,
        elapsed_s=0.0,
        jobs=1,
        timeline=_values(columns, walls, rollout),
        timeline_spans=TimelineSpans(tuple(sorted(lanes, key=lambda lane: (lane.role, lane.rank))), aligned=True),
    )


def _values(columns: list[_Columns], walls: list[tuple[int, int, int, int]], rollout: int) -> TimelineReport:
    """Per step, rank and role: busy and idle from the columns; a two-part critical path; one straggler finding."""
    steps = []
    for step, start, end, generated in walls:
        wall = end - start
        rows = tuple(
            RankTimeline(rank, c.role, c.busy[step] / MS, (wall - c.busy[step]) / MS, ())
            for rank, c in sorted(enumerate(columns), key=lambda rc: (rc[1].role, rc[0]))
        )
        roles = {
            role: RoleTimeline(
                role,
                sum(1 for r in rows if r.role == role),
                sum(r.busy_ms for r in rows if r.role == role),
                sum(r.idle_ms for r in rows if r.role == role),
                (),
            )
            for role in ("actor", "rollout")
        }
        path = (
            TimeShare("rollout", f"generate_{len(columns[0].names) - 2}", SLOW, (generated - start) / MS),
            TimeShare("actor", "update_0", rollout, (end - generated) / MS),
        )
        steps.append(StepTimeline(step, wall / MS, path, roles, rows, (generated - start) / MS))
    finding = Finding(
        "straggler",
        f"rollout generate_0 on rank {SLOW} is 1.5x its peers' median on {len(walls)} of {len(walls)} steps",
        150.0,
        "rollout",
        "generate_0",
        SLOW,
        tuple(s for s, _, _, _ in walls),
    )
    return TimelineReport(ClockInfo(aligned=True, max_uncertainty_ms=0.0, note=None), tuple(steps), (finding,), 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--stages", type=int, default=10)
    parser.add_argument("--no-merged", action="store_true", help="write the page only")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    report = synthetic_report(args.ranks, args.steps, args.stages)
    assert report.timeline_spans is not None
    print(
        f"input: {args.ranks:,} ranks x {args.steps} steps x {args.stages} stages = "
        f"{report.timeline_spans.spans:,} spans ({time.perf_counter() - began:.1f} s to build)"
    )
    view = timeline_view(report)
    assert view is not None
    print(f"drawn: {len(view.lanes)} lanes ({'role bands' if view.banded else 'every process'}):")
    print("  " + ", ".join(d.label for d in view.lanes))
    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        page = write_html(report, Path(scratch) / "analysis.html")
        took = time.perf_counter() - began
        mb = page.stat().st_size / 1e6
        print(f"page: {mb:6.2f} MB in {took:5.1f} s (budget {BUDGET_MB:.0f} MB: {mb / BUDGET_MB:.0%} of it)")
        if not args.no_merged:
            began = time.perf_counter()
            merged = write_merged_trace(report, Path(scratch) / "merged.json.gz")
            took = time.perf_counter() - began
            print(f"merged trace: {merged.stat().st_size / 1e6:6.1f} MB gzip in {took:5.1f} s (every rank)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
