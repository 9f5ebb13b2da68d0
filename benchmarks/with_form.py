"""The with-form against the decorator on an unprofiled step, step timeline on (the default), side by side.

Prints the added nanoseconds per stage (a bare call subtracted) of:
  - the floor: a ``functools.wraps`` closure that reads the clock twice and appends to a list;
  - ``@profiled_stage("x")`` on a function;
  - ``with stage:``, one ``profiled_stage`` object built once and entered each time;
  - ``with ins.profiled_stage("x"):``, built in the ``with`` line each time (the README's form);
and the ratios with-form / decorator (goal <= 1.5) and decorator / floor. All are measured in turns (every
candidate once per round, best of each), so a busy neighbour slows them alike; the timeline's queue is
emptied between turns, as its writer thread empties it at each step's end.

Run: ``.venv/bin/python benchmarks/with_form.py``. Nothing here is asserted in tests.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import instrument as ins
import instrument.testing
from instrument.run._state import STATE

ROUNDS = 25
NUMBER = 20_000


def target(x: int) -> int:
    return x


def _in_turns(candidates: dict[str, Callable[[], Any]], between: Callable[[], None]) -> dict[str, float]:
    """Per-call nanoseconds of each candidate: best of ``ROUNDS`` turns, every candidate once per turn."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in candidates.items():
            between()
            best[name] = min(best[name], timeit.timeit(fn, number=NUMBER) / NUMBER * 1e9)
    return best


def costs() -> dict[str, float]:
    """Added nanoseconds per stage of each form, on an unprofiled step of a configured run."""
    spans: list[tuple[int, int]] = []

    @functools.wraps(target)
    def floor(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        try:
            return target(*args, **kwargs)
        finally:
            spans.append((started, time.perf_counter_ns()))

    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(save_path=save, steps=(999,)), role="actor", rank=0, world_size=1)
        decorated = ins.profiled_stage("update_actor")(target)
        stage = ins.profiled_stage("update_actor")

        def with_object() -> None:
            with stage:
                target(1)

        def with_inline() -> None:
            with ins.profiled_stage("update_actor"):
                target(1)

        def bare_block() -> None:  # what a with-block's body costs alone
            target(1)

        def emptied() -> None:
            spans.clear()
            if STATE.spans is not None:
                STATE.spans.clear()

        with ins.profile_step(1):
            assert STATE.spans is not None and not STATE.recording, "not the timeline's unprofiled step"
            found = _in_turns(
                {
                    "bare call": lambda: target(1),
                    "bare block": bare_block,
                    "floor: closure, 2 clock reads + append": lambda: floor(1),
                    "@profiled_stage": lambda: decorated(1),
                    "with stage (built once)": with_object,
                    'with profiled_stage("x") (built each time)': with_inline,
                },
                between=emptied,
            )
        instrument.testing.reset()
    bare, block = found.pop("bare call"), found.pop("bare block")
    return {name: value - (block if name.startswith("with") else bare) for name, value in found.items()}


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    found = costs()
    print("unprofiled step, step timeline on (added ns per stage)")
    for name, value in found.items():
        print(f"   {name:44s} {value:8.0f} ns")
    decorator = found["@profiled_stage"]
    floor = found["floor: closure, 2 clock reads + append"]
    once, each = found["with stage (built once)"], found['with profiled_stage("x") (built each time)']
    print(f"   ratio with stage / @profiled_stage               = {once / decorator:.2f}   (goal <= 1.5)")
    print(f'   ratio with profiled_stage("x") / @profiled_stage = {each / decorator:.2f}   (goal <= 1.5)')
    print(f"   ratio @profiled_stage / floor                    = {decorator / floor:.2f}")


if __name__ == "__main__":
    main()
