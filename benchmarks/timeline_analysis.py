"""Time and peak memory of the step-timeline analysis, up to 4,096 ranks x 100 steps x 10 stages (4.1M stage spans).

Writes a synthetic disaggregated run as real timeline files (the writer's ``encode_*`` records; half the ranks
rollout, half actor; rollout generates in chunks while the actor ranks wait outside any stage, then the actor
ranks run their stages; one slow rollout rank; a few µs to ms of jitter everywhere; 8 ranks a host, each host's
clock off by its own offset, with the clock estimate that puts it back, 0 ± 0 on rank 0's host) into a temporary
directory, then, in a fresh process for each size (so that peaks do not mix), times the real path: read every file
(:func:`find_timelines`), :func:`align`, :func:`analyze_timeline`. Side by side, in the same process, the floor:
the time to merely read the files' bytes (``x floor``: the real path's time over it), and, after, the time to make
every span a :class:`Span` once (``Spans s``: what reading them as objects cost at the least). Sizes: 1/4, 1/2 and
all of ``--ranks``, so that linear growth shows; the budget is 15 s and 400 MB peak RSS at 4,096 ranks (``t/15s``,
``MB/400``; ``cpu s``: the CPU time, which other work on a busy machine does not inflate; ``base MB``: the process
before it reads anything). Prints, asserts nothing. Run:
``.venv/bin/python benchmarks/timeline_analysis.py [--ranks 4096] [--steps 100] [--stages 10]``
(``--path analyze``: through :func:`instrument.analyze.analyze`, as ``instrument analyze`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from instrument.naming import TIMELINE_SUFFIX
from instrument.timeline import SPAN_BYTES, encode_clock, encode_header, encode_name, encode_span, encode_thread

MS = 1_000_000
TARGET_RANKS = 4_096
BUDGET_S = 15.0
BUDGET_MB = 400.0
RANKS_PER_HOST = 8


def host_offset_ns(host: int) -> int:
    """How far a host's clock is from host 0's (ns): hosts booted at different times."""
    return 0 if host == 0 else host * 7_777_777_777 + 123_457


def write_run(directory: Path, ranks: int, steps: int, stages: int, seed: int = 0) -> int:
    """One timeline file per rank, as the run writes them; ``stages`` stage spans per rank per step plus its step
    span; rank 1 (rollout) is 1.5x its peers. Returns how many spans were written."""
    rng = random.Random(seed)
    rollout = max(1, ranks // 2)
    files: list[bytearray] = []
    for rank in range(ranks):
        role = "rollout" if rank < rollout else "actor"
        host = rank // RANKS_PER_HOST
        header = encode_header(
            role=role, rank=rank, world_size=ranks, host=f"node{host}", pid=rank, mono_ns=0, wall_ns=0
        )
        data = bytearray(header)
        if host:
            data += encode_clock(host_offset_ns(host), 200_000, "store round trip")
        else:  # as a run records it: the reference host's processes are on the reference clock
            data += encode_clock(0, 0, "same host as rank 0")
        data += encode_name(0, "step", role, "")
        for i in range(stages):
            data += encode_name(i + 1, "stage", role, f"{'generate' if role == 'rollout' else 'update'}_{i}")
        data += encode_thread(0, 140_000_000 + rank)
        files.append(data)
    written = 0
    step_start = 0
    for step in range(1, steps + 1):
        generation_end = step_start
        for rank in range(rollout):  # chunks of generation, back to back
            t = step_start + rng.randrange(0, MS)
            offset = host_offset_ns(rank // RANKS_PER_HOST)
            for i in range(stages):
                length = (30 * MS + rng.randrange(0, 3 * MS)) * (3 if rank == 1 else 2) // 2
                files[rank] += encode_span(i + 1, 0, step, t + offset, t + offset + length)
                t += length + rng.randrange(10_000, 100_000)
            generation_end = max(generation_end, t)
        actor_start = generation_end + MS  # the hand-off
        step_end = actor_start
        for rank in range(rollout, ranks):
            t = actor_start + rng.randrange(0, 200_000)
            offset = host_offset_ns(rank // RANKS_PER_HOST)
            for i in range(stages):
                length = 10 * MS + rng.randrange(0, MS)
                files[rank] += encode_span(i + 1, 0, step, t + offset, t + offset + length)
                t += length + rng.randrange(10_000, 100_000)
            step_end = max(step_end, t)
        for rank in range(ranks):  # a step span is written as its step ends, after its stages
            offset = host_offset_ns(rank // RANKS_PER_HOST)
            files[rank] += encode_span(0, 0, step, step_start + offset, step_end + offset)
        written += ranks * (stages + 1)
        step_start = step_end + 5 * MS
    for rank, data in enumerate(files):
        (directory / f"rank{rank:05d}{TIMELINE_SUFFIX}").write_bytes(data)
    return written


def peak_rss_mb() -> float:
    """This process's peak resident set (MB): VmHWM, which starts again at exec (``ru_maxrss`` would count the
    parent's pages at the fork)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds this process has used: unlike wall time, other work on the machine does not add to it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(directory: Path, path: str) -> dict[str, Any]:
    """In this (fresh) process: the floor, then the analysis of every timeline file in ``directory``."""
    from instrument.analyze.analyzers._timeline import analyze_timeline
    from instrument.analyze.traces._timelines import align, find_timelines

    if path == "analyze":
        from instrument.analyze import analyze
    base_mb = peak_rss_mb()
    began, cpu_began = time.perf_counter(), cpu_s()
    size = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        with open(entry.path, "rb") as handle:
            size += len(handle.read())
    floor, floor_cpu = time.perf_counter() - began, cpu_s() - cpu_began
    began, cpu_began = time.perf_counter(), cpu_s()
    if path == "analyze":
        report = analyze(directory, jobs=1).timeline
        read = aligned_at = time.perf_counter()
    else:
        timelines, _ = find_timelines(directory)
        read = time.perf_counter()
        on_axis = align(timelines)
        aligned_at = time.perf_counter()
        report = analyze_timeline(
            on_axis.spans, aligned=on_axis.aligned, clock_uncertainty_ns=on_axis.max_uncertainty_ns or 0
        )
    done, cpu = time.perf_counter(), cpu_s() - cpu_began
    assert report is not None
    objects = 0.0
    if path != "analyze":  # the second floor: making every span a Span once (what reading them as objects did)
        objects = time.perf_counter()
        for _ in on_axis.spans:
            pass
        objects = time.perf_counter() - objects
    return {
        "bytes": size,
        "floor_s": floor,
        "read_s": read - began,
        "align_s": aligned_at - read,
        "analyze_s": done - aligned_at,
        "total_s": done - began,
        "floor_cpu_s": floor_cpu,
        "objects_s": objects,
        "cpu_s": cpu,
        "base_mb": base_mb,
        "peak_mb": peak_rss_mb(),
        "aligned": report.clock.aligned,
        "steps": len(report.steps),
        "findings": [f.text for f in report.findings[:3]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", type=int, default=TARGET_RANKS)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--stages", type=int, default=10)
    parser.add_argument("--path", choices=("timeline", "analyze"), default="timeline")
    parser.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)  # the children's sides
    parser.add_argument("--write", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:
        print(write_run(Path(args.write), args.ranks, args.steps, args.stages))
        return
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.path)))
        return
    print(f"path: {args.path}; budget at {TARGET_RANKS:,} ranks: {BUDGET_S:.0f} s and {BUDGET_MB:.0f} MB peak RSS")
    header = (
        f"{'ranks':>6} {'spans':>10} {'MB on disk':>10} {'floor s':>8} {'read s':>7} {'align s':>7} "
        f"{'analyze s':>9} {'total s':>8} {'x floor':>8} {'Spans s':>7} {'cpu s':>6} {'cpu µs/span':>11} "
        f"{'peak MB':>8} {'base MB':>7} "
        f"{'KB/1k spans':>11} {'t/15s':>6} {'MB/400':>6}"
    )
    print(header)
    rows = []
    for ranks in sorted({max(1, args.ranks // 4), max(1, args.ranks // 2), args.ranks}):
        with tempfile.TemporaryDirectory(prefix="timeline-bench-") as tmp:
            shape = ["--ranks", str(ranks), "--steps", str(args.steps), "--stages", str(args.stages)]
            writer = subprocess.run([sys.executable, __file__, "--write", tmp, *shape], check=True, capture_output=True)
            spans = int(writer.stdout)
            child = subprocess.run(
                [sys.executable, __file__, "--measure", tmp, "--path", args.path],
                check=True,
                capture_output=True,
                text=True,
            )
        got = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append((ranks, spans, got))
        net_kb = (got["peak_mb"] - got["base_mb"]) * 1024
        print(
            f"{ranks:>6} {spans:>10,} {got['bytes'] / 2**20:>10.1f} {got['floor_s']:>8.2f} {got['read_s']:>7.2f} "
            f"{got['align_s']:>7.3f} {got['analyze_s']:>9.2f} {got['total_s']:>8.2f} "
            f"{got['total_s'] / got['floor_s']:>8.0f} {got['objects_s']:>7.2f} {got['cpu_s']:>6.1f} "
            f"{1e6 * got['cpu_s'] / spans:>11.2f} "
            f"{got['peak_mb']:>8.0f} "
            f"{got['base_mb']:>7.0f} {1000 * net_kb / spans:>11.1f} {got['total_s'] / BUDGET_S:>6.2f} "
            f"{got['peak_mb'] / BUDGET_MB:>6.2f}"
        )
    ranks, spans, got = rows[-1]
    scale = TARGET_RANKS / ranks
    projected_s = got["total_s"] * scale
    projected_mb = got["base_mb"] + (got["peak_mb"] - got["base_mb"]) * scale
    print(
        f"at {TARGET_RANKS:,} ranks ({'measured' if scale == 1 else 'projected, linearly'}): {projected_s:.1f} s "
        f"({projected_s / BUDGET_S:.2f} of the budget), {projected_mb:.0f} MB peak RSS "
        f"({projected_mb / BUDGET_MB:.2f} of the budget); {got['steps']} steps, aligned={got['aligned']}; "
        f"{SPAN_BYTES} bytes a span on disk"
    )
    for text in got["findings"]:
        print("  -", text)


if __name__ == "__main__":
    main()
