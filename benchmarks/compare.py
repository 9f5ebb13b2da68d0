"""``instrument compare A B`` against ``instrument analyze A`` plus ``instrument analyze B``, side by side.

The goal (issue 26): comparing two runs costs at most the time of analysing both. Each command runs in a
fresh process (``python -m instrument ... --json``, the picture off), the three interleaved, ``--repeat``
times (default 3); printed: each run's wall time and the CPU time of its process tree (user + system, from
``wait4``: a pool's workers are reaped, so counted; it hardly moves when other work shares the cores), the
medians, and compare's over the two analyses' sum. Then what the comparison found, and whether it read
trace files again for causes (only a reported change makes it: a few stage instances a side).

The pair:

- default: two small sets made by the RL trace recipe (``../shared/recipes/rl-trace-set/gen_rl_traces.py``,
  4 ranks x 6 steps, about 80 MB each, about 30 s each to make on 2 cores) in ``outputs/compare-bench/``;
- ``--full``: the recipe's 412 MB set twice (8 ranks x 16 steps; about 1 to 3 minutes each on 2 cores):
  ``outputs/rl-trace-set`` (shared with ``benchmarks/analyze.py``) and ``outputs/rl-trace-set-2``;
- ``--pair A B``: two directories of your own.

A set is generated when its folder holds no trace (``--regenerate`` to make it again). The two sets of a
pair are two runs of the same job: what differs is the machine's noise, so "nothing changed" is the right
answer, or a small change the load made. Nothing here is asserted in tests.

Run: ``.venv/bin/python benchmarks/compare.py [--full] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
GENERATOR = ROOT.parent / "shared" / "recipes" / "rl-trace-set" / "gen_rl_traces.py"
SMALL = (ROOT / "outputs" / "compare-bench" / "a", ROOT / "outputs" / "compare-bench" / "b")
SMALL_ARGS = ("4", "6", "20")  # world, steps, generated tokens per step
FULL = (ROOT / "outputs" / "rl-trace-set", ROOT / "outputs" / "rl-trace-set-2")
FULL_ARGS = ("8", "16", "20")  # the recipe's 412 MB set
TIMEOUT_S = 900.0
GOAL = 1.0


def traces(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith((".json", ".gz")))


def ensure(directory: Path, args: tuple[str, ...], regenerate: bool) -> None:
    """The recipe's set in ``directory``, made unless it is there."""
    if directory.is_dir() and traces(directory) and not regenerate:
        return
    if not GENERATOR.is_file():
        sys.exit(f"no RL trace generator at {GENERATOR}")
    directory.mkdir(parents=True, exist_ok=True)
    for old in traces(directory):
        old.unlink()
    cmd = [str(PYTHON), str(GENERATOR), str(directory), *args]
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    for line in (done.stdout + done.stderr).splitlines():
        if not line.startswith(("STAGE:", "USDT:")) and "warmup" not in line and "schedule=" not in line:
            print("  " + line)
    if done.returncode:
        sys.exit(f"the generator failed with status {done.returncode}")


def describe(directory: Path) -> str:
    files = traces(directory)
    return f"{directory} ({len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:,.0f} MB)"


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the process tree, and stdout of one fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--full", action="store_true", help="the recipe's 412 MB set, twice")
    which.add_argument("--pair", nargs=2, type=Path, metavar=("A", "B"), help="two directories of your own")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command (default 3)")
    parser.add_argument("--regenerate", action="store_true", help="make the sets again")
    args = parser.parse_args(argv)

    if args.pair:
        a, b = args.pair
    else:
        a, b = FULL if args.full else SMALL
        for directory in (a, b):
            ensure(directory, FULL_ARGS if args.full else SMALL_ARGS, args.regenerate)
    print(f"baseline  {describe(a)}\ncandidate {describe(b)}\n", flush=True)

    base = [str(PYTHON), "-m", "instrument"]
    commands = {
        "analyze A": [*base, "analyze", str(a), "--json", "--no-png", "--quiet"],
        "analyze B": [*base, "analyze", str(b), "--json", "--no-png", "--quiet"],
        "compare A B": [*base, "compare", str(a), str(b), "--json"],
    }
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    found = ""
    for _ in range(args.repeat):
        for name, cmd in commands.items():  # interleaved: a slow minute of the machine hits all three
            wall, cpu, out = timed(cmd)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if name.startswith("compare"):
                found = out
    print(f"{'':14}" + "".join(f"{'run ' + str(i + 1):>16}" for i in range(args.repeat)) + f"{'median':>16}")
    for name in commands:
        cells = [f"{w:7.2f} s /{c:5.1f} s" for w, c in zip(walls[name], cpus[name], strict=True)]
        med = f"{statistics.median(walls[name]):7.2f} s /{statistics.median(cpus[name]):5.1f} s"
        print(f"{name:14}" + "".join(f"{cell:>16}" for cell in cells) + f"{med:>16}")
    print("(wall s / CPU s of the process tree)\n")
    for what, values in (("wall", walls), ("CPU", cpus)):
        both = statistics.median(values["analyze A"]) + statistics.median(values["analyze B"])
        ratio = statistics.median(values["compare A B"]) / both
        verdict = "within" if ratio <= GOAL else "over"
        print(f"compare / (analyze A + analyze B), {what}: {ratio:.2f}x ({verdict} the goal of {GOAL:g}x)")

    data = json.loads(found)
    reported = [c for c in data["changes"] if c["significant"]]
    print(f"\nthe comparison ({len(data['changes'])} stages; {len(reported)} reported, their causes read again):")
    for finding in data["findings"]:
        print(f"  {finding['text']}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
