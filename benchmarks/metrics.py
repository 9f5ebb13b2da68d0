"""What stage metrics cost per decorated call, side by side in one run: metrics off vs on.

Goal: with metrics on, a stage on an unprofiled step costs at most 1.2x a ``functools.wraps`` closure
that times the call and observes a bound ``Histogram`` child (``.labels()`` per use costs far more:
children are bound once). Run: ``.venv/bin/python benchmarks/metrics.py``.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

import instrument as ins
import instrument.testing

N = 100_000


def _best_ns(fn: Callable[[], Any], number: int = N) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e9


def target(x: int) -> int:
    return x


def _stage_cost(metrics: bool, save: str) -> float:
    ins.configure(ins.ProfilerConfig(save_path=save, steps=(999,), metrics=metrics), role="bench", rank=0, world_size=1)
    staged = ins.profiled_stage("update_actor")(target)
    with ins.profile_step(1):
        cost = _best_ns(lambda: staged(1)) - _best_ns(lambda: target(1))
    instrument.testing.reset()
    return cost


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    histogram = Histogram("bench_seconds", "x", ["stage"], registry=CollectorRegistry())
    child = histogram.labels("update_actor")
    observe_bound = _best_ns(lambda: child.observe(0.01))
    observe_labels = _best_ns(lambda: histogram.labels("update_actor").observe(0.01))
    with tempfile.TemporaryDirectory() as save:
        off = _stage_cost(False, save)
        on = _stage_cost(True, save)

    @functools.wraps(target)
    def timed(*args: Any, **kwargs: Any) -> Any:  # the floor: time the call, observe a bound child
        started = time.perf_counter()
        try:
            return target(*args, **kwargs)
        finally:
            child.observe(time.perf_counter() - started)

    floor = _best_ns(lambda: timed(1)) - _best_ns(lambda: target(1))
    print(f"Histogram.observe, bound child              {observe_bound:7.0f} ns")
    print(f"Histogram.labels(...).observe per use       {observe_labels:7.0f} ns")
    print(f"@profiled_stage, unprofiled step, metrics off {off:5.0f} ns added")
    print(f"@profiled_stage, unprofiled step, metrics on  {on:5.0f} ns added")
    print(f"closure timing the call, bound observe   {floor:5.0f} ns added  (the floor)")
    print(f"ratio metrics on / floor = {on / floor:.2f}   (goal <= 1.2)")


if __name__ == "__main__":
    main()
