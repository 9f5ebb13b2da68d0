"""Request spans against stage spans on an unprofiled step, step timeline on (the default), side by side.

Prints the added nanoseconds per span (a bare call or block subtracted) of:
  - the floor: a ``functools.wraps`` closure that reads the clock twice and appends to a list;
  - ``@profiled_stage("x")`` on a function (a stage span, its cheapest form);
  - ``with ins.profiled_stage("x"):``, the stage's with form built each time (as a request's is);
  - ``with ins.request(prompt_tokens=p) as r: ...; r.output_tokens = n`` (built each time: one per request);
  - ``@ins.request(output_tokens=len)`` on a function (the decorator form, the result's count read);
and the ratios of each request form to the stage forms (goal <= 1.5) and to the floor. Each candidate runs
once per turn, best of each over the turns, so a busy neighbour slows them alike; the timeline's queue is
emptied between turns, as its writer thread empties it at each step's end.

Run: ``.venv/bin/python benchmarks/request_spans.py``. Nothing here is asserted in tests.
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
TOKENS = [1, 2, 3]


def target(x: int) -> list[int]:
    return TOKENS


def _in_turns(candidates: dict[str, Callable[[], Any]], between: Callable[[], None]) -> dict[str, float]:
    """Per-call nanoseconds of each candidate: best of ``ROUNDS`` turns, every candidate once per turn."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in candidates.items():
            between()
            best[name] = min(best[name], timeit.timeit(fn, number=NUMBER) / NUMBER * 1e9)
    return best


def costs() -> dict[str, float]:
    """Added nanoseconds per span of each form, on an unprofiled step of a configured run."""
    spans: list[tuple[int, int]] = []

    @functools.wraps(target)
    def floor(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        try:
            return target(*args, **kwargs)
        finally:
            spans.append((started, time.perf_counter_ns()))

    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(save_path=save, steps=(999,)), role="rollout", rank=0, world_size=1)
        decorated = ins.profiled_stage("generate_sequences")(target)
        requested = ins.request(output_tokens=len)(target)

        def stage_inline() -> None:
            with ins.profiled_stage("generate_sequences"):
                target(1)

        def request_with() -> None:
            with ins.request(prompt_tokens=12) as r:
                r.output_tokens = len(target(1))

        def bare_block() -> None:  # what a with-block's body costs alone
            len(target(1))

        def emptied() -> None:
            spans.clear()
            if STATE.spans is not None:
                STATE.spans.clear()

        outer = ins.profiled_stage("rollout")
        with ins.profile_step(1), outer:  # requests inside a stage, as they run
            assert STATE.spans is not None and not STATE.recording, "not the timeline's unprofiled step"
            found = _in_turns(
                {
                    "bare call": lambda: target(1),
                    "bare block": bare_block,
                    "floor: closure, 2 clock reads + append": lambda: floor(1),
                    "stage: @profiled_stage": lambda: decorated(1),
                    'stage: with profiled_stage("x")': stage_inline,
                    "request: with request(prompt_tokens=p) as r": request_with,
                    "request: @request(output_tokens=len)": lambda: requested(1),
                },
                between=emptied,
            )
        emptied()
        instrument.testing.reset()
    bare, block = found.pop("bare call"), found.pop("bare block")
    with_forms = ("stage: with", "request: with")
    return {name: value - (block if name.startswith(with_forms) else bare) for name, value in found.items()}


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    found = costs()
    print("unprofiled step, step timeline on (added ns per span)")
    for name, value in found.items():
        print(f"   {name:46s} {value:8.0f} ns")
    floor = found["floor: closure, 2 clock reads + append"]
    decorator, inline = found["stage: @profiled_stage"], found['stage: with profiled_stage("x")']
    with_form, wrapped = (
        found["request: with request(prompt_tokens=p) as r"],
        found["request: @request(output_tokens=len)"],
    )
    print(f'   ratio with request / with profiled_stage("x")  = {with_form / inline:.2f}   (goal <= 1.5)')
    print(f"   ratio @request / @profiled_stage              = {wrapped / decorator:.2f}   (goal <= 1.5)")
    print(f"   ratio with request / @profiled_stage          = {with_form / decorator:.2f}")
    print(f"   ratio with request / floor                    = {with_form / floor:.2f}")
    print(f"   ratio @request / floor                        = {wrapped / floor:.2f}")


if __name__ == "__main__":
    main()
