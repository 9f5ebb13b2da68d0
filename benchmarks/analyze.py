"""``instrument analyze`` against Holistic Trace Analysis (HTA) on the same trace set, side by side in one run.

Measures, each in a fresh process and as the median of ``--repeat`` runs (default 3, interleaved):

  a. ``python -m instrument analyze DIR --json --no-png`` (this project's venv): the full analysis,
     every step x stage x rank and the step-timeline view (built from the traces' step and stage
     ranges when the set has no timeline file: idle, waits, critical path, findings; ``--png`` adds
     the picture), and
  b. HTA: ``TraceAnalysis(trace_dir=DIR)`` (load) plus ``get_temporal_breakdown()``; on CPU-only
     traces that fails, the reason is recorded and ``get_gpu_user_annotation_breakdown(
     use_gpu_annotation=False)`` runs instead (the one breakdown HTA computes without GPU events).

For each: wall time of the whole process, and the peak memory of its whole process tree (both
fork a pool of parsers on a multi-core machine): the sum of the tree's RSS, polled from
``/proc/PID/statm`` every 20 ms; the sum of its PSS (``smaps_rollup``; pages a forked worker still
shares with its parent count once, not twice), sampled 4 times a second only because reading it
walks the page tables (~6 ms per GB; at 50 Hz it slowed HTA measurably); and the largest single
process's ``ru_maxrss`` (from ``wait4``: exact, a lower bound for the tree). Also the CPU time of
the tree (user + system, from ``wait4``: the pool workers are reaped, so counted): unlike wall time
it hardly moves when other work shares the cores. Goals: >= 5x faster, <= 1/3 the peak memory (tree
RSS, as the issue asks; the other two are printed beside it).

Then (``--skip-layout`` to leave it out) the interop check: ``instrument analyze DIR --layout hta OUT``
and HTA's ``TraceAnalysis`` on the exported folder with the most files, printing the ranks HTA
loaded (one trace per rank: it keeps one file per rank and drops the rest).

The trace set, ``--set``:

- ``rl`` (default): plain ``torch.profiler`` traces of an RL loop, one continuous file per rank with
  a ``ProfilerStep#N`` per step and ``record_function`` stages (``generate_sequences``,
  ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor`` with ``mini_batch0..3``; rank 3
  does double rollout work): 8 ranks x 16 steps, 412 MB, by the recipe
  ``../shared/recipes/rl-trace-set/gen_rl_traces.py`` (``--generator``) into ``outputs/rl-trace-set``
  (about 1 to 3 minutes on 2 cores). The analysis must give 16 x 4 (step, stage) rows of 8 ranks.
- ``sdk``: written through this SDK by ``benchmarks/make_trace_set.py`` into ``outputs/bench-traces``
  (336 MB), with the SDK's ``instrument-manifest-*.jsonl`` files, which HTA ignores (it takes only
  names ending in ``.json`` or ``.gz``) and ``instrument analyze`` reads first.

``DIR`` overrides the folder; a set is generated when its folder holds no trace, or with ``--regenerate``.

HTA is a benchmark-only dependency, never a runtime one. It lives in its own venv, created here
when missing (pandas 3 breaks parts of HTA 0.5.0, hence the pin)::

    python3 -m venv .venv-hta
    .venv-hta/bin/python -m pip install HolisticTraceAnalysis==0.5.0 'pandas<3'

Run: ``.venv/bin/python benchmarks/analyze.py [--set rl|sdk] [DIR]`` (about 4 to 6 minutes on 2 cores,
generation included). Nothing here is asserted in tests.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS_PYTHON = ROOT / ".venv" / "bin" / "python"
HTA_VENV = ROOT / ".venv-hta"
HTA_PYTHON = HTA_VENV / "bin" / "python"
HTA_REQUIREMENTS = ("HolisticTraceAnalysis==0.5.0", "pandas<3")
SETS = {"rl": ROOT / "outputs" / "rl-trace-set", "sdk": ROOT / "outputs" / "bench-traces"}
RL_GENERATOR = ROOT.parent / "shared" / "recipes" / "rl-trace-set" / "gen_rl_traces.py"
RL_ARGS = ("8", "16", "20")  # world, steps, generated tokens per step: the 412 MB set of the recipe
TRACE_SUFFIXES = (".json", ".gz")  # what HTA takes as a trace
POLL_S = 0.02
PSS_EVERY_S = 0.25
PAGE = os.sysconf("SC_PAGE_SIZE")
RUN_TIMEOUT_S = 300.0
GOAL_SPEEDUP = 5.0
GOAL_MEMORY = 1 / 3

# Runs inside .venv-hta. Prints one JSON line on stdout: what worked and how long each part took.
HTA_SCRIPT = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
out = {"import_s": t1 - t0, "load_s": t2 - t1, "ranks": sorted(ta.t.get_ranks()),
       "rows": sum(len(df) for df in ta.t.get_all_traces().values())}
def attempt(label, fn):
    t = time.perf_counter()
    try:
        df = fn()
        out[label] = f"ok ({0 if df is None else len(df)} rows)"
    except Exception as exc:
        out[label] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    out[label + "_s"] = time.perf_counter() - t
    return out[label].startswith("ok")
if not attempt("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False)):
    attempt("user_annotation_breakdown_cpu",
            lambda: ta.get_gpu_user_annotation_breakdown(use_gpu_annotation=False, visualize=False))
print("HTA_RESULT " + json.dumps(out), flush=True)
"""

# The interop check: HTA on one folder of ``instrument analyze --layout hta``. Its "same rank" warnings
# go through logging; they are counted, as each one means a file HTA dropped.
HTA_LAYOUT_SCRIPT = r"""
import json, logging, sys, warnings
warnings.simplefilter("ignore")
dropped = []
class Count(logging.Handler):
    def emit(self, record):
        if "same rank" in record.getMessage():
            dropped.append(record.getMessage())
logging.getLogger().addHandler(Count())
from hta.trace_analysis import TraceAnalysis
for name in list(logging.Logger.manager.loggerDict):
    logging.getLogger(name).addHandler(Count())
ta = TraceAnalysis(trace_dir=sys.argv[1])
files = {int(r): str(ta.t.trace_files[r]).rsplit("/", 1)[-1] for r in ta.t.get_ranks()}
print("HTA_LAYOUT " + json.dumps({"ranks": sorted(files), "files": files, "dropped": len(dropped)}), flush=True)
"""


# --------------------------------------------------------------------------- measuring a process tree


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids.extend(int(k) for k in fh.read().split())
    except OSError:
        pass
    return kids


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(_children(pid))
    return pids


def _rss_bytes(pid: int) -> int:
    # statm reads the kernel's counters: cheap enough to poll every 20 ms.
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):  # the process ended between listing and reading
        return 0


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass
class Run:
    wall_s: float
    tree_rss_mb: float
    tree_pss_mb: float
    max_proc_rss_mb: float
    cpu_s: float
    returncode: int
    stdout: str
    stderr: str


def measure(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Run ``cmd`` in a fresh process; wall time and peak memory of its whole process tree."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True)
        peak = peak_pss = 0
        next_pss = t0
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            tree = _tree(proc.pid)
            peak = max(peak, sum(_rss_bytes(p) for p in tree))
            if time.perf_counter() >= next_pss:  # a page-table walk (~6 ms per GB): 4 times a second only
                peak_pss = max(peak_pss, sum(_pss_bytes(p) for p in tree))
                next_pss = time.perf_counter() + PSS_EVERY_S
            if time.perf_counter() - t0 > RUN_TIMEOUT_S:
                os.killpg(proc.pid, 9)  # our own child's session, started above
            time.sleep(POLL_S)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(
            wall_s=wall,
            tree_rss_mb=peak / 2**20,
            tree_pss_mb=peak_pss / 2**20,
            max_proc_rss_mb=(usage.ru_maxrss if usage else 0) / 1024,
            cpu_s=(usage.ru_utime + usage.ru_stime) if usage else 0.0,
            returncode=proc.returncode,
            stdout=out.read().decode("utf-8", "replace"),
            stderr=err.read().decode("utf-8", "replace"),
        )


@dataclass
class Tool:
    label: str
    cmd: list[str]
    runs: list[Run] = field(default_factory=list)

    def median(self, attribute: str) -> float:
        return float(statistics.median(getattr(run, attribute) for run in self.runs))


# --------------------------------------------------------------------------- setup


def ensure_hta() -> None:
    """Create .venv-hta with HTA when it is missing (benchmark-only; see the module docstring)."""
    probe = [str(HTA_PYTHON), "-c", "import hta.trace_analysis"]
    if HTA_PYTHON.exists() and subprocess.run(probe, check=False, capture_output=True).returncode == 0:
        return
    print(f"creating {HTA_VENV} with {' '.join(HTA_REQUIREMENTS)} (benchmark only) ...", flush=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", str(HTA_VENV)], check=True)
    subprocess.run([str(HTA_PYTHON), "-m", "pip", "install", "--quiet", *HTA_REQUIREMENTS], check=True)
    subprocess.run(probe, check=True)


def trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def ensure_trace_set(directory: Path, regenerate: bool, extra: list[str], kind: str, generator: Path) -> None:
    if directory.is_dir() and trace_files(directory) and not regenerate:
        print(f"trace set: reusing {directory} (--regenerate to make a new one)")
        return
    if kind == "rl":
        if not generator.is_file():
            sys.exit(f"no RL trace generator at {generator}: pass --generator PATH (gen_rl_traces.py)")
        directory.mkdir(parents=True, exist_ok=True)
        for old in trace_files(directory):  # the recipe writes rank{r}.pt.trace.json: none left from before
            old.unlink()
        cmd = [str(OURS_PYTHON), str(generator), str(directory), *RL_ARGS]
    else:
        cmd = [str(OURS_PYTHON), str(ROOT / "benchmarks" / "make_trace_set.py"), str(directory), "--force", *extra]
    print("$ " + " ".join(cmd), flush=True)
    # kineto prints STAGE:/USDT: lines per rank on stderr; keep the generator's own lines only.
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines():
        if not line.startswith(("STAGE:", "USDT:")) and "warmup" not in line and "schedule=" not in line:
            print("  " + line)
    if proc.returncode:
        sys.exit(f"{Path(cmd[1]).name} failed with status {proc.returncode}")


def _plain_size(path: Path) -> int:
    """Uncompressed size: a gzip file's trailer (exact below 4 GiB), else the file size."""
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def describe_set(directory: Path) -> str:
    files = trace_files(directory)
    plain = sum(_plain_size(p) for p in files)
    packed = sum(p.stat().st_size for p in files)
    others = sorted(p.name for p in directory.iterdir() if p.is_file() and p not in files)
    listed = ", ".join(others[:2]) + (", ..." if others[2:] else "")
    return (
        f"{len(files)} trace files, {plain / 1e6:.0f} MB uncompressed ({packed / 1e6:.1f} MB on disk); "
        f"also in the folder, ignored by HTA: {len(others)} file(s) ({listed})"
    )


# --------------------------------------------------------------------------- reporting


def _ours_summary(run: Run) -> str:
    try:
        data = json.loads(run.stdout)
    except ValueError:
        return f"stdout is not JSON ({len(run.stdout)} chars): {run.stdout[:200]!r}"
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        return f"JSON without a stages list ({type(data).__name__})"
    rows = data["stages"]
    steps = {row["step"] for row in rows}  # null: a row without a step
    stages = sorted({row["stage"] for row in rows})
    cells = sum(row["n_ranks"] for row in rows)
    lines = [
        f"JSON ok ({len(run.stdout) / 1e3:.0f} kB): {len(rows)} (step, stage) rows = {len(steps)} steps x "
        f"{len(stages)} stages, {cells} per-rank cells, ranks {data.get('ranks')}, {data.get('events'):,} events",
    ]
    timeline = data.get("timeline")
    if isinstance(timeline, dict):  # the step-timeline view, from timeline files or (this set) the traces
        findings = data.get("findings") or []
        lines.append(
            f"    timeline: {len(timeline['steps'])} steps, aligned {timeline['clock']['aligned']}, "
            f"{len(findings)} findings; first: {findings[0]['text'] if findings else '-'}"
        )
    else:
        lines.append(f"    timeline: none ({data.get('timeline_note')})")
    for stage in stages:  # who is named slowest, per stage, over the steps
        named: dict[object, int] = {}
        for row in rows:
            if row["stage"] == stage:
                named[row["straggler_rank"]] = named.get(row["straggler_rank"], 0) + 1
        top = sorted(named.items(), key=lambda item: -item[1])[:3]
        said = ", ".join(f"{'none (under the floor)' if rank is None else rank} ({n})" for rank, n in top)
        lines.append(f"    {stage}: slowest rank (steps) {said}")
    return "\n".join(lines)


def _hta_result(run: Run) -> dict[str, object]:
    for line in run.stdout.splitlines():
        if line.startswith("HTA_RESULT "):
            result: dict[str, object] = json.loads(line.removeprefix("HTA_RESULT "))
            return result
    return {}


def run_all(tools: list[Tool], repeat: int) -> None:
    """Interleaved runs, each a fresh process tree."""
    for i in range(repeat):
        for tool in tools:
            run = measure(tool.cmd)
            tool.runs.append(run)
            print(
                f"  run {i + 1}/{repeat} {tool.label:<26} {run.wall_s:7.2f} s  CPU {run.cpu_s:6.1f} s"
                f"  tree RSS {run.tree_rss_mb:6.0f} MB  PSS {run.tree_pss_mb:6.0f} MB"
                f"  max proc RSS {run.max_proc_rss_mb:6.0f} MB  exit {run.returncode}",
                flush=True,
            )
            if run.returncode not in (0, 1):  # 1: instrument analyze skipped a file (reported on stderr)
                print("    stderr tail: " + " | ".join(run.stderr.strip().splitlines()[-5:]))


def print_table(tools: list[Tool]) -> None:
    cells = ["measurement".ljust(26), "wall s".rjust(7), " CPU s", "peak tree RSS MB", "peak tree PSS MB"]
    cells.append("max proc RSS MB")
    print("| " + " | ".join(cells) + " |")
    print("|" + "|".join("-" * (len(c) + 2) for c in cells) + "|")
    for tool in tools:
        print(
            f"| {tool.label:<26} | {tool.median('wall_s'):7.2f} | {tool.median('cpu_s'):6.1f} |"
            f" {tool.median('tree_rss_mb'):16.0f} |"
            f" {tool.median('tree_pss_mb'):16.0f} | {tool.median('max_proc_rss_mb'):15.0f} |"
        )


def print_details(tools: list[Tool]) -> None:
    """What each tool did on its last run: HTA's phases and which breakdown worked; our exit and JSON."""
    for tool in tools:
        last = tool.runs[-1]
        if tool.label.startswith("HTA"):
            result = _hta_result(last)
            if not result:
                print(f"HTA: no result line; stderr tail: {' | '.join(last.stderr.strip().splitlines()[-5:])}")
                continue
            print(
                f"HTA: import {result['import_s']:.1f} s, load {result['load_s']:.1f} s, ranks {result['ranks']}, "
                f"{result['rows']:,} rows"
            )
            for label in ("temporal_breakdown", "user_annotation_breakdown_cpu"):
                if label in result:
                    print(f"  {label}: {result[label]} ({result[label + '_s']:.2f} s)")
        else:
            print(f"instrument analyze: exit {last.returncode}, {_ours_summary(last)}")
            lines = [line for line in last.stderr.splitlines() if line.strip()]
            if lines:
                print(f"  stderr ({len(lines)} lines): " + " | ".join(lines[:4]))


def print_ratios(ours: Tool, hta: Tool) -> None:
    speedup = hta.median("wall_s") / ours.median("wall_s")
    print(
        f"speed-up (HTA wall / ours): {speedup:.1f}x   goal >= {GOAL_SPEEDUP:.0f}x: "
        f"{'met' if speedup >= GOAL_SPEEDUP else 'NOT met'}"
    )
    print(f"CPU time (HTA / ours): {hta.median('cpu_s') / ours.median('cpu_s'):.1f}x   (steadier than wall under load)")
    labels = {
        "tree_rss_mb": "peak tree RSS",
        "tree_pss_mb": "peak tree PSS",
        "max_proc_rss_mb": "largest single process, ru_maxrss",
    }
    for what, label in labels.items():
        ratio = ours.median(what) / hta.median(what)
        print(
            f"memory ratio (ours / HTA, {label}): {ratio:.2f} (1/{1 / ratio:.1f})   "
            f"goal <= 1/3: {'met' if ratio <= GOAL_MEMORY else 'NOT met'}"
        )


def layout_check(directory: Path) -> None:
    """``--layout hta`` of the set, then HTA on its fullest folder: one trace per rank."""
    with tempfile.TemporaryDirectory(dir=ROOT / "outputs", prefix="hta-layout-") as scratch:
        out = Path(scratch) / "hta"
        cmd = [str(OURS_PYTHON), "-m", "instrument", "analyze", str(directory), "--layout", "hta", str(out)]
        proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
        print(f"$ instrument analyze DIR --layout hta OUT: exit {proc.returncode}; {proc.stdout.splitlines()[:1]}")
        folders = sorted(
            {p.parent for p in out.rglob("*") if p.is_file()},
            key=lambda d: (-len(trace_files(d)), sum(f.stat().st_size for f in trace_files(d))),
        )
        if not folders:
            print("  no folder exported; stderr: " + " | ".join(proc.stderr.strip().splitlines()[-3:]))
            return
        folder = folders[0]
        names = [p.name for p in trace_files(folder)]
        print(f"  {len(folders)} folder(s); HTA on {folder.relative_to(out)} ({len(names)} files: {', '.join(names)})")
        run = measure([str(HTA_PYTHON), "-c", HTA_LAYOUT_SCRIPT, str(folder)])
        result = next((json.loads(x[11:]) for x in run.stdout.splitlines() if x.startswith("HTA_LAYOUT ")), None)
        if result is None:
            print("  HTA gave no result; stderr tail: " + " | ".join(run.stderr.strip().splitlines()[-3:]))
            return
        one_each = len(result["ranks"]) == len(names) and not result["dropped"]
        print(
            f"  HTA loaded {len(result['ranks'])} traces, ranks {result['ranks']}, "
            f"{result['dropped']} dropped as 'same rank' ({run.wall_s:.1f} s): "
            f"{'one trace per rank' if one_each else 'NOT one trace per rank'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, help="trace set folder (default: the --set's)")
    parser.add_argument("--set", choices=sorted(SETS), default="rl", help="which trace set (default rl)")
    parser.add_argument("--generator", type=Path, default=RL_GENERATOR, help="gen_rl_traces.py for --set rl")
    parser.add_argument("--png", action="store_true", help="let instrument analyze draw its picture too")
    parser.add_argument("--skip-layout", action="store_true", help="no --layout hta interop check")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool, median reported (default 3)")
    parser.add_argument("--regenerate", action="store_true", help="make a new trace set even if DIR holds one")
    parser.add_argument("--skip-hta", action="store_true", help="measure instrument analyze only")
    parser.add_argument("--skip-ours", action="store_true", help="measure HTA only (before the analyzer exists)")
    args, extra = parser.parse_known_args(argv)  # the rest goes to make_trace_set.py (--tokens, --ranks, ...)
    directory = (args.dir or SETS[args.set]).absolute()
    t_start = time.perf_counter()

    busy = os.getloadavg()[0]
    note = "  (other work is running: timings will be noisy)" if busy > 0.5 else ""
    print(f"load average before: {busy:.2f}{note}")
    ensure_trace_set(directory, args.regenerate, extra, args.set, args.generator)
    print("trace set: " + describe_set(directory))
    tools: list[Tool] = []
    if not args.skip_ours:
        cmd = [str(OURS_PYTHON), "-m", "instrument", "analyze", str(directory), "--json"]
        cmd += [] if args.png else ["--no-png"]
        tools.append(Tool("instrument analyze --json", cmd))
    if not args.skip_hta:
        ensure_hta()
        tools.append(Tool("HTA load + breakdown", [str(HTA_PYTHON), "-c", HTA_SCRIPT, str(directory)]))
    run_all(tools, args.repeat)
    print()
    print(f"median of {args.repeat} fresh processes each, {os.cpu_count()} cores, {directory}")
    print_table(tools)
    print()
    print_details(tools)
    if len(tools) == 2:
        print()
        print_ratios(*tools)
    if not (args.skip_layout or args.skip_hta):
        print()
        layout_check(directory)
    print(f"benchmark wall time: {time.perf_counter() - t_start:.0f} s; load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
