"""Cost of the schedule and naming math, side by side with torch's own schedule function.

The session asks ``action_at`` once per mini-batch on profiled steps and builds one name per
trace; both must stay negligible next to a mini-batch. Run: ``.venv/bin/python benchmarks/schedule.py``.
"""

from __future__ import annotations

import timeit
import warnings

from instrument.config import Schedule
from instrument.naming import trace_basename
from instrument.schedule import action_at, plan


def _per_call_ns(stmt: str, namespace: dict[str, object], number: int = 200_000) -> float:
    best = min(timeit.repeat(stmt, globals=namespace, number=number, repeat=5))
    return best / number * 1e9


def main() -> None:
    import torch.profiler

    schedule = Schedule(skip_first=3, wait=1, warmup=1, active=2, repeat=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_fn = torch.profiler.schedule(skip_first=3, wait=1, warmup=1, active=2, repeat=0)
    namespace: dict[str, object] = {
        "action_at": action_at,
        "plan": plan,
        "s": schedule,
        "torch_fn": torch_fn,
        "trace_basename": trace_basename,
    }
    ours = _per_call_ns("action_at(1234, s)", namespace)
    theirs = _per_call_ns("torch_fn(1234)", namespace)
    planned = _per_call_ns("plan(64, s)", namespace, number=20_000)
    named = _per_call_ns(
        "trace_basename(role='actor', stage='update_actor', step=3, rank=2, world_size=8, window=(2, 3))",
        namespace,
        number=50_000,
    )
    print(f"action_at             {ours:8.0f} ns/call")
    print(f"torch.profiler.schedule {theirs:6.0f} ns/call   ratio ours/torch = {ours / theirs:.2f}")
    print(f"plan(64 mini-batches) {planned:8.0f} ns/call")
    print(f"trace_basename        {named:8.0f} ns/call")


if __name__ == "__main__":
    main()
