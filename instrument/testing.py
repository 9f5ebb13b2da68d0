"""Helpers for tests of code that uses instrument (ours and users').

``reset()`` ends the current run without its finish hook and forgets it, so every test
starts from "not configured".  Use it in a fixture::

    @pytest.fixture(autouse=True)
    def _clean_instrument():
        yield
        instrument.testing.reset()

``capture()`` replaces the configured recorder with :class:`RecordingRecorder` (through the
public seam :func:`instrument.recorders.override`), which writes nothing and loads no profiler:
a test sees what the SDK asked a recorder to do, one :class:`RecorderCall` per call (fast, no torch)::

    from instrument.testing import RecorderCall

    with instrument.testing.capture() as calls:
        ins.configure(ins.ProfilerConfig(steps=(1,)), role="actor", rank=0)
        with ins.profile_step(1):
            worker.update_actor(batch)
    assert RecorderCall("start", "update_actor") in calls
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from instrument import recorders
from instrument.recorders import Publish, Report, TraceSpec
from instrument.run._process import uninstall_process_hooks
from instrument.run._state import STATE
from instrument.schedule import ScheduleLike

__all__ = ["RecorderCall", "RecordingRecorder", "capture", "reset", "wait_for_exports"]


def reset() -> None:
    """Close any open run (traces are flushed, the finish hook is not run) and clear all state."""
    session = STATE.session
    if session is not None:
        session.finish(run_hook=False)
    STATE.reset()
    uninstall_process_hooks()


def wait_for_exports() -> None:
    """Block until every trace the current run saved so far is on disk (``finish()`` also does)."""
    session = STATE.session
    if session is not None:
        session.wait_for_exports()


CallKind = Literal["step", "start", "window_step", "stop", "range", "close_range"]


@dataclass(frozen=True)
class RecorderCall:
    """One call the session made on its recorder.

    ``kind``: ``step`` (a profiled step began: ``role``, ``step``), ``start`` (a trace opened: ``stage``, and
    ``schedule`` for a scheduled stage), ``window_step`` (a mini-batch of the scheduled trace ended), ``stop``
    (the trace of ``stage`` closed), ``range`` / ``close_range`` (a range ``stage`` opened / closed: a stage or
    ``mini_batch{i}``). ``spec``: the whole :class:`TraceSpec` of a ``start`` (left out of ``==`` and ``repr``).
    """

    kind: CallKind
    stage: str | None = None
    role: str | None = None
    step: int | None = None
    schedule: ScheduleLike | None = None
    spec: TraceSpec | None = field(default=None, compare=False, repr=False)


class RecordingRecorder:
    """A recorder that appends what it is asked to do to ``calls`` (:class:`RecorderCall` values); it saves no file."""

    tool = "recording"
    stage_range_in_windows = True

    def __init__(self, publish: Publish, report: Report, calls: list[RecorderCall]) -> None:
        self.calls = calls
        self.windows_saved = 0
        self._spec: TraceSpec | None = None

    @property
    def tracing(self) -> bool:
        """Whether a trace is open."""
        return self._spec is not None

    def on_step(self, role: str, step: int) -> None:
        """A profiled step begins."""
        self.calls.append(RecorderCall("step", role=role, step=step))

    def start(self, spec: TraceSpec) -> None:
        """Open a trace."""
        if self._spec is not None:
            raise RuntimeError(f"a trace is already open ({self._spec})")
        self._spec, self.windows_saved = spec, 0
        self.calls.append(RecorderCall("start", spec.stage, schedule=spec.schedule, spec=spec))

    def window_step(self) -> None:
        """A mini-batch of a scheduled trace ended."""
        self.calls.append(RecorderCall("window_step"))

    def stop(self) -> None:
        """Close the open trace."""
        if self._spec is not None:
            self.calls.append(RecorderCall("stop", self._spec.stage))
            self._spec = None
            self.windows_saved = 1

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a range; the returned function closes it."""
        self.calls.append(RecorderCall("range", name))
        return lambda: self.calls.append(RecorderCall("close_range", name))

    def flush(self) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Close whatever is open."""
        self.stop()


@contextlib.contextmanager
def capture(*, alongside: bool = False) -> Iterator[list[RecorderCall]]:
    """Record what runs configured inside the block ask of their recorder, as a list of :class:`RecorderCall`.

    ``alongside=True`` keeps the configured recorder too (both are driven: one run, several
    recorders), so real traces are written as well.
    """
    calls: list[RecorderCall] = []

    def recording(publish: Publish, report: Report) -> RecordingRecorder:
        return RecordingRecorder(publish, report, calls)

    with recorders.override(recording, alongside=alongside):
        yield calls
