"""Steps and stages found inside a trace, and what each of them measures.

A plain ``torch.profiler`` trace of an RL loop is one continuous file per rank: ``prof.step()``
leaves a ``ProfilerStep#N`` range per step and ``record_function`` leaves a user annotation per
stage. :func:`pick_stages` turns them into (step, stage) ranges:

- steps: the ``ProfilerStep#N`` ranges (step ``N``); without any, the whole file is one step;
- stages: the user annotations (categories ``user_annotation`` / ``gpu_user_annotation``) on the
  thread that holds most of them, the outermost ones only (a range inside another is the user's own
  detail, not a stage), each given to the step its start falls in. ``--stage NAME`` picks the names
  instead (wherever they nest).

The scanner then gives each (step, stage) its numbers, with the time its CPU side was blocked in a
collective taken apart (:func:`blocked`): a rank that waits in a barrier for a slow peer is not slow
itself, its *work* is the time outside that wait. GPU communication kernels are never taken apart:
NCCL runs them asynchronously beside CPU work, so they say nothing about the rank waiting.
"""

from __future__ import annotations

import bisect
import operator
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

__all__ = [
    "COLLECTIVE",
    "EXECUTE",
    "Marker",
    "Picked",
    "Ranges",
    "Segment",
    "blocked",
    "length",
    "overlap",
    "pick_stages",
    "step_tokens",
    "union",
]

COLLECTIVE = re.compile(r"c10d::|nccl|gloo:|mpi:|ucc:|record_param_comms")
"""Host event names (matched at the start) of a collective: the call (``c10d::allreduce_``, its
``record_param_comms`` and ``nccl:all_reduce`` inside) and gloo's worker-thread range (``gloo:all_reduce``)."""
EXECUTE = re.compile(
    r"execute_(?:\d+_)?context_\d+\(|(?:.*\): )?(?:execute_model|run_batch|forward_batch_generation)\Z"
)
"""Ranges of an inference engine's work, one per iteration, as seen in real traces: vLLM's worker annotates
each step ``execute_context_{n}({tokens})_generation_{m}({tokens})`` (``execute_{tokens}_context_…(sq{t}…)``
with ``detailed_trace_annotation``); with Python stacks, ``path(line): execute_model`` (vLLM's worker) and
``run_batch`` / ``forward_batch_generation`` (SGLang's scheduler and worker, which annotate nothing)."""

_STEP_TOKENS = re.compile(r"execute_(?:(\d+)_)?context_\d+\((?:sq)?(\d+)[^)]*\)_generation_\d+\((?:sq)?(\d+)")


def step_tokens(name: str) -> int | None:
    """Tokens a vLLM step scheduled (prefill + decode), read from its annotation; ``None``: not said."""
    match = _STEP_TOKENS.match(name)
    if match is None:
        return None
    if match[1] is not None:
        return int(match[1])
    return int(match[2]) + int(match[3])


Marker = tuple[str, float, float, Any, Any, str]
"""A candidate stage range: name, start, end, pid, tid, category."""
Collective = tuple[float, float, Any, Any, str]
"""A host collective range: start, end, pid, tid, name."""


@dataclass
class Segment:
    """One stage's numbers from one file (times in microseconds, as chrome traces count them)."""

    stage: str
    wall_us: float
    basis: str  # what wall_us measures: "stage" range, "mini_batches" union, whole trace "span", or "step"
    minibatch_us: float = 0.0
    mini_batches: int = 0
    cpu_us: float = 0.0
    kernel_us: float = 0.0
    kernels: int = 0
    events: int = 0
    step: int | None = None
    """The ``ProfilerStep`` the stage lies in; ``None``: the file's own step."""
    comm_us: float = 0.0
    """Time the CPU side was blocked in collectives within the stage (:func:`blocked`)."""
    work_us: float | None = None
    """What the rank is judged by: wall minus :attr:`comm_us`; an engine's execution time. ``None``: wall."""
    iterations: int = 0
    """Engine iterations (execution ranges) in an engine trace; a vLLM step that scheduled no token is none."""
    tokens: int = 0
    """Tokens the engine's iterations scheduled (prefill + decode), where its range names say (vLLM)."""


@dataclass
class Picked:
    """One stage of one step: its disjoint, sorted ranges."""

    step: int | None
    name: str
    starts: list[float]
    ends: list[float]


@dataclass
class Ranges:
    """Start/end pairs kept while streaming."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))

    def add(self, start: float, end: float) -> None:
        """Keep one range."""
        self.starts.append(start)
        self.ends.append(end)

    def merged(self) -> tuple[list[float], list[float]]:
        """The union as sorted, disjoint intervals (starts, ends)."""
        starts, ends = self.starts, self.ends
        if not starts:
            return [], []
        if not all(map(operator.le, starts, islice(starts, 1, None))):
            return self._merged_apart()
        pairs = zip(starts, ends, strict=True)
        cur_s, cur_e = next(pairs)
        out_s: list[float] = []
        out_e: list[float] = []
        for s, e in pairs:
            if s > cur_e:
                out_s.append(cur_s)
                out_e.append(cur_e)
                cur_s, cur_e = s, e
            elif e > cur_e:
                cur_e = e
        out_s.append(cur_s)
        out_e.append(cur_e)
        return out_s, out_e

    def _merged_apart(self) -> tuple[list[float], list[float]]:
        # Unsorted starts (rare; hostile files): sorted apart, 8 bytes a value where (start, end) tuples
        # take ~56. With both sorted, the union has a gap after ends[k] exactly when starts[k+1] > ends[k].
        self.starts = starts = array("d", sorted(self.starts))
        self.ends = ends = array("d", sorted(self.ends))
        cuts = [k for k, (s, e) in enumerate(zip(islice(starts, 1, None), ends, strict=False)) if s > e]
        return [starts[0], *(starts[k + 1] for k in cuts)], [*(ends[k] for k in cuts), ends[-1]]


def length(starts: Sequence[float], ends: Sequence[float]) -> float:
    """Total length of disjoint intervals."""
    # Differences first: timestamps are ~1e12 us, and summing them would lose the microseconds.
    return float(sum(map(operator.sub, ends, starts)))


def overlap(starts: Sequence[float], ends: Sequence[float], lo: float, hi: float) -> float:
    """Length of the disjoint sorted intervals inside ``[lo, hi]``."""
    total = 0.0
    i = bisect.bisect_right(ends, lo)
    while i < len(starts) and starts[i] < hi:
        total += max(0.0, min(ends[i], hi) - max(starts[i], lo))
        i += 1
    return total


def union(pairs: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The union of ``(start, end)`` pairs as disjoint sorted intervals."""
    ranges = Ranges()
    for start, end in sorted(pairs):
        ranges.add(start, end)
    return ranges.merged()


def pick_stages(
    markers: list[Marker],
    steps: list[tuple[int, float, float]],
    wanted: frozenset[str] | None = None,
    key: Any = str,
) -> tuple[list[Picked], list[Marker]]:
    """The (step, stage) ranges of a file, and the markers left over (the user's inner ranges).

    ``steps``: ``(N, start, end)`` of each ``ProfilerStep#N``; empty: the file is one step (``None``).
    ``wanted``: stage names (compared through ``key``) to pick instead of the outermost annotations.
    """
    chosen = [m for m in markers if key(m[0]) in wanted] if wanted is not None else markers
    if not chosen:
        return [], markers
    # The thread that holds most candidates; a CPU thread before a GPU stream with as many
    counts: dict[tuple[Any, Any], list[int]] = {}
    for m in chosen:
        counts.setdefault((m[3], m[4]), [0, 0])[0] += 1
        if m[5] != "gpu_user_annotation":
            counts[(m[3], m[4])][1] = 1
    thread = max(counts, key=lambda t: (counts[t][0], counts[t][1]))
    on_thread = sorted((m for m in chosen if (m[3], m[4]) == thread), key=lambda m: (m[1], -m[2]))
    bounds = sorted(steps, key=lambda s: s[1])
    starts = [s[1] for s in bounds]
    by_stage: dict[tuple[int | None, str], Ranges] = {}
    taken: set[int] = set()
    outer_end = float("-inf")
    for m in on_thread:
        name, start, end = m[0], m[1], m[2]
        if start < outer_end and end <= outer_end:
            continue  # inside an outer one: the user's own detail
        outer_end = max(outer_end, end)
        step: int | None = None
        if bounds:
            i = bisect.bisect_right(starts, start) - 1
            if i < 0 or start >= bounds[i][2]:
                continue  # between steps: no step's stage
            step = bounds[i][0]
        by_stage.setdefault((step, name), Ranges()).add(start, end)
        taken.add(id(m))
    picked = [Picked(step, name, *ranges.merged()) for (step, name), ranges in by_stage.items()]
    rest = [m for m in markers if id(m) not in taken]
    return picked, rest


def blocked(collectives: list[Collective], ops: dict[tuple[Any, Any], Ranges]) -> tuple[list[float], list[float]]:
    """When the CPU side was blocked in a collective, as disjoint sorted intervals.

    ``ops``: each thread's ``cpu_op`` ranges. A collective on a thread with no ``cpu_op`` is a worker
    thread's range (gloo runs the collective there: ``gloo:all_reduce``); any other is a call. Each
    call, outermost per thread, is blocked from its start until the next op of its thread starts, but
    no longer than the later of its own end and the end of its worker range: the first worker range
    not taken yet that starts at or after the call (gloo's workers take the calls in order). So a wait
    that goes on on the worker thread after the call returned is waiting, however late the worker
    started, and an asynchronous call followed by more work blocks only as long as the call itself.
    NCCL calls (``nccl:`` inside) take no worker range: their GPU kernels run beside the CPU's work.
    """
    calls: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    nccl: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    workers: list[float] = []
    worker_ends: list[float] = []
    for start, end, pid, tid, name in collectives:
        key = (pid, tid)
        if key not in ops:
            workers.append(start)
            worker_ends.append(end)
        else:
            calls.setdefault(key, []).append((start, end))
            if name.startswith("nccl"):
                nccl.setdefault(key, []).append((start, end))
    order = sorted(range(len(workers)), key=workers.__getitem__)
    worker_starts = [workers[i] for i in order]
    worker_ends = [worker_ends[i] for i in order]
    outermost: list[tuple[float, float, tuple[Any, Any], bool]] = []
    for key, pairs in calls.items():
        nccl_starts = sorted(start for start, _ in nccl.get(key, ()))
        for start, end in zip(*union(pairs), strict=True):
            inner = bisect.bisect_left(nccl_starts, start)
            outermost.append((start, end, key, inner < len(nccl_starts) and nccl_starts[inner] <= end))
    outermost.sort()
    op_starts: dict[tuple[Any, Any], list[float]] = {}
    taken = 0  # gloo's queue is first in, first out: workers[taken:] are not matched yet
    spans: list[tuple[float, float]] = []
    for start, end, key, is_nccl in outermost:
        reach = end
        if not is_nccl:
            taken = bisect.bisect_left(worker_starts, start, lo=taken)
            if taken < len(worker_starts):
                reach = max(end, worker_ends[taken])
                taken += 1
        if reach > end:
            starts = op_starts.get(key)
            if starts is None:
                starts = op_starts[key] = sorted(ops[key].starts)
            after = bisect.bisect_left(starts, end)
            if after < len(starts):
                reach = max(end, min(reach, starts[after]))
        spans.append((start, reach))
    return union(spans)
