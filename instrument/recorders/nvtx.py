"""The NVTX / Nsight Systems backend: named ranges for stages and mini-batches, and capture ranges.

Ranges go through the ``nvtx`` package into one domain, ``instrument``, with a category per
role, a stable colour per stage and the RL step as payload. Capture ranges
(``cudaProfilerStart/Stop``) open and close only around what is profiled — each stage (or
each recorded window of a scheduled stage) in discrete mode, each step in continuous mode —
so ``nsys profile --capture-range=cudaProfilerApi`` records only those
(:mod:`instrument.integrations.nsys` builds the options and brings the report home).

Loaded only when a session uses ``tool="nvtx"``; imports ``nvtx``, never torch (it uses torch's
CUDA profiler calls only when torch is already imported).
"""

from __future__ import annotations

import logging
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

import nvtx  # type: ignore[import-untyped]

from instrument import naming
from instrument.recorders import FastRange, FastScope, Publish, Report, TraceSpec
from instrument.schedule import Action, action_at

__all__ = ["CUDA_PROFILER", "DOMAIN", "NvtxBackend", "stage_color"]

logger = logging.getLogger(__name__)

DOMAIN = "instrument"
"""The NVTX domain every range of this package goes into."""

# Distinct, readable ARGB colours; a stage keeps its colour across runs and processes.
_PALETTE = (
    0xFF4E79A7,
    0xFFF28E2B,
    0xFFE15759,
    0xFF76B7B2,
    0xFF59A14F,
    0xFFEDC948,
    0xFFB07AA1,
    0xFFFF9DA7,
    0xFF9C755F,
    0xFFBAB0AC,
)
_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)
_STEP_RANGE = "\x00step"  # the outer range of a continuous-mode step: its message is just "step{S}"


def stage_color(stage: str) -> int:
    """The ARGB colour of a stage: the same in every process and run."""
    return _PALETTE[zlib.crc32(stage.encode()) % len(_PALETTE)]


class _CudaProfiler:
    """``cudaProfilerStart/Stop`` through torch when CUDA is there; a one-time notice otherwise.

    Until torch is imported, each call looks again. Once it is, the answer is final for the
    process, and ``start``/``stop`` become torch's calls or C no-ops: the discrete fast path
    calls them on every stage.
    """

    def __init__(self) -> None:
        self._noticed = False
        self._final = False  # torch was imported and asked: its answer does not change in a process
        self._cuda: Any = None  # torch.cuda.profiler, when there is CUDA

    def _resolve(self) -> Any:
        if not self._final and (torch := sys.modules.get("torch")) is not None:
            self._final = True
            self._cuda = torch.cuda.profiler if torch.cuda.is_available() else None
            self.start = _NOTHING if self._cuda is None else self._cuda.start  # type: ignore[method-assign,assignment]
            self.stop = _NOTHING if self._cuda is None else self._cuda.stop  # type: ignore[method-assign,assignment]
        if self._cuda is None and not self._noticed:
            self._noticed = True
            logger.info(
                "instrument: no CUDA in this process: NVTX ranges are emitted, capture ranges "
                "(cudaProfilerStart/Stop) are not"
            )
        return self._cuda

    def present(self) -> bool:
        """Whether capture ranges reach CUDA in this process (torch imported, CUDA available)."""
        return self._resolve() is not None

    def start(self) -> None:
        """Open a capture range."""
        cuda = self._resolve()
        if cuda is not None:
            cuda.start()

    def stop(self) -> None:
        """Close the capture range."""
        cuda = self._resolve()
        if cuda is not None:
            cuda.stop()


_NOTHING = "".format  # a C callable that takes no arguments and does nothing that matters


CUDA_PROFILER: Any = _CudaProfiler()
"""The capture-range seam: an object with ``start()`` and ``stop()``."""


class NvtxBackend:
    """NVTX ranges in the ``instrument`` domain and capture ranges around what is profiled."""

    tool = "nvtx"
    stage_range_in_windows = True  # NVTX ranges do not depend on the capture range being open

    def __init__(self, publish: Publish, report: Report) -> None:
        self._report = report  # nsys writes the report, not this process: nothing is published here
        self._domain = nvtx.get_domain(DOMAIN)
        self._attributes: dict[tuple[str, int], Any] = {}
        self._role = "worker"
        self._step = 0
        self._spec: TraceSpec | None = None
        self._capturing = False
        # Capture ranges are process-wide; the lock orders their start/stop between the session's
        # stages and the discrete fast path's holders (decorated calls on any thread).
        self._lock = threading.Lock()
        self._holders = 0
        self._close_outer: Callable[[], None] | None = None
        self._mini_batches = 0
        self.windows_saved = 0

    # ------------------------------------------------------------------ ranges

    def on_step(self, role: str, step: int) -> None:
        """A profiled step begins: its number goes into every range's message and payload."""
        self._role, self._step = role, step

    def _attributes_for(self, name: str) -> Any:
        key = (name, self._step)
        if key in self._attributes:  # a dict hit, not a None test: without a tool attributes are None
            return self._attributes[key]
        attributes = self._domain.get_event_attributes(
            message=f"step{self._step}" if name == _STEP_RANGE else f"{name} step{self._step}",
            color=stage_color(name.rstrip("0123456789")),  # every mini_batch{i} shares a colour
            category=self._role,
            payload=self._step,
        )
        if len(self._attributes) > 4096:  # a long run: old steps' attributes are not needed again
            self._attributes.clear()
        self._attributes[key] = attributes
        return attributes

    def fast_ranges(self, *, discrete: bool) -> FastScope:
        """Both modes, on any thread: push/pop belong to the calling thread and to no trace."""
        return "any thread"

    def fast_range(self, name: str, *, discrete: bool) -> FastRange:
        """Continuous: push, its attributes, pop. Discrete: the stage's capture range too (:meth:`_fast_stage`)."""
        if discrete:
            return self._fast_stage(name)
        return (self._domain.push_range, self._attributes_for(name), self._domain.pop_range)

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a range ``"{name} step{S}"``; push/pop, or start/end when ``concurrent`` (coroutines)."""
        attributes = self._attributes_for(name)
        domain = self._domain
        if concurrent:
            range_id = domain.start_range(attributes)
            return lambda: domain.end_range(range_id)
        domain.push_range(attributes)
        return domain.pop_range  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ capture ranges

    @property
    def tracing(self) -> bool:
        """Whether a stage or step is open in this backend (through the session or the fast path)."""
        return self._spec is not None or self._holders > 0

    def _fast_stage(self, name: str) -> FastRange:
        """What a decorated call opens by itself on a discrete step: its capture range and range, and their close.

        The first holder opens the capture range and the last closes it, unless a stage the session
        opened (a scheduled one, a ``with`` block) holds it: then it is that stage's to close.
        Without CUDA a capture range is nothing, and a range is all there is to open.
        """
        attributes = self._attributes_for(name)
        profiler = CUDA_PROFILER
        if isinstance(profiler, _CudaProfiler) and not profiler.present():  # decided once per step and stage
            return (self._domain.push_range, attributes, self._domain.pop_range)
        return (self._hold, attributes, self._let_go)

    # _hold and _let_go run around every fast-path call: _capture is inlined (one Python call less
    # each) and the lock is taken with acquire/release (half the cost of a `with` block on a Lock).

    def _hold(self, attributes: Any) -> None:
        try:
            try:
                self._lock.acquire()
                try:
                    self._holders += 1
                    if self._holders == 1 and self._spec is None and not self._capturing:
                        self._capturing = True
                        CUDA_PROFILER.start()
                finally:
                    self._lock.release()
            finally:  # pushed even if the capture range failed: _let_go pops it
                self._domain.push_range(attributes)
        except Exception as exc:  # the fast path runs in the user's call: report, never raise
            self._report("could not open a capture range", exc)

    def _let_go(self) -> None:
        try:
            try:
                self._domain.pop_range()
            finally:  # the count stays paired with _hold's, or the capture range would never close
                self._lock.acquire()
                try:
                    self._holders -= 1
                    if self._holders == 0 and self._spec is None and self._capturing:
                        self._capturing = False
                        self.windows_saved += 1
                        CUDA_PROFILER.stop()
                finally:
                    self._lock.release()
        except Exception as exc:
            self._report("could not close a capture range", exc)

    def _capture(self, on: bool) -> None:
        """Open or close the capture range (caller holds the lock)."""
        if on == self._capturing:
            return
        self._capturing = on
        if on:
            CUDA_PROFILER.start()
        else:
            CUDA_PROFILER.stop()
            self.windows_saved += 1

    def start(self, spec: TraceSpec) -> None:
        """Open a stage (discrete) or a step (continuous): a capture range, or a schedule of them."""
        if self._spec is not None:
            raise RuntimeError(f"already tracing {self._spec}")
        self._mini_batches, self.windows_saved = 0, 0
        self._role, self._step = spec.role, spec.step
        with self._lock:
            self._spec = spec
            if spec.schedule is None or action_at(0, spec.schedule) in _RECORDING:
                self._capture(True)
        if spec.stage == naming.CONTINUOUS_STAGE:  # inside the capture range, so nsys sees it whole
            self._close_outer = self.enter_range(_STEP_RANGE)

    def window_step(self) -> None:
        """A mini-batch of a scheduled stage ended: close or open the capture range as the schedule says."""
        spec = self._spec
        if spec is None or spec.schedule is None:
            return
        finished, self._mini_batches = self._mini_batches, self._mini_batches + 1
        with self._lock:
            if action_at(finished, spec.schedule) is Action.RECORD_AND_SAVE:
                self._capture(False)
            if action_at(self._mini_batches, spec.schedule) in _RECORDING:
                self._capture(True)

    def stop(self) -> None:
        """Close the open stage or step (a window the loop ended inside closes here, partial)."""
        if self._spec is None:
            return
        try:
            if self._close_outer is not None:
                self._close_outer()
                self._close_outer = None
        finally:
            with self._lock:
                self._spec = None
                if self._holders == 0:  # else the last fast-path holder closes it
                    self._capture(False)

    def flush(self) -> None:
        """Nothing is exported in-process: nsys writes the report."""

    def close(self) -> None:
        """Close whatever is open."""
        self.stop()
