"""The NVTX / Nsight Systems backend: named ranges for stages and mini-batches, and capture ranges.

Ranges go through the ``nvtx`` package into one domain, ``instrument``, with a category per
role, a stable colour per stage and the RL step as payload. Capture ranges
(``cudaProfilerStart/Stop``) open and close only around what is profiled — each stage (or
each recorded window of a scheduled stage) in discrete mode, each step in continuous mode —
so ``nsys profile --capture-range=cudaProfilerApi`` records only those
(:mod:`instrument.backends.nsys` builds the options and brings the report home).

Loaded only when a session uses ``tool="nvtx"``; imports ``nvtx``, never torch (it uses torch's
CUDA profiler calls only when torch is already imported).
"""

from __future__ import annotations

import logging
import sys
import zlib
from collections.abc import Callable
from typing import Any

import nvtx  # type: ignore[import-untyped]

from instrument import naming
from instrument.backends import Publish, Report, TraceSpec
from instrument.schedule import Action, action_at

__all__ = ["CUDA_PROFILER", "DOMAIN", "NvtxBackend", "stage_color"]

logger = logging.getLogger("instrument")

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
    """``cudaProfilerStart/Stop`` through torch when CUDA is there; a one-time notice otherwise."""

    def __init__(self) -> None:
        self._noticed = False

    def _cuda(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.profiler
        if not self._noticed:
            self._noticed = True
            logger.info(
                "instrument: no CUDA in this process: NVTX ranges are emitted, capture ranges "
                "(cudaProfilerStart/Stop) are not"
            )
        return None

    def start(self) -> None:
        """Open a capture range."""
        cuda = self._cuda()
        if cuda is not None:
            cuda.start()

    def stop(self) -> None:
        """Close the capture range."""
        cuda = self._cuda()
        if cuda is not None:
            cuda.stop()


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

    ranges_per_thread = True  # push/pop belong to the calling thread and to no trace: any thread may take them

    def fast_range(self, name: str) -> tuple[Callable[[Any], None], Any, Callable[[], None]]:
        """What a decorated call opens by itself on a continuous step: push, its attributes, pop."""
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
        """Whether a stage or step is open in this backend."""
        return self._spec is not None

    def _capture(self, on: bool) -> None:
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
        self._spec, self._mini_batches, self.windows_saved = spec, 0, 0
        self._role, self._step = spec.role, spec.step
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
            self._capture(False)
            self._spec = None

    def flush(self) -> None:
        """Nothing is exported in-process: nsys writes the report."""

    def close(self) -> None:
        """Close whatever is open."""
        self.stop()
