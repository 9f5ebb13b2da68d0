"""Several recorders driven as one: the tool ``"a+b"``, or a test's recorder beside the configured one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from instrument.recorders._protocol import Recorder, TraceSpec

__all__ = ["Recorders"]


class Recorders:
    """Recorders driven in the order given; stops, closes and range ends in reverse (so the first wraps the rest)."""

    def __init__(self, recorders: Sequence[Recorder]) -> None:
        self._all = tuple(recorders)
        self.tool = "+".join(r.tool for r in self._all)
        # A stage range goes to every recorder that wants one in windows: then ask for it.
        self.stage_range_in_windows = any(r.stage_range_in_windows for r in self._all)

    @property
    def windows_saved(self) -> int:
        """The most any of them saved since the last start."""
        return max(int(r.windows_saved) for r in self._all)

    @property
    def tracing(self) -> bool:
        """Whether any of them is tracing."""
        return any(r.tracing for r in self._all)

    def on_step(self, role: str, step: int) -> None:
        """A profiled step begins."""
        for r in self._all:
            r.on_step(role, step)

    def start(self, spec: TraceSpec) -> None:
        """Open a trace in each."""
        for r in self._all:
            r.start(spec)

    def window_step(self) -> None:
        """A mini-batch of the scheduled trace ended."""
        for r in self._all:
            r.window_step()

    def stop(self) -> None:
        """Close the trace in each, last started first."""
        for r in reversed(self._all):
            r.stop()

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a range in each; the returned function closes them, innermost first."""
        closers = [r.enter_range(name, concurrent=concurrent) for r in self._all]

        def close() -> None:
            for closer in reversed(closers):
                closer()

        return close

    def flush(self) -> None:
        """Wait for every file each saved so far."""
        for r in self._all:
            r.flush()

    def close(self) -> None:
        """Close each, last started first."""
        for r in reversed(self._all):
            r.close()
