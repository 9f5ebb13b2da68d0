"""Helpers for tests of code that uses instrument (ours and users').

``reset()`` ends the current run without its finish hook and forgets it, so every test
starts from "not configured".  Use it in a fixture::

    @pytest.fixture(autouse=True)
    def _clean_instrument():
        yield
        instrument.testing.reset()

``capture()`` replaces the configured recorder with :class:`RecordingRecorder`, which writes
nothing and loads no profiler: a test sees, as plain tuples, what the SDK asked a recorder to
do (fast, no torch)::

    with instrument.testing.capture() as calls:
        ins.configure(ins.ProfilerConfig(steps=(1,)), role="actor", rank=0)
        with ins.profile_step(1):
            worker.update_actor(batch)
    assert ("start", "update_actor", None) in calls
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from instrument.recorders import Publish, Report, TraceSpec
from instrument.run import _session
from instrument.run._process import uninstall_process_hooks
from instrument.run._state import STATE

__all__ = ["RecordingRecorder", "capture", "reset", "wait_for_exports"]


def reset() -> None:
    """Close any open run (traces are flushed, the finish hook is not run) and clear all state."""
    session = STATE.session
    if session is not None:
        session.finish(run_hook=False)
    STATE.session = None
    STATE.recording = False
    STATE.engaged = False
    STATE.fast = STATE.observers = STATE.on_oom = None
    uninstall_process_hooks()


def wait_for_exports() -> None:
    """Block until every trace the current run saved so far is on disk (``finish()`` also does)."""
    session = STATE.session
    if session is not None:
        session.wait_for_exports()


class RecordingRecorder:
    """A recorder that records what it is asked to do into ``calls``; it saves no file.

    ``("step", role, step)``, ``("start", stage, window_or_None)`` (the spec's schedule, if any),
    ``("window_step",)``, ``("stop", stage)``, ``("range", name)``, ``("close_range", name)``.
    """

    tool = "recording"
    stage_range_in_windows = True

    def __init__(self, publish: Publish, report: Report, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls
        self.windows_saved = 0
        self._spec: TraceSpec | None = None

    @property
    def tracing(self) -> bool:
        """Whether a trace is open."""
        return self._spec is not None

    def on_step(self, role: str, step: int) -> None:
        """A profiled step begins."""
        self.calls.append(("step", role, step))

    def start(self, spec: TraceSpec) -> None:
        """Open a trace."""
        if self._spec is not None:
            raise RuntimeError(f"a trace is already open ({self._spec})")
        self._spec, self.windows_saved = spec, 0
        self.calls.append(("start", spec.stage, spec.schedule))

    def window_step(self) -> None:
        """A mini-batch of a scheduled trace ended."""
        self.calls.append(("window_step",))

    def stop(self) -> None:
        """Close the open trace."""
        if self._spec is not None:
            self.calls.append(("stop", self._spec.stage))
            self._spec = None
            self.windows_saved = 1

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a range; the returned function closes it."""
        self.calls.append(("range", name))
        return lambda: self.calls.append(("close_range", name))

    def flush(self) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Close whatever is open."""
        self.stop()


@contextlib.contextmanager
def capture(*, alongside: bool = False) -> Iterator[list[tuple[Any, ...]]]:
    """Record what runs configured inside the block ask of their recorder, as a list of tuples.

    ``alongside=True`` keeps the configured recorder too (both are driven: one run, several
    recorders), so real traces are written as well.
    """
    calls: list[tuple[Any, ...]] = []
    saved = list(_session.RECORDER_OVERRIDE)

    def recording(publish: Publish, report: Report, *, tool: str) -> RecordingRecorder:
        return RecordingRecorder(publish, report, calls)

    _session.RECORDER_OVERRIDE[:] = [recording]
    if alongside:
        _session.RECORDER_OVERRIDE.insert(0, _session.configured_recorder)
    try:
        yield calls
    finally:
        _session.RECORDER_OVERRIDE[:] = saved
