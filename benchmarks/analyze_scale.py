"""``instrument analyze`` on 256, 1,024 and 4,096 rank files: memory bounded, time linear (issue 17 items 2-4).

Writes synthetic but realistic trace sets (``--out``, default ``outputs/analyze-scale``): one
continuous-mode trace per rank, named and laid out as the SDK writes them
(``actor-rollout-ref_continuous_step2_rank{r}-of-{W}_node{n}_pid{p}_{ns}.pt.trace.json.gz``, 8 ranks
a node, the same 8 pids on every node), with the ``distributedInfo`` and ``instrument`` headers and
one ``instrument-manifest-node{n}-pid{p}.jsonl`` per process. Inside each: a ``ProfilerStep#2``;
the stages ``generate_sequences`` (a decode loop: ``aten::linear`` > ``aten::addmm``, its
``cudaLaunchKernel`` and GPU kernel per token), ``compute_log_prob`` and ``update_actor`` with four
``mini_batch{i}`` windows (forward, backward, an NCCL all-reduce: ``c10d::allreduce_`` and its
kernel) and a host-to-device copy: about 520 events, 90 KB of JSON (4 KB gzip) per rank. Ranks
differ by a few percent; one rank in 64 is a straggler (1.6x the generation work).

Then, for each set, in fresh processes (best of ``--repeat``): ``instrument analyze DIR --json
--no-png --quiet`` with the default reading processes and with ``--jobs 1``: wall, CPU and peak
memory of the whole process tree (RSS summed, polled every 20 ms: ``benchmarks/analyze.py``'s
``measure``); growth against the 256-file set next to the growth of the file count. Goals: peak
memory <= 300 MB at 4,096 files, time linear. Then reading the manifests alone
(:func:`instrument.manifest.read_manifests`, CPU time in this process) and its growth.

``--ray`` adds the crossover measurement: the same analysis with ``--ray`` starting its own local
Ray (what one command costs with no cluster running) and with ``--ray ADDRESS`` against a Ray head
this benchmark starts (``ray start --head --block``, 2 CPUs, its own port and temp dir; stopped by
its process group, never by ``ray stop``). ``--big DIR`` adds a set of a few large files (e.g.
``outputs/rl-trace-set``: 8 x 50 MB) to the crossover.

Run: ``.venv/bin/python benchmarks/analyze_scale.py [--repeat 3] [--ray] [--big outputs/rl-trace-set]``
(about 5 minutes on 2 cores; 10 with ``--ray``). Nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from instrument.manifest import read_manifests  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from scale_plan import LINEAR_SLOPE, slope  # noqa: E402  # the same fit for plans and analyses

_spec = importlib.util.spec_from_file_location("bench_analyze", ROOT / "benchmarks" / "analyze.py")
assert _spec is not None and _spec.loader is not None
bench_analyze = importlib.util.module_from_spec(_spec)
sys.modules["bench_analyze"] = bench_analyze  # dataclasses look their module up
_spec.loader.exec_module(bench_analyze)
measure = bench_analyze.measure

SIZES = (256, 1024, 4096)
PER_NODE = 8
ROLE = "actor-rollout-ref"
STEP = 2
TOKENS = 30
LOG_PROB_CHUNKS = 16
MINI_BATCHES = 4
LAYERS = 6
MEMORY_GOAL_MB = 300.0


PYTHON = sys.executable
RAY_PORT = 46379


# --------------------------------------------------------------------------- the trace sets


class _Timeline:
    """Events of one rank, laid out on its own clock (hosts' clocks are never aligned)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.now = 1_790_000_000_000_000.0 + 7_919 * rank  # us
        self.correlation = 1
        self.events: list[dict[str, Any]] = []

    def host(self, name: str, cat: str, start: float, dur: float, tid: int = 1) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": start, "dur": dur})

    def op(self, name: str, dur: float, kernel: str, kernel_dur: float) -> None:
        """``aten::linear`` > ``aten::addmm`` > ``cudaLaunchKernel``, and the kernel on the GPU stream."""
        start = self.now
        self.host(name, "cpu_op", start, dur)
        self.host("aten::addmm", "cpu_op", start + 1, dur - 2)
        launch = {"correlation": self.correlation}
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1,
             "ts": start + 2, "dur": 4, "args": launch}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start + 8, "dur": kernel_dur,
             "args": {"correlation": self.correlation, "stream": 7, "device": 0}}
        )  # fmt: skip
        self.correlation += 1
        self.now += dur + 3


def _rank_events(rank: int) -> list[dict[str, Any]]:
    slow = 1.6 if rank % 64 == 37 else 1.0
    jitter = 1.0 + (rank * 2_654_435_761 % 97) / 1_000  # a few percent, the same on every run
    line = _Timeline(rank)
    step_start = line.now
    # generate_sequences: a decode loop
    stage_start = line.now
    for _ in range(int(TOKENS * slow)):
        for _ in range(2):
            line.op("aten::linear", 40 * jitter, "ampere_sgemm_64x32_sliced1x4_tn", 25 * jitter)
    line.host("generate_sequences", "user_annotation", stage_start, line.now - stage_start)
    line.now += 50
    # compute_log_prob: larger forward passes
    stage_start = line.now
    copy = line.now
    line.events.append(
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": copy, "dur": 30}
    )  # fmt: skip
    for _ in range(LOG_PROB_CHUNKS):
        line.op("aten::linear", 120 * jitter, "ampere_sgemm_128x64_tn", 90 * jitter)
    line.host("compute_log_prob", "user_annotation", stage_start, line.now - stage_start)
    line.now += 50
    # update_actor: mini-batch windows with an all-reduce each
    stage_start = line.now
    for i in range(MINI_BATCHES):
        mb_start = line.now
        for _ in range(LAYERS):
            line.op("aten::linear", 80 * jitter, "ampere_sgemm_128x64_tn", 60 * jitter)
        for _ in range(LAYERS):
            line.op("autograd::engine::evaluate_function: AddmmBackward0", 150 * jitter, "sgemm_nt", 110 * jitter)
        wait = 400.0 if slow == 1.0 else 20.0  # the others wait for the straggler
        line.host("c10d::allreduce_", "cpu_op", line.now, wait + 200)
        line.events.append(
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 9,
             "ts": line.now + 5, "dur": wait + 180, "args": {"correlation": 0, "stream": 9, "device": 0}}
        )  # fmt: skip
        line.now += wait + 205
        line.host(f"mini_batch{i}", "user_annotation", mb_start, line.now - mb_start)
    line.host("update_actor", "user_annotation", stage_start, line.now - stage_start)
    line.host(f"ProfilerStep#{STEP}", "user_annotation", step_start, line.now - step_start + 10)
    return line.events


def write_set(directory: Path, world: int) -> None:
    """One trace and one manifest per rank, as the SDK writes them."""
    directory.mkdir(parents=True)
    for rank in range(world):
        node, pid = rank // PER_NODE, 1000 + rank % PER_NODE
        name = (
            f"{ROLE}_continuous_step{STEP}_rank{rank}-of-{world}_node{node}_pid{pid}_"
            f"{1_790_000_000_000_000_000 + rank}.pt.trace.json.gz"
        )
        trace = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "instrument": {"role": "actor_rollout_ref", "stage": "continuous", "step": STEP, "rank": rank},
            "traceEvents": _rank_events(rank),
        }
        data = gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), compresslevel=6)
        (directory / name).write_bytes(data)
        record = {
            "path": name, "role": "actor_rollout_ref", "stage": "continuous", "step": STEP, "rank": rank,
            "world": world, "window": None, "partial": False, "triggered": False, "bytes": len(data), "tool": "torch",
        }  # fmt: skip
        manifest = directory / f"instrument-manifest-node{node}-pid{pid}.jsonl"
        manifest.write_text(json.dumps(record) + "\n", encoding="utf-8")


def ensure_sets(out: Path, regenerate: bool) -> dict[int, Path]:
    sets = {}
    for world in SIZES:
        directory = out / f"ranks{world}"
        if regenerate and directory.exists():
            shutil.rmtree(directory)
        if not directory.exists():
            started = time.perf_counter()
            write_set(directory, world)
            print(f"wrote {directory} in {time.perf_counter() - started:.1f} s", flush=True)
        sets[world] = directory
    return sets


def describe(directory: Path) -> str:
    traces = [p for p in directory.iterdir() if p.name.endswith((".json.gz", ".json"))]
    size = sum(p.stat().st_size for p in traces)
    return f"{len(traces)} files, {size / 2**20:.1f} MB on disk"


# --------------------------------------------------------------------------- measuring


def analyze_once(directory: Path, *extra: str) -> Any:
    run = measure([PYTHON, "-m", "instrument", "analyze", str(directory), "--json", "--no-png", "--quiet", *extra])
    if run.returncode != 0:
        raise SystemExit(f"instrument analyze {directory} {' '.join(extra)} failed ({run.returncode}):\n{run.stderr}")
    return run


def best_of(directory: Path, repeat: int, *extra: str) -> tuple[Any, dict[str, Any]]:
    runs = [analyze_once(directory, *extra) for _ in range(repeat)]
    best = min(runs, key=lambda r: r.cpu_s)
    return best, json.loads(best.stdout)


def growth_lines(label: str, values: dict[int, float], unit: str) -> bool:
    base = values[SIZES[0]]
    cells = []
    for n in SIZES:
        ratio = values[n] / base if base else float("inf")
        cells.append(f"{n}: {values[n]:.2f} {unit} (x{ratio:.2f} for x{n // SIZES[0]} files)")
    exponent = slope(SIZES, [values[n] for n in SIZES])
    linear = exponent <= LINEAR_SLOPE
    verdict = "linear or better" if linear else "FASTER THAN LINEAR"
    print(f"  {label}: " + "; ".join(cells) + f" -> {verdict}: grows as files^{exponent:.2f}")
    return linear


def local_runs(sets: dict[int, Path], repeat: int) -> bool:
    ok = True
    for extra, label in (((), "default reading processes"), (("--jobs", "1"), "--jobs 1")):
        cpu, wall, memory = {}, {}, {}
        print(f"instrument analyze --json --no-png, {label}:")
        for n, directory in sets.items():
            run, report = best_of(directory, repeat, *extra)
            cpu[n], wall[n], memory[n] = run.cpu_s, run.wall_s, run.tree_rss_mb
            rows = report["stages"]
            worst = rows[0]
            print(
                f"  {n:5d} files ({describe(directory)}): wall {run.wall_s:.2f} s, cpu {run.cpu_s:.2f} s, "
                f"peak tree RSS {run.tree_rss_mb:.0f} MB (largest process {run.max_proc_rss_mb:.0f} MB), "
                f"jobs {report['jobs']}, {report['events']:,} events, {len(rows)} rows of "
                f"{rows[0]['n_ranks']} ranks; worst {worst['stage']} straggler rank {worst['straggler_rank']} "
                f"x{worst['straggler_ratio']}"
            )
        ok &= growth_lines("cpu", cpu, "s")
        growth_lines("wall", wall, "s")
        print(
            f"  peak memory at {SIZES[-1]} files {memory[SIZES[-1]]:.0f} MB: "
            f"{'within' if memory[SIZES[-1]] <= MEMORY_GOAL_MB else 'OVER'} the {MEMORY_GOAL_MB:.0f} MB goal; "
            f"growth x{memory[SIZES[-1]] / memory[SIZES[0]]:.2f} for x{SIZES[-1] // SIZES[0]} files"
        )
        ok &= memory[SIZES[-1]] <= MEMORY_GOAL_MB
    return ok


def manifest_runs(sets: dict[int, Path], repeat: int) -> bool:
    cpu = {}
    for n, directory in sets.items():
        best = float("inf")
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_SELF)
            records = sum(1 for _ in read_manifests(directory))
            after = resource.getrusage(resource.RUSAGE_SELF)
            best = min(best, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
        assert records == n
        cpu[n] = best * 1e3
    print("read_manifests (one manifest per process):")
    return growth_lines("cpu", cpu, "ms")


# --------------------------------------------------------------------------- Ray crossover


def _start_head(temp: Path) -> subprocess.Popen[bytes]:
    ray = Path(PYTHON).parent / "ray"
    cmd = [str(ray), "start", "--head", "--block", f"--port={RAY_PORT}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
           "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"]  # fmt: skip
    head = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and head.poll() is None:  # up once a client can connect
        probe = subprocess.run(
            [PYTHON, "-c", f"import ray; ray.init(address='127.0.0.1:{RAY_PORT}', logging_level=40); ray.shutdown()"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return head
        time.sleep(1)
    _stop_head(head)
    raise SystemExit(f"the Ray head did not come up (port {RAY_PORT} taken?): {' '.join(cmd)}")


def _stop_head(head: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(head.pid, signal.SIGTERM)  # the session this benchmark started: its head and workers only
        head.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(head.pid, signal.SIGKILL)


def ray_runs(sets: dict[str, Path], repeat: int) -> None:
    print("Ray crossover (2 CPUs here: the same as local reading; a cluster adds its nodes' CPUs):")
    # A private cluster on a private port of this machine: Ray's token authentication (on by default in
    # recent Ray for `ray start`) would need the token handed to every client; the benchmark opts out.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # Without a cluster first: with one running here, `ray.init()` would join it instead of starting its own.
    own = {label: best_of(directory, 1, "--ray")[0] for label, directory in sets.items()}
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        head = _start_head(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    try:
        for label, directory in sets.items():
            local, local_report = best_of(directory, repeat)
            attached, attached_report = best_of(directory, repeat, "--ray", f"127.0.0.1:{RAY_PORT}")
            same = _same(local_report, attached_report)
            print(
                f"  {label}: local (jobs {local_report['jobs']}) wall {local.wall_s:.2f} s | --ray ADDRESS (running "
                f"cluster) wall {attached.wall_s:.2f} s, +{attached.wall_s - local.wall_s:.2f} s | --ray (starts "
                f"its own) wall {own[label].wall_s:.2f} s | same report: {same}"
            )
    finally:
        _stop_head(head)
        shutil.rmtree(temp, ignore_errors=True)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k not in ("elapsed_s", "jobs")} == {
        k: v for k, v in b.items() if k not in ("elapsed_s", "jobs")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "analyze-scale")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--ray", action="store_true", help="also measure --ray (the crossover)")
    parser.add_argument("--big", type=Path, help="a set of a few large files for the Ray crossover")
    parser.add_argument("--skip-local", action="store_true", help="only the Ray crossover")
    args = parser.parse_args()
    sets = ensure_sets(args.out, args.regenerate)
    ok = True
    if not args.skip_local:
        ok &= local_runs(sets, args.repeat)
        ok &= manifest_runs(sets, max(args.repeat, 5))
    if args.ray:
        crossover = {f"{n} files ({describe(d)})": d for n, d in sets.items()}
        if args.big is not None:
            crossover[f"{args.big.name} ({describe(args.big)})"] = args.big
        ray_runs(crossover, args.repeat)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
