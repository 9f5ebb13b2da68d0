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
import instrument.backends.nvtx as nvtx_backend
import instrument.testing

N = 200_000


def _best_ns(fn: Callable[[], Any], number: int = N) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e9


def target(x: int) -> int:
    return x


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
    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(tool="nvtx", save_path=save, steps=(1,)), role="actor", rank=0, world_size=1)
        bare = _best_ns(lambda: target(1))
        floor = _best_ns(raw)
        with ins.profile_step(1):
            profiled = _best_ns(lambda: staged(1)) - bare
        with ins.profile_step(2):
            unprofiled = _best_ns(lambda: staged(1)) - bare
        instrument.testing.reset()
        real_seam, nvtx_backend.CUDA_PROFILER = (
            nvtx_backend.CUDA_PROFILER,
            types.SimpleNamespace(start="".format, stop="".format),
        )
        ins.configure(ins.ProfilerConfig(tool="nvtx", save_path=save, steps=(1,)), role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            captured = _best_ns(lambda: staged(1)) - bare
        nvtx_backend.CUDA_PROFILER = real_seam
        instrument.testing.reset()
        cfg = ins.ProfilerConfig(tool="nvtx", save_path=save, steps=(1,), discrete=False)
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            continuous = _best_ns(lambda: staged(1)) - bare
        closure = _best_ns(lambda: plain(1)) - bare
        floor_cost = _best_ns(lambda: floor_closure(1)) - bare
        instrument.testing.reset()
    print(f"raw nvtx domain push+pop (prebuilt attributes)  {floor:7.0f} ns")
    print(f"@profiled_stage, profiled step, continuous mode  {continuous:7.0f} ns added  (a range)")
    print(f"@profiled_stage, profiled step, discrete mode    {profiled:7.0f} ns added  (no CUDA: a range)")
    print(f"@profiled_stage, discrete, capture-range seam    {captured:7.0f} ns added  (as on a GPU, less CUDA)")
    print(f"@profiled_stage, unprofiled step                 {unprofiled:7.0f} ns added")
    print(f"functools.wraps closure                          {closure:7.0f} ns added")
    print(f"closure pushing/popping the same prebuilt range {floor_cost:7.0f} ns added  (the floor)")
    print(f"ratio continuous stage / floor = {continuous / floor_cost:.2f}   (goal <= 2)")
    print(f"ratio discrete stage / floor   = {profiled / floor_cost:.2f}   (goal <= 3)")
    print(f"ratio discrete, with the seam  = {captured / floor_cost:.2f}")
    print(f"ratio unprofiled stage / closure    = {unprofiled / closure:.2f}  (goal: about 1)")


if __name__ == "__main__":
    main()
