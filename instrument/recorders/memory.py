"""The memory recorder (tool ``torch_memory``): CUDA allocator history, one snapshot per stage or window.

On profiled steps and ranks, :meth:`MemoryRecorder.start` turns on
``torch.cuda.memory._record_memory_history`` (clearing earlier history, so a snapshot holds what
its own stage or window did); the end of the stage, or of each recorded mini-batch window of a
scheduled stage, takes ``torch.cuda.memory._snapshot()`` and hands it to a background writer
(:mod:`instrument.recorders._snapshot_files`) that saves it as ``{trace name}.pickle``, complete or
not at all, and publishes it to the manifest. History then goes off again (or back to the
run-long recording that ``on_oom`` keeps). :class:`OomSnapshots` saves one more snapshot when a
CUDA out-of-memory error leaves a ``profiled_stage``.

Without CUDA every call is a no-op after one warning per process; nothing raises. Loaded only
when a memory tool or ``on_oom`` is configured (it imports torch).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from instrument import naming
from instrument._warnings import WarnOnce
from instrument.config import MemorySnapshots
from instrument.recorders import Publish, Report, TraceSpec
from instrument.recorders._snapshot_files import MEMORY_TOOL, SNAPSHOT_SUFFIX, SnapshotWriter, cut_stacks
from instrument.schedule import Action, action_at, window_of

__all__ = ["SNAPSHOT_SUFFIX", "MemoryRecorder", "OomSnapshots", "cut_stacks"]

logger = logging.getLogger(__name__)

_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)


class _CudaMemory:
    """The ``torch.cuda.memory`` calls this module makes, in one place (tests without a GPU swap it)."""

    def available(self) -> bool:
        return bool(torch.cuda.is_available())

    def record(self, options: MemorySnapshots | None, *, clear: bool) -> None:
        """Record history with ``options``; ``None`` turns recording off."""
        if options is None:
            torch.cuda.memory._record_memory_history(enabled=None)
            return
        torch.cuda.memory._record_memory_history(
            enabled="all",
            context=options.context,
            stacks=options.stacks,
            max_entries=options.max_entries,
            clear_history=clear,
        )

    def snapshot(self) -> dict[str, Any]:
        return dict(torch.cuda.memory._snapshot())


CUDA = _CudaMemory()
"""What this module calls; only tests without a GPU replace it (with a documented stand-in)."""

NO_CUDA = WarnOnce(logger)
"""Warns once per process that memory snapshots need CUDA (tests replace it with a fresh one)."""
_oom_history: MemorySnapshots | None = None  # the run-long history on_oom keeps, if any


def _cuda_or_warn(why: str) -> bool:
    """Whether CUDA is here; without it, one warning per process (never an exception)."""
    if CUDA.available():
        return True
    NO_CUDA("no cuda", "instrument: %s needs CUDA, which is not available here; no memory snapshot is saved", why)
    return False


def _history_off() -> None:
    """Stop recording history, or go back to the run-long recording ``on_oom`` keeps."""
    CUDA.record(_oom_history, clear=False)


# ---------------------------------------------------------------------- the recorder


def _no_range() -> None:
    """A memory snapshot has no ranges: closing one does nothing."""


class MemoryRecorder:
    """Records allocator history on profiled stages and saves one snapshot per stage or mini-batch window.

    ``options``: the run's ``ProfilerConfig.memory`` (its registration names that field); ``MemorySnapshots()``
    when not given. Every failure goes to ``report``; no method raises into the session (beside another
    recorder, a raise here would leave that one running).
    """

    tool = MEMORY_TOOL
    stage_range_in_windows = False

    def __init__(self, publish: Publish, report: Report, *, options: MemorySnapshots | None = None) -> None:
        self._writer = SnapshotWriter(options if options is not None else MemorySnapshots(), publish, report)
        self._report = report
        self._spec: TraceSpec | None = None
        self._mini_batch = 0  # mini-batches finished since start
        self._recording = False  # history is on for the open stage or window
        self.windows_saved = 0

    @property
    def tracing(self) -> bool:
        """Whether a stage is open (with or without CUDA)."""
        return self._spec is not None

    def on_step(self, role: str, step: int) -> None:
        """A step begins (nothing to do: every snapshot belongs to a stage)."""

    def start(self, spec: TraceSpec) -> None:
        """A stage (or a continuous step) begins: record history unless its schedule starts elsewhere."""
        if self._spec is not None:
            raise RuntimeError(f"a memory recording is already open ({self._spec})")
        self._spec, self._mini_batch, self.windows_saved = spec, 0, 0
        try:
            starts_recording = spec.schedule is None or action_at(0, spec.schedule) in _RECORDING
            if _cuda_or_warn("memory recording (tool 'torch_memory')") and starts_recording:
                self._history_on()
        except Exception as exc:
            self._report("could not start recording CUDA memory history", exc)

    def window_step(self) -> None:
        """One mini-batch of a scheduled stage ended: save the window it closes, open the next one."""
        spec = self._spec
        if spec is None or spec.schedule is None:
            return
        done, self._mini_batch = self._mini_batch, self._mini_batch + 1
        try:
            if self._recording and action_at(done, spec.schedule) is Action.RECORD_AND_SAVE:
                self._save(spec, window=window_of(done, spec.schedule), partial=False)
            if not self._recording and action_at(self._mini_batch, spec.schedule) in _RECORDING:
                self._history_on()
        except Exception as exc:
            self._report("could not save a memory snapshot of a mini-batch window", exc)

    def stop(self) -> None:
        """The stage ends: save its snapshot (a window the loop ended inside is saved as partial)."""
        spec, self._spec = self._spec, None
        if spec is None or not self._recording:
            return
        try:
            if spec.schedule is None:
                self._save(spec, window=None, partial=False)
            else:
                first, last = window_of(self._mini_batch, spec.schedule)[0], self._mini_batch - 1
                if last >= first:
                    self._save(spec, window=(first, last), partial=True)
                else:
                    self._off()
        except Exception as exc:
            self._report("could not save a memory snapshot", exc)
        finally:
            if self._recording:
                with contextlib.suppress(Exception):
                    self._off()

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Snapshots have no ranges (the stage is in the file name)."""
        return _no_range

    def flush(self) -> None:
        """Wait until every snapshot taken so far is written and published."""
        self._writer.flush()

    def close(self) -> None:
        """Save what is open and remove the empty scratch folder."""
        try:
            self.stop()
        finally:
            self._writer.close()

    def _history_on(self) -> None:
        CUDA.record(self._writer.options, clear=True)
        self._recording = True

    def _off(self) -> None:
        self._recording = False
        _history_off()

    def _save(self, spec: TraceSpec, *, window: tuple[int, int] | None, partial: bool) -> None:
        try:
            self._writer.save(CUDA.snapshot(), spec, window=window, partial=partial)
            self.windows_saved += 1
        finally:
            self._off()


# ---------------------------------------------------------------------- out of memory


class OomSnapshots:
    """``on_oom``: a snapshot when a CUDA out-of-memory error leaves a ``profiled_stage``, on any step.

    Installed by ``configure()`` as ``STATE.on_oom``; records the allocation history from then on
    (bounded by ``max_entries``) so the snapshot shows who allocated. Saves at most
    ``oom_max_snapshots`` per run, each at most ``max_bytes``; one error leaving several nested
    stages is saved once. Never raises: the error propagates unchanged.
    """

    def __init__(
        self,
        options: MemorySnapshots,
        *,
        spec: Callable[[str, str | None], TraceSpec | None],
        publish: Publish,
        report: Report,
    ) -> None:
        global _oom_history
        self._writer = SnapshotWriter(options, publish, report)
        self._spec = spec  # (stage, role) -> what the snapshot is of; None once the run finished
        self._report = report
        # The error last saved, told apart without keeping it alive (its frames hold tensors a
        # caller may free to retry): its id, and its args tuple, which we hold so no later error's
        # args can take its address (an id alone is reused by the next error of a retry loop).
        self._last: tuple[int, tuple[Any, ...] | None] = (0, None)
        self.saved = 0
        self._lock = threading.Lock()
        if _cuda_or_warn("memory.on_oom"):
            CUDA.record(options, clear=False)
            _oom_history = options

    def __call__(self, exc: BaseException, stage: str, role: str | None) -> None:
        """``exc`` is leaving stage ``stage``: save a snapshot if it is a CUDA OOM not seen yet."""
        try:
            if not isinstance(exc, torch.OutOfMemoryError):
                return
            with self._lock:
                last_id, last_args = self._last
                if (
                    id(exc) == last_id and exc.args is last_args
                ) or self.saved >= self._writer.options.oom_max_snapshots:
                    return  # the same error leaving an outer stage, or the run's bound reached
                self._last = (id(exc), exc.args)
                spec = self._spec(stage, role)
                if spec is None or not _cuda_or_warn("memory.on_oom"):
                    return
                self.saved += 1
                # Written before the error goes on: the process may not live much longer.
                self._writer.save(CUDA.snapshot(), spec, stage=f"{naming.OOM_STAGE_PREFIX}{stage}", background=False)
        except Exception as err:
            self._report("could not save a memory snapshot at an out-of-memory error", err)

    def close(self) -> None:
        """Stop the run-long history (a later run decides anew) and remove the empty scratch folder; never raises."""
        global _oom_history
        try:
            if _oom_history is self._writer.options:
                _oom_history = None
                if CUDA.available():
                    CUDA.record(None, clear=False)
            self._writer.close()
        except Exception as exc:
            self._report("could not stop recording CUDA memory history", exc)
