"""Is the first profiled step honest? Its stage's range against later profiled ranges of the same work.

Each run is a fresh process (kineto and CUPTI start once per process): three unprofiled steps warm the
work (and CUDA), then eight profiled steps run the same stage. Prints, per mode, the first profiled
stage's range (from the trace) over the median of the later ones (goal: <= 1.5), and the same for the
whole step's wall time (the profiler's start and stop lie outside the range but inside the step).
Modes run in turns, so a busy neighbour slows both alike; a run's single first range is one sample,
so the median over runs is the number to read.

Run: ``.venv/bin/python benchmarks/first_step.py [--device cuda] [--repeats 5]``; ``benchmarks/gpu_check.sh``
runs it on a GPU. Nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGE = "compute_log_prob"
UNPROFILED, PROFILED = 3, 8
HANG_GUARD_S = 300


def child(mode: str, device: str, save: str) -> None:
    """One process: print ``{"range_us": {step: µs}, "step_s": {step: s}}`` as one JSON line."""
    import torch

    import instrument as ins
    from instrument.naming import parse_trace_name

    logging.getLogger("instrument").setLevel(logging.ERROR)
    contents = ("cpu", "cuda") if device == "cuda" else ("cpu",)
    steps = tuple(range(UNPROFILED + 1, UNPROFILED + PROFILED + 1))
    cfg = ins.ProfilerConfig(save_path=save, steps=steps, contents=contents, discrete=(mode == "discrete"))
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    torch.set_num_threads(1)  # two busy cores here: one thread keeps the work from fighting its own pool
    weight = torch.randn(192, 192, device=device) / 14

    @ins.profiled_stage(STAGE)
    def work() -> None:
        x = weight
        for _ in range(150):
            x = torch.tanh(x @ weight)
        if device == "cuda":
            torch.cuda.synchronize()

    step_s: dict[int, float] = {}
    for step in range(1, UNPROFILED + PROFILED + 1):
        started = time.perf_counter()
        with ins.profile_step(step, last=(step == steps[-1])):
            work()
        step_s[step] = time.perf_counter() - started
    range_us: dict[int, float] = {}
    for path in ins.finish():
        name = parse_trace_name(Path(path).name)
        if name is None or not path.endswith(".json.gz"):
            continue
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            events = json.load(handle)["traceEvents"]
        (dur,) = [e["dur"] for e in events if e.get("name") == STAGE and e.get("ph") == "X"]
        range_us[name.step] = float(dur)
    print(json.dumps({"range_us": range_us, "step_s": {s: step_s[s] for s in steps}}))


def _run_child(mode: str, device: str) -> dict[str, dict[int, float]]:
    with tempfile.TemporaryDirectory() as save:
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode, device, save],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"first_step: the {mode} child failed:\n{done.stderr[-3000:]}")
    raw: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return {key: {int(step): value for step, value in values.items()} for key, values in raw.items()}


def _later(values: dict[int, float]) -> float:
    """The median of the profiled steps after the first."""
    return statistics.median(values[step] for step in sorted(values)[1:])


def _first_over_later(values: dict[int, float]) -> float:
    return values[min(values)] / _later(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per mode")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    modes = ("discrete", "continuous")
    print(f"first profiled step against the median of the {PROFILED - 1} later ones ({args.device}; goal <= 1.5)")
    results: dict[str, list[dict[str, dict[int, float]]]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:  # in turns: a busy neighbour slows both modes alike
            results[mode].append(_run_child(mode, args.device))
    for mode, runs in results.items():
        ranges = [_first_over_later(run["range_us"]) for run in runs]
        steps = [_first_over_later(run["step_s"]) for run in runs]
        later_ms = statistics.median(_later(run["range_us"]) for run in runs) / 1e3
        print(
            f"  {mode:10s} stage range {statistics.median(ranges):5.2f}"
            f" (runs {', '.join(f'{r:.2f}' for r in ranges)}; later ranges ~{later_ms:.1f} ms)"
            f"   whole step {statistics.median(steps):5.2f} (runs {', '.join(f'{s:.2f}' for s in steps)})"
        )


if __name__ == "__main__":
    main()
