"""One pass over a file's events: the ranges and counters its numbers need (:class:`Scanner`).

Per file it keeps counters, the few stage, step, mini-batch, collective and execution ranges, and the
start and end of every ``cpu_op`` event (16 bytes each, to take their union per thread); where stages
are ranges inside the file, also the start of every event and kernel. Memory follows the file read.
Time blocked in collectives is the CPU side's only (:func:`~._steps.blocked`), never GPU kernels'.

Duration events are complete events (``ph: X``) and ``B`` / ``E`` pairs, matched per thread (an ``E``
closes the latest open ``B`` of its thread) into one range; instant, counter, flow and metadata events
are passed over. A file in which no stage or step is recognised says why in :attr:`Scanner.notes`.
"""

from __future__ import annotations

import bisect
import operator
import re
from array import array
from collections.abc import Iterable
from typing import Any

from instrument.analyze.model import label_key
from instrument.analyze.traces._gpu import GpuAccumulator, is_profiler_step
from instrument.analyze.traces._steps import (
    COLLECTIVE,
    EXECUTE,
    Collective,
    Marker,
    Picked,
    Ranges,
    Segment,
    blocked,
    length,
    overlap,
    pick_stages,
    step_tokens,
    union,
)

__all__ = ["Scanner"]


_HOST_CATS = frozenset({"cpu_op", "user_annotation"})  # where the SDK's stage and mini-batch ranges live
_MINI_BATCH = re.compile(r"mini_batch(\d+)\Z")
# A name that can be a stage range in a continuous trace: a label, not an op ("aten::mm") or a
# profiler row ("ProfilerStep#3", "Optimizer.step#Adam.step").
_STAGE_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_.=+-]*\Z")
_GPU_OTHER = frozenset({"gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"})  # GPU work and launches
MAX_US = (1 << 62) / 1000
"""Most µs an event's start or end may be from 0: what a signed 64-bit ns column holds (~146 years). An
event past it, or whose ``ts`` or ``dur`` is not finite (``NaN``, ``Infinity``: Python's json writes them),
has a time no clock could give: it is left out, counted in a note (never a traceback where it is made an
integer or a bound)."""


class Scanner:
    """Takes events one at a time; :meth:`finish` turns them into segments.

    ``inside``: steps and stages are found inside the file (:mod:`._steps`); ``engine``: an inference
    engine's trace, judged by its execution ranges; ``wanted``: ``--stage`` names (label keys).
    """

    def __init__(
        self,
        stage: str,
        continuous: bool,
        *,
        inside: bool = False,
        engine: bool = False,
        wanted: frozenset[str] | None = None,
    ) -> None:
        self.stage_key = label_key(stage)
        self.stage = stage
        self.continuous = continuous
        self.inside = inside
        self.engine = engine
        self.wanted = wanted
        self.kinds: dict[str, int] = {}
        self.cpu: dict[tuple[Any, Any], Ranges] = {}
        self.markers: list[Marker] = []
        self.mini: list[tuple[float, float]] = []
        self.steps: list[tuple[int, float, float]] = []  # ProfilerStep#N: (N, start, end)
        self.comm: list[Collective] = []  # host collective ranges: calls and gloo's worker-thread ranges
        self.execs: list[tuple[float, float, int]] = []  # an engine's execution ranges: start, end, tokens (-1: unsaid)
        self.exec_tokens: dict[str, int] = {}  # tokens by range name (vLLM repeats a few names many times)
        self.kernel_us = 0.0
        self.kernels = 0
        self.events = 0
        self.unplaced = 0  # events left out: a time no clock could give (MAX_US)
        self.first = float("inf")
        self.last = float("-inf")
        # continuous / inside / engine only: where every event and kernel falls
        self.event_ts = array("d")
        self.kernel_ts = array("d")
        self.kernel_dur = array("d")
        self.gpu = GpuAccumulator()
        self.open: dict[tuple[Any, Any], list[dict[str, Any]]] = {}  # B events not closed yet, per thread
        self.categories = 0  # duration events with a category
        self.notes: list[str] = []
        # where each stage the segments measure lies: (name, step or None: the file's own, start, end)
        self.stage_ranges: list[tuple[str, int | None, float, float]] = []
        self.blocked: tuple[list[float], list[float]] = ([], [])  # when the CPU waited in a collective (µs)

    def _kind(self, name: str) -> int:
        """0: an ordinary event, 1: a mini-batch range, 2: a stage range (or, found inside, a candidate),
        3: a ``ProfilerStep#N`` range, 4: a collective, 5: an engine's execution range (else ordinary)."""
        if is_profiler_step(name) is not None:
            kind = 3
        elif _MINI_BATCH.match(name):
            kind = 1
        elif COLLECTIVE.match(name):
            kind = 4
        elif self.engine:
            kind = 5 if EXECUTE.match(name) else 0
        elif self.inside:
            kind = 2  # any annotation (the caller checks the category)
        elif self.continuous:
            kind = 2 if _STAGE_LIKE.match(name) else 0
        else:
            kind = 2 if name == self.stage or label_key(name) == self.stage_key else 0
        self.kinds[name] = kind
        return kind

    def feed(self, events: Iterable[Any]) -> None:  # noqa: PLR0915 - one hot loop, inline for speed
        """Take the file's events (dicts), in the order the file holds them."""
        kinds = self.kinds
        cpu = self.cpu
        inside = self.inside
        placed = self.continuous or inside or self.engine
        event_ts = self.event_ts
        count = 0
        first, last = self.first, self.last
        kernel_us, kernels = self.kernel_us, self.kernels
        categories = self.categories
        low, high, unplaced = -MAX_US, MAX_US, 0
        for ev in events:
            ph = ev.get("ph")
            if ph != "X":
                if ph not in ("B", "E"):
                    continue
                ev = self._paired(ev, ph)  # noqa: PLW2901 - an E closing a B stands for the whole range
                if ev is None:
                    continue
            ts = ev.get("ts")
            if ts is None:
                count += 1
                continue
            end = ts + (ev.get("dur") or 0)
            if not (low < ts < high and low < end < high):  # False for NaN too
                unplaced += 1
                continue
            count += 1
            if ts < first:  # noqa: PLR1730 - a comparison is cheaper than a call to min() here
                first = ts
            if end > last:  # noqa: PLR1730
                last = end
            if placed:
                event_ts.append(ts)
            cat = ev.get("cat")
            if cat is not None:
                categories += 1
            if cat in _HOST_CATS:
                name = ev.get("name")
                kind = kinds.get(name)
                if kind is None:
                    kind = self._kind(str(name))
                if kind == 1:
                    self.mini.append((ts, end))
                    continue
                if kind == 2 and not (inside and cat == "cpu_op"):  # found inside: annotations only
                    self.markers.append((str(name), ts, end, ev.get("pid"), ev.get("tid"), cat))
                    continue
                if kind == 3:
                    self.gpu.add_step(is_profiler_step(str(name)) or 0, ts, end)
                    self.steps.append((is_profiler_step(str(name)) or 0, ts, end))
                elif kind == 4:
                    self.comm.append((ts, end, ev.get("pid"), ev.get("tid"), str(name)))
                elif kind == 5:
                    self._execution(str(name), ts, end)
                if cat == "cpu_op":
                    key = (ev.get("pid"), ev.get("tid"))
                    ranges = cpu.get(key)
                    if ranges is None:
                        ranges = cpu[key] = Ranges()
                    ranges.starts.append(ts)
                    ranges.ends.append(end)
            elif cat == "kernel":
                kernels += 1
                kernel_us += end - ts
                if placed:
                    self.kernel_ts.append(ts)
                    self.kernel_dur.append(end - ts)
                self.gpu.add(ev, cat, ts, end)
            elif cat == "gpu_user_annotation" and inside:
                name = ev.get("name")
                if kinds.get(name, None) == 2 or (name not in kinds and self._kind(str(name)) == 2):
                    self.markers.append((str(name), ts, end, ev.get("pid"), ev.get("tid"), cat))
            elif cat in _GPU_OTHER:
                self.gpu.add(ev, cat, ts, end)
            elif cat == "python_function" and self.engine:  # with stacks: SGLang's batches, vLLM's execute_model
                name = ev.get("name")
                kind = kinds.get(name)
                if kind is None:
                    kind = self._kind(str(name))
                if kind == 5:
                    self._execution(str(name), ts, end)
        self.events += count
        self.unplaced += unplaced
        self.categories = categories
        self.first, self.last = first, last
        self.kernel_us, self.kernels = kernel_us, kernels

    def _paired(self, ev: dict[str, Any], ph: str) -> dict[str, Any] | None:
        """For an ``E``, the range it closes as a complete event (its ``args`` added); ``None`` otherwise."""
        key = (ev.get("pid"), ev.get("tid"))
        if ph == "B":
            self.open.setdefault(key, []).append(ev)
            return None
        stack = self.open.get(key)
        if not stack:
            return None  # an end without a beginning: nothing to measure
        begin = stack.pop()
        start, stop = begin.get("ts"), ev.get("ts")
        if not isinstance(start, int | float) or not isinstance(stop, int | float) or stop < start:
            return None
        done = {**begin, "ph": "X", "dur": stop - start}
        args, more = begin.get("args"), ev.get("args")
        if isinstance(more, dict) and more:
            done["args"] = {**args, **more} if isinstance(args, dict) else more
        return done

    def finish(self) -> list[Segment]:
        """The file's segments: one per stage (and step) it holds, with their numbers."""
        if self.unplaced:
            self.notes.append(
                f"{self.unplaced:,} event(s) left out: a ts or dur not finite or past {MAX_US:.3g} µs "
                "(no clock gives such a time)"
            )
        if not self.events:
            self.notes.append("no duration events (complete X events or B/E pairs): nothing to measure")
            return []
        if self.continuous or self.inside:
            picked, rest = pick_stages(self.markers, self.steps if self.inside else [], self.wanted, label_key)
            for _, start, end, pid, tid, cat in rest:  # the user's own ranges inside a stage: ordinary again
                if cat == "cpu_op":
                    self.cpu.setdefault((pid, tid), Ranges()).add(start, end)
            self.markers = []
            self.stage_ranges = [
                (p.name, p.step, lo, hi) for p in picked for lo, hi in zip(p.starts, p.ends, strict=True)
            ]
            if not picked and self.inside:
                # no annotation: each ProfilerStep whole, or (neither) the whole trace as one row
                picked = [Picked(n, self.stage, [lo], [hi]) for n, lo, hi in sorted(self.steps)]
                if not picked:
                    if self.wanted is None:
                        self._note("no ProfilerStep#N range and no user annotation (record_function)")
                    return [self._discrete()]
                return self._measure(picked, basis="step")
            if not picked and self.wanted is None:
                self.notes.append("no stage range (a label-like cpu_op or user_annotation) in a continuous trace")
            return self._measure(picked, basis="stage")
        segment = self._discrete()
        if segment.basis == "span" and not self.engine:
            self._note(f"no range named {self.stage!r} (the stage) and no mini_batch ranges")
        return [segment]

    def _note(self, missing: str) -> None:
        why = "its events have no category (cat)" if not self.categories else missing
        self.notes.append(f"{why}: read as one range, first event to last")

    def _discrete(self) -> Segment:
        stage_ranges = Ranges()
        for _, start, end, *_ in self.markers:
            stage_ranges.add(start, end)
        if stage_ranges.starts:
            (starts, ends), basis = stage_ranges.merged(), "stage"
        elif self.mini:
            (starts, ends), basis = union(self.mini), "mini_batches"
        else:
            starts, ends = ([self.first], [self.last]) if self.events else ([], [])
            basis = "span"
        if basis != "span":  # no range at all is no stage range; a window's mini-batches: one, first to last
            pairs = list(zip(starts, ends, strict=True)) if basis == "stage" else [(starts[0], ends[-1])]
            self.stage_ranges = [(self.stage, None, lo, hi) for lo, hi in pairs]
        cpu_us = 0.0
        for ranges in self.cpu.values():
            cpu_us += length(*ranges.merged())
        wall = length(starts, ends)
        comm = self.blocked = blocked(self.comm, self.cpu)
        comm_us = sum(overlap(*comm, lo, hi) for lo, hi in zip(starts, ends, strict=True))
        work_us: float | None = wall - comm_us if comm_us else None
        iterations = tokens = 0
        if self.engine and basis == "span":
            work_us, iterations, tokens = self._engine_work(cpu_us)
        return Segment(
            stage=self.stage,
            wall_us=wall,
            basis=basis,
            minibatch_us=sum(end - start for start, end in self.mini),
            mini_batches=len(self.mini),
            cpu_us=cpu_us,
            kernel_us=self.kernel_us,
            kernels=self.kernels,
            events=self.events,
            comm_us=comm_us,
            work_us=work_us,
            iterations=iterations,
            tokens=tokens,
        )

    def _execution(self, name: str, start: float, end: float) -> None:
        tokens = self.exec_tokens.get(name)
        if tokens is None:
            said = step_tokens(name)
            tokens = self.exec_tokens[name] = -1 if said is None else said
        self.execs.append((start, end, tokens))

    def _engine_work(self, cpu_us: float) -> tuple[float, int, int]:
        """An engine's work, not its profiling window: the union of its execution ranges (and how many
        outermost ones: iterations; the tokens their names say), else of its kernels, else of its cpu
        ops on every thread. A replica that ran nothing has none of them: its work is 0, it is idle."""
        if self.execs:
            # vLLM's step annotations, when there are any, say the most (a Python execute_model around each
            # one adds nothing); a step that scheduled no token skips the model (its range is ~0.3 ms of
            # bookkeeping): not an iteration, not work, so an engine that only did such steps is idle.
            said = [r for r in self.execs if r[2] >= 0]
            ran = [(s, e) for s, e, tokens in said or self.execs if tokens != 0]
            outermost = 0
            reach = float("-inf")
            for start, end in sorted(ran, key=lambda r: (r[0], -r[1])):
                if start >= reach:
                    outermost += 1
                reach = max(reach, end)
            tokens_said = sum(tokens for _, _, tokens in said)  # vLLM's step ranges never nest
            return length(*union(ran)), outermost, tokens_said
        if self.kernel_ts:
            kernel_ends = map(operator.add, self.kernel_ts, self.kernel_dur)
            return length(*union(zip(self.kernel_ts, kernel_ends, strict=True))), 0, 0
        if not cpu_us:
            return 0.0, 0, 0
        everywhere: list[tuple[float, float]] = []
        for ranges in self.cpu.values():
            everywhere.extend(zip(*ranges.merged(), strict=True))
        return length(*union(everywhere)), 0, 0

    def _measure(self, picked: list[Picked], basis: str) -> list[Segment]:
        cpu_merged = [ranges.merged() for ranges in self.cpu.values()]
        comm = self.blocked = blocked(self.comm, self.cpu)
        event_ts = sorted(self.event_ts)
        kernel_order = sorted(range(len(self.kernel_ts)), key=self.kernel_ts.__getitem__)
        kernel_ts = [self.kernel_ts[i] for i in kernel_order]
        kernel_cum = [0.0]
        for i in kernel_order:
            kernel_cum.append(kernel_cum[-1] + self.kernel_dur[i])
        segments = []
        for stage in picked:
            seg = Segment(stage=stage.name, wall_us=length(stage.starts, stage.ends), basis=basis, step=stage.step)
            for lo, hi in zip(stage.starts, stage.ends, strict=True):
                for mini_start, mini_end in self.mini:
                    if lo <= mini_start and mini_end <= hi:
                        seg.minibatch_us += mini_end - mini_start
                        seg.mini_batches += 1
                seg.cpu_us += sum(overlap(s, e, lo, hi) for s, e in cpu_merged)
                seg.comm_us += overlap(*comm, lo, hi)
                a, b = bisect.bisect_left(kernel_ts, lo), bisect.bisect_right(kernel_ts, hi)
                seg.kernels += b - a
                seg.kernel_us += kernel_cum[b] - kernel_cum[a]
                seg.events += bisect.bisect_right(event_ts, hi) - bisect.bisect_left(event_ts, lo)
            if seg.comm_us:
                seg.work_us = seg.wall_us - seg.comm_us
            segments.append(seg)
        return segments
