"""What memory recording costs, measured on this machine (CPU; what a GPU adds is printed, not measured).

Prints:
  1. a profiled stage under ``tool="torch_memory"``: what the training thread pays (history calls,
     taking the snapshot, handing it to the writer thread), tiny snapshots, against ``tool="none"``;
  2. writing a snapshot (by the writer thread; what an OOM snapshot costs the raising thread): cutting
     stacks, pickling (bounded), fsync and publishing, for synthetic snapshots shaped like torch's
     (entries x frames), with the file size;
  3. the OOM hook on the disabled path: a closure with the ``try/except RuntimeError`` the decorator
     now has against one without (measured in turns), and ``@profiled_stage`` with ``on_oom`` on vs off;
  4. what a GPU adds (from torch's documentation): per-allocation stack capture while history records.

There is no GPU here: ``instrument.recorders.memory.CUDA`` is replaced by a stand-in that records
nothing and returns a synthetic snapshot (as in tests/recorders/test_memory.py). Run:
``.venv/bin/python benchmarks/memory.py``. Numbers are best-of-N; nothing here is asserted in tests.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import instrument as ins
import instrument.testing
from instrument.recorders import TraceSpec, memory
from instrument.recorders._snapshot_files import SnapshotWriter
from instrument.run._state import STATE


class _NoGpu:
    """Stands in for torch.cuda.memory: history calls do nothing; snapshots are synthetic, ``entries`` x ``frames``."""

    def __init__(self, entries: int = 1, frames: int = 4) -> None:
        self.entries, self.frames = entries, frames

    def available(self) -> bool:
        return True

    def record(self, options: Any, *, clear: bool) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        def frames() -> list[dict[str, Any]]:
            return [{"filename": "/work/train.py", "line": i, "name": f"layer{i}.forward"} for i in range(self.frames)]

        entries = [
            {"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_us": i, "frames": frames()}
            for i in range(self.entries)
        ]
        blocks = [{"address": i * 512, "size": 512, "state": "active_allocated", "frames": frames()} for i in range(64)]
        return {"segments": [{"address": 0, "total_size": 2 << 20, "allocated_size": 1 << 15, "blocks": blocks}],
                "device_traces": [entries]}  # fmt: skip


def _best(fn: Callable[[], Any], number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def _stage_cost(tool: str) -> float:
    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(save_path=save, tool=tool), role="actor", rank=0, world_size=1)
        staged = ins.profiled_stage("update_actor")(lambda: None)
        times = []
        for step in range(1, 201):
            started = time.perf_counter()
            with ins.profile_step(step):
                staged()
            times.append(time.perf_counter() - started)
            instrument.testing.wait_for_exports()  # not timed: the writer thread's part, section 2
        instrument.testing.reset()
    return statistics.median(times) * 1e6


def stage_costs() -> dict[str, float]:
    """Microseconds per profiled step of one stage: torch_memory (one snapshot file each) vs none."""
    return {tool: _stage_cost(tool) for tool in ("none", "torch_memory")}


def save_costs() -> list[tuple[int, int, float, int]]:
    """(entries, frames, seconds to save, bytes) for synthetic snapshots."""
    rows = [_save_cost(entries, frames) for entries, frames in ((1_000, 32), (10_000, 32), (100_000, 32), (100_000, 8))]
    memory.CUDA = _NoGpu()
    return rows


def _save_cost(entries: int, frames: int) -> tuple[int, int, float, int]:
    memory.CUDA = _NoGpu(entries, frames)
    sizes: list[int] = []
    with tempfile.TemporaryDirectory() as save:
        spec = TraceSpec(save_path=save, role="actor", stage="update_actor", step=1, rank=0, world_size=1, contents=())
        options = ins.MemorySnapshots(stack_depth=frames)
        writer = SnapshotWriter(options, lambda r: sizes.append(r.bytes), lambda what, exc: None)
        take = memory.CUDA.snapshot
        seconds = min(_timed(lambda: writer.save(take(), spec, background=False)) for _ in range(3))
        writer.close()
    return entries, frames, seconds, sizes[-1]


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def disabled_path_costs() -> dict[str, float]:
    """Nanoseconds per call, measured in turns: the zero-cost try, and the decorator with on_oom on/off."""

    def target(x: int) -> int:
        return x

    @functools.wraps(target)
    def plain(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    @functools.wraps(target)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return target(*args, **kwargs)
        except RuntimeError:
            raise

    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(save_path=save, steps=(999,)), role="actor", rank=0, world_size=1)
        off = ins.profiled_stage("update_actor")(target)
        candidates: dict[str, Callable[[], Any]] = {
            "closure": lambda: plain(1),
            "closure with try/except RuntimeError": lambda: guarded(1),
            "@profiled_stage, on_oom off": lambda: off(1),
        }
        best = dict.fromkeys(candidates, float("inf"))
        with ins.profile_step(1):
            for _ in range(9):
                for name, fn in candidates.items():
                    best[name] = min(best[name], _best(fn, number=50_000, repeat=1) * 1e9)
        cfg = ins.ProfilerConfig(save_path=save, steps=(999,), memory={"on_oom": True})
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        on = ins.profiled_stage("update_actor")(target)
        best["@profiled_stage, on_oom on"] = float("inf")
        with ins.profile_step(1):
            for _ in range(9):
                for name, fn in (
                    ("@profiled_stage, on_oom off", lambda: off(1)),
                    ("@profiled_stage, on_oom on", lambda: on(1)),
                ):
                    best[name] = min(best[name], _best(fn, number=50_000, repeat=1) * 1e9)

            def raises() -> None:
                raise RuntimeError("not an OOM")

            failing = ins.profiled_stage("update_actor")(raises)

            def fail_once() -> None:
                with contextlib.suppress(RuntimeError):
                    failing()

            best["a RuntimeError leaving the stage (on_oom on)"] = _best(fail_once, number=20_000) * 1e9
        instrument.testing.reset()
        STATE.on_oom = STATE.memory = None
    return best


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    memory.CUDA = _NoGpu()
    print("1. a profiled stage, one step each (median us per step on the training thread; 1-event snapshots)")
    stages = stage_costs()
    for tool, us in stages.items():
        print(f"   tool={tool:14s} {us:9.1f} us")
    print(
        f"   the recorder's part (history calls, taking the snapshot, queueing it): "
        f"{stages['torch_memory'] - stages['none']:.1f} us per stage"
    )
    print("2. writing one snapshot, by the writer thread (an OOM snapshot: by the raising thread)")
    print("   (cut stacks, bounded pickle, fsync, exclusive link, manifest line)")
    for entries, frames, seconds, size in save_costs():
        print(f"   {entries:7,d} events x {frames:2d} frames  {seconds * 1e3:8.1f} ms  {size / 1e6:7.1f} MB")
    print("3. the disabled path (ns per call; unprofiled step)")
    costs = disabled_path_costs()
    for name, ns in costs.items():
        print(f"   {name:46s} {ns:8.0f} ns")
    ratio = costs["closure with try/except RuntimeError"] / costs["closure"]
    print(f"   ratio try/except closure / closure = {ratio:.2f}   (zero-cost exceptions: ~1.00)")
    print("4. on a GPU, not measured here (torch's documentation of _record_memory_history):")
    print("   each CUDA allocation and free while history records: ~2 us with Python stacks (stacks='python'),")
    print("   ~50 ns per C++ frame more with stacks='all'; plus torch.cuda.memory._snapshot() at each stage end,")
    print("   which gathers max_entries events (section 2 is what pickling them costs after that).")


if __name__ == "__main__":
    main()
