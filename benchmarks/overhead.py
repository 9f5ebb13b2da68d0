"""What instrument costs the training loop, measured side by side in one run.

Prints, for this machine:
  1. unprofiled step or rank, ``timeline=False``: the added cost of ``@profiled_stage`` next to a plain
     ``functools.wraps`` closure (goal: <= 1.5x), and ``profile_window`` (goal: <= 1.5x that closure);
     ``wrapt`` and ``torch.profiler.record_function`` for reference;
     1b. the same with the step timeline on (the default), next to a closure that reads the clock twice
     and appends to a list (goal: <= 1.5x);
  2. profiled (continuous) step: one stage against a closure around the same user-annotation range
     (the timeline's span included; what counts is section 4's µs per stage);
  3. training-thread time per saved window against ``export_chrome_trace("x.json.gz")``
     on the same trace (goal: <= 1/5);
  4. a stage range, now a user annotation, in µs (goal: <= 10 µs per stage), against the former
     ``_RecordFunctionFast`` range (a ``cpu_op``) and the other ways torch writes a range.

Run: ``.venv/bin/python benchmarks/overhead.py``. Numbers are best-of-7 medians of many calls;
nothing here is asserted in tests.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import tempfile
import time
import timeit
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import wrapt

import instrument as ins
import instrument.testing
from instrument.naming import TRACE_SUFFIX
from instrument.run._session import STATE

N = 200_000


def _best_ns(fn: Callable[[], Any], number: int = N) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e9


def target(x: int) -> int:
    return x


def plain_wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


@wrapt.decorator
def wrapt_passthrough(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


def unprofiled_costs() -> dict[str, float]:
    """Per-call nanoseconds with profiling off (configured, step not profiled on this rank)."""
    with tempfile.TemporaryDirectory() as save:
        config = ins.ProfilerConfig(save_path=save, steps=(999,), timeline=False)
        ins.configure(config, role="actor", rank=0, world_size=1)
        staged = ins.profiled_stage("update_actor")(target)
        wrapped = plain_wrapper(target)
        wrapt_wrapped = wrapt_passthrough(target)
        with ins.profile_step(1):
            # In turns, best of each: a busy neighbour slows every candidate alike, not one block of them.
            costs = _in_turns(
                {
                    "bare call": lambda: target(1),
                    "functools.wraps closure": lambda: wrapped(1),
                    "@profiled_stage (off)": lambda: staged(1),
                    "wrapt passthrough": lambda: wrapt_wrapped(1),
                    "with profile_window (off)": _window_loop_body,
                    "empty body": _empty_loop_body,
                }
            )
            bare, empty = costs["bare call"], costs.pop("empty body")
            for name in ("functools.wraps closure", "@profiled_stage (off)", "wrapt passthrough"):
                costs[name] -= bare
            costs["profile_window (off)"] = costs.pop("with profile_window (off)") - empty
            rf = torch.autograd.profiler.record_function
            costs["torch record_function (no profiler)"] = _best_ns(lambda: rf("x").__enter__(), N // 20)
        instrument.testing.reset()
    return costs


def timeline_costs() -> dict[str, float]:
    """Per-call nanoseconds with the step timeline on (the default), on an unprofiled step.

    The floor is what any span recorder must do: a ``functools.wraps`` closure that reads the clock
    twice and appends to a list. Both queues are emptied between turns, as the writer thread empties
    ours at each step's end, so neither grows through the measurement.
    """
    spans: list[tuple[Any, ...]] = []

    def clock_closure(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return func(*args, **kwargs)
            finally:
                spans.append((started, time.perf_counter_ns()))

        return wrapper

    with tempfile.TemporaryDirectory() as save:
        ins.configure(ins.ProfilerConfig(save_path=save, steps=(999,)), role="actor", rank=0, world_size=1)
        staged = ins.profiled_stage("update_actor")(target)
        floor = clock_closure(target)

        def emptied() -> None:
            spans.clear()
            if STATE.spans is not None:
                STATE.spans.clear()

        with ins.profile_step(1):
            costs = _in_turns(
                {
                    "bare call": lambda: target(1),
                    "closure: 2 clock reads + list append": lambda: floor(1),
                    "@profiled_stage (timeline on)": lambda: staged(1),
                },
                between=emptied,
            )
        bare = costs.pop("bare call")
        costs = {name: value - bare for name, value in costs.items()}
        instrument.testing.reset()
    return costs


def _in_turns(
    candidates: dict[str, Callable[[], Any]],
    rounds: int = 15,
    number: int = 20_000,
    between: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Per-call nanoseconds of each candidate: best of ``rounds`` turns, every candidate once per turn."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(rounds):
        for name, fn in candidates.items():
            if between is not None:
                between()
            best[name] = min(best[name], timeit.timeit(fn, number=number) / number * 1e9)
    return best


def _window_loop_body() -> None:
    with ins.profile_window(mini_batch=3):
        pass


def _empty_loop_body() -> None:
    pass


def profiled_range_cost() -> dict[str, float]:
    """Per-stage nanoseconds inside a profiled (continuous-mode) step, profiler running.

    Every call adds an event to the open trace, and a growing trace makes later calls dearer: the
    candidates are measured in turns (round robin, best of each), never one block after another.
    """
    enter, leave = (
        torch._C._autograd._record_function_with_args_enter,
        torch._C._autograd._record_function_with_args_exit,
    )

    @functools.wraps(target)
    def floor_closure(*args: Any, **kwargs: Any) -> Any:  # the floor: a closure around the same range
        handle = enter("stage", ())
        try:
            return target(*args, **kwargs)
        finally:
            leave(handle)

    def fast() -> None:
        leave(enter("x", ()))

    with tempfile.TemporaryDirectory() as save:
        cfg = ins.ProfilerConfig(save_path=save, contents=("cpu",), steps=(1,), discrete=False)
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        staged = ins.profiled_stage("stage")(target)
        candidates: dict[str, Callable[[], Any]] = {
            "bare": lambda: target(1),
            "@profiled_stage (profiled step)": lambda: staged(1),
            "user-annotation range alone": fast,
            "closure around the same range": lambda: floor_closure(1),
        }
        with ins.profile_step(1):
            assert STATE.recording
            best = _in_turns(candidates, rounds=9, number=3_000)
        instrument.testing.reset()
    bare = best.pop("bare")
    return {name: ns - (0 if name == "user-annotation range alone" else bare) for name, ns in best.items()}


def annotation_range_costs() -> dict[str, float]:
    """Per-range nanoseconds, profiler running (continuous step): the stage's user-annotation range
    against the other ways torch writes a range; in turns, like :func:`profiled_range_cost`."""
    from torch._C._profiler import _RecordFunctionFast

    enter, leave = (
        torch._C._autograd._record_function_with_args_enter,
        torch._C._autograd._record_function_with_args_exit,
    )
    ops_enter = torch.ops.profiler._record_function_enter_new
    ops_exit = torch.ops.profiler._record_function_exit._RecordFunction

    @functools.wraps(target)
    def old_closure(*args: Any, **kwargs: Any) -> Any:  # what a stage cost before: a closure around this range
        with _RecordFunctionFast("stage"):
            return target(*args, **kwargs)

    def fast() -> None:
        with _RecordFunctionFast("x"):
            pass

    def record_function() -> None:
        with torch.profiler.record_function("x"):
            pass

    with tempfile.TemporaryDirectory() as save:
        cfg = ins.ProfilerConfig(save_path=save, contents=("cpu",), steps=(1,), discrete=False)
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        staged = ins.profiled_stage("stage")(target)
        candidates: dict[str, Callable[[], Any]] = {
            "bare": lambda: target(1),
            "@profiled_stage (user_annotation)": lambda: staged(1),
            "closure around _RecordFunctionFast": lambda: old_closure(1),
            "pair enter/exit alone (user_annotation)": lambda: leave(enter("x")),
            "_RecordFunctionFast alone (cpu_op)": fast,
            "ops _record_function_enter_new/exit": lambda: ops_exit(ops_enter("x", None)),
            "record_function (user_annotation)": record_function,
        }
        with ins.profile_step(1):
            assert STATE.recording
            best = _in_turns(candidates, rounds=9, number=3_000)
        instrument.testing.reset()
    bare = best.pop("bare")
    for name in ("@profiled_stage (user_annotation)", "closure around _RecordFunctionFast"):
        best[name] -= bare
    return best


def export_costs() -> dict[str, float]:
    """Seconds: training-thread time per saved window vs torch's gzip export of the same trace."""
    with tempfile.TemporaryDirectory() as save:
        schedule = ins.Schedule(active=4)
        cfg = ins.ProfilerConfig(save_path=save, contents=("cpu", "shapes"), steps=(1,), schedule=schedule)
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        handler_seconds: list[float] = []
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        @ins.profiled_stage("update_actor", scheduled=True)
        def update() -> float:
            saved_at = 0.0
            for i in range(4):
                with ins.profile_window(mini_batch=i):
                    for _ in range(20):
                        opt.zero_grad()
                        model(torch.randn(32, 64)).sum().backward()
                        opt.step()
                    start = time.perf_counter() if i == 3 else 0.0
                if i == 3:  # the window's exit stepped the profiler, which saved the window
                    saved_at = time.perf_counter() - start
            return saved_at

        with ins.profile_step(1):
            backend = STATE.session._backend  # a benchmark may reach inside to time the handler
            assert backend is not None
            handler = backend._on_trace_ready

            def timed_handler(profile: Any) -> None:
                start = time.perf_counter()
                handler(profile)
                handler_seconds.append(time.perf_counter() - start)

            backend._on_trace_ready = timed_handler
            training_thread = update()
        (path,) = [p for p in ins.finish() if p.endswith(TRACE_SUFFIX)]  # the step timeline's file beside it

        # The same work again under torch's own profiler, saved by its gzip export (one save per trace).
        runs = []
        for attempt in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            with prof:
                for _ in range(4):
                    for _ in range(20):
                        opt.zero_grad()
                        model(torch.randn(32, 64)).sum().backward()
                        opt.step()
            start = time.perf_counter()
            prof.export_chrome_trace(str(Path(save) / f"torch-{attempt}.json.gz"))
            runs.append(time.perf_counter() - start)
        instrument.testing.reset()
        return {
            "training-thread time per saved window": training_thread,
            "of which instrument's export": handler_seconds[0],
            "torch export_chrome_trace(.json.gz)": statistics.median(runs),
            "trace size (MB, gzip level 1)": os.path.getsize(path) / 1e6,
        }


def main() -> None:
    logging.getLogger("instrument").setLevel(logging.ERROR)
    off = unprofiled_costs()
    timeline = timeline_costs()
    on = profiled_range_cost()
    export = export_costs()
    annotation = annotation_range_costs()
    print("1. unprofiled step or rank (added ns per call)")
    for name, value in off.items():
        print(f"   {name:40s} {value:8.0f} ns")
    ratio = off["@profiled_stage (off)"] / off["functools.wraps closure"]
    print(f"   ratio @profiled_stage / functools.wraps closure = {ratio:.2f}   (goal <= 1.5)")
    window_ratio = off["profile_window (off)"] / off["functools.wraps closure"]
    print(f"   ratio profile_window (off) / functools.wraps closure = {window_ratio:.2f}   (goal <= 1.5)")
    print("1b. unprofiled step, step timeline on (the default; added ns per call)")
    for name, value in timeline.items():
        print(f"   {name:40s} {value:8.0f} ns")
    timeline_ratio = timeline["@profiled_stage (timeline on)"] / timeline["closure: 2 clock reads + list append"]
    print(f"   ratio @profiled_stage / closure with 2 clock reads + append = {timeline_ratio:.2f}   (goal <= 1.5)")
    print("2. profiled step (ns per stage)")
    for name, value in on.items():
        print(f"   {name:40s} {value:8.0f} ns")
    stage_ratio = on["@profiled_stage (profiled step)"] / on["closure around the same range"]
    print(f"   ratio @profiled_stage / closure around the same range = {stage_ratio:.2f}   (with the timeline's span)")
    print("3. saving a window (one 4-mini-batch window of a small MLP update)")
    ours, theirs = export["training-thread time per saved window"], export["torch export_chrome_trace(.json.gz)"]
    handler = export["of which instrument's export"]
    print(f"   training-thread time per saved window    {ours * 1e3:8.1f} ms  (kineto's stop + our export)")
    print(f"     of which instrument's export (JSON)    {handler * 1e3:8.1f} ms  (gzip runs in a background thread)")
    print(f"   torch export_chrome_trace('x.json.gz')   {theirs * 1e3:8.1f} ms  (export only, after stop)")
    print(f"   trace size                               {export['trace size (MB, gzip level 1)']:8.2f} MB gz")
    print(f"   ratio our export / torch gzip export = {handler / theirs:.3f}   (goal <= 0.2)")
    print(f"   ratio incl. kineto's stop            = {ours / theirs:.3f}   (stop is paid by any torch.profiler use)")
    print("4. a stage range as a user annotation (profiled continuous step; µs per range)")
    for name, value in annotation.items():
        print(f"   {name:40s} {value / 1e3:8.2f} µs")
    stage, before = annotation["@profiled_stage (user_annotation)"], annotation["closure around _RecordFunctionFast"]
    pair, fast = annotation["pair enter/exit alone (user_annotation)"], annotation["_RecordFunctionFast alone (cpu_op)"]
    print(f"   @profiled_stage per stage = {stage / 1e3:.2f} µs   (goal <= 10)")
    print(f"   ratio @profiled_stage / closure around _RecordFunctionFast (before) = {stage / before:.2f}")
    print(f"   ratio pair alone / _RecordFunctionFast alone = {pair / fast:.2f}")


if __name__ == "__main__":
    main()
