"""NVTX backend cost, side by side with raw ``nvtx`` domain push/pop, in one run.

Prints per-call nanoseconds for: a raw domain push+pop with prebuilt attributes, a ``functools.wraps``
closure that pushes and pops the same prebuilt range (the floor for a decorator), a
``@profiled_stage`` call on a profiled step under ``tool="nvtx"``, the same decorated call on an
unprofiled step, and a plain ``functools.wraps`` closure. Without CUDA a capture range is nothing,
so a discrete stage is measured twice: as it runs here, and with a stand-in capture-range seam
whose start/stop do nothing (what the bookkeeping of capture ranges costs; a GPU adds
``cudaProfilerStart/Stop`` themselves). Run without an NVTX tool attached
(``NVTX_INJECTION64_PATH`` unset), as most steps of a real job are: ``.venv/bin/python benchmarks/nvtx_ranges.py``.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import timeit
import types
from collections.abc import Callable
from typing import Any

import nvtx

import instrument as ins
import instrument.recorders.nvtx as nvtx_backend
import instrument.testing

ROUNDS, NUMBER = 15, 20_000


def target(x: int) -> int:
    return x


def _in_turns(candidates: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Per-call ns, best of ROUNDS turns with every candidate once per turn: load slows them alike."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in candidates.items():
            best[name] = min(best[name], timeit.timeit(fn, number=NUMBER) / NUMBER * 1e9)
    return best


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    os.environ.pop("NVTX_INJECTION64_PATH", None)
    domain = nvtx.get_domain("bench")
    attributes = domain.get_event_attributes(message="update_actor step1", color=0xFF4E79A7, category="actor")

    def raw() -> None:
        domain.push_range(attributes)
        domain.pop_range()

    @functools.wraps(target)
    def floor_closure(*args: Any, **kwargs: Any) -> Any:  # the honest floor for a decorator: same range
        domain.push_range(attributes)
        try:
            return target(*args, **kwargs)
        finally:
            domain.pop_range()

    @functools.wraps(target)
    def plain(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    staged = ins.profiled_stage("update_actor")(target)

    def measure(step: int) -> dict[str, float]:
        """Inside step ``step`` of the configured run: the stage, its floors and a bare call, in turns."""
        with ins.profile_step(step):
            staged(1)  # the first call of a step goes through the session; the rest are measured
            ns = _in_turns(
                {
                    "bare": lambda: target(1),
                    "raw": raw,
                    "floor": lambda: floor_closure(1),
                    "closure": lambda: plain(1),
                    "stage": lambda: staged(1),
                }
            )
        bare = ns.pop("bare")
        return {name: value if name == "raw" else value - bare for name, value in ns.items()}

    def run(step: int, *, discrete: bool = True) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as save:
            cfg = ins.ProfilerConfig(tool="nvtx", save_path=save, steps=(1,), discrete=discrete)
            ins.configure(cfg, role="actor", rank=0, world_size=1)
            try:
                return measure(step)
            finally:
                instrument.testing.reset()

    discrete, unprofiled, continuous = run(1), run(2), run(1, discrete=False)
    real_seam = nvtx_backend.CUDA_PROFILER
    nvtx_backend.CUDA_PROFILER = types.SimpleNamespace(start="".format, stop="".format)
    try:
        seam = run(1)
    finally:
        nvtx_backend.CUDA_PROFILER = real_seam

    print(f"raw nvtx domain push+pop (prebuilt attributes)  {discrete['raw']:7.0f} ns")
    print(f"closure pushing/popping the same prebuilt range {discrete['floor']:7.0f} ns added  (the floor)")
    print(f"functools.wraps closure                          {discrete['closure']:7.0f} ns added")
    rows = (
        ("continuous mode", continuous, "floor", "a range", "<= 2"),
        ("discrete mode", discrete, "floor", "no CUDA: a range", "<= 3"),
        ("discrete, capture-range seam", seam, "floor", "as on a GPU, less CUDA's calls", "<= 3"),
        ("unprofiled step", unprofiled, "closure", "against the plain closure", "about 1"),
    )
    for label, ns, floor, note, goal in rows:
        ratio = ns["stage"] / ns[floor]
        print(f"@profiled_stage, {label:29s} {ns['stage']:7.0f} ns added  ratio {ratio:.2f} (goal {goal}; {note})")


if __name__ == "__main__":
    main()
