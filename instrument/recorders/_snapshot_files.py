"""Snapshot files: a CUDA memory snapshot (a plain dict) saved under a trace name, never half-written.

Pickled into this process's private scratch folder (mode 0700, made by ``mkdtemp``), at most
``max_bytes`` (a larger one is saved without its event history, or not at all), fsync'd, then
placed under a name no file has (never overwriting, no symlink followed:
:func:`instrument._safe_files.publish_exclusively`) and published to the manifest. Stage snapshots
are written by a background thread (a 100,000-event snapshot takes seconds to pickle; the training
thread only takes it); at most :data:`PENDING` wait, so a fast loop cannot pile them up in memory (a
stage's end waits for a place at most :data:`WAIT_FOR_WRITER_S`, then drops its snapshot with a
warning). Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instrument import naming
from instrument._safe_files import new_file
from instrument.config import MemorySnapshots
from instrument.recorders import Publish, Report, TraceSpec
from instrument.recorders._publish import Finisher, publish_as, record_of

__all__ = ["MEMORY_TOOL", "PENDING", "SNAPSHOT_SUFFIX", "SnapshotWriter", "cut_stacks"]

MEMORY_TOOL = "torch_memory"
"""The memory recorder's tool name (verl's name for it); its options are ``ProfilerConfig.memory``."""
SNAPSHOT_SUFFIX = naming.SNAPSHOT_SUFFIX
PENDING = 2
WAIT_FOR_WRITER_S = 60.0  # a stage's end waits at most this for a free place, then drops the snapshot
"""Snapshots taken and not yet written, at most; the next one waits (and so does its stage)."""
_TEMP_NAMES = itertools.count()


@dataclass(frozen=True)
class _Job:
    snapshot: dict[str, Any]
    spec: TraceSpec
    stage: str
    window: tuple[int, int] | None
    partial: bool


def cut_stacks(snapshot: dict[str, Any], depth: int) -> dict[str, Any]:
    """Keep the innermost ``depth`` frames of every block and trace entry (in place; returns it)."""
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            frames = block.get("frames")
            if frames is not None and len(frames) > depth:
                block["frames"] = frames[:depth]
    for trace in snapshot.get("device_traces", ()):
        for entry in trace:
            frames = entry.get("frames")
            if frames is not None and len(frames) > depth:
                entry["frames"] = frames[:depth]
    return snapshot


class _TooLargeError(Exception):
    pass


class _Bounded:
    """A binary file that refuses to grow past ``limit`` bytes (pickle writes through it in frames)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def write(self, data: bytes) -> int:
        self._left -= len(data)
        if self._left < 0:
            raise _TooLargeError
        return int(self._raw.write(data))


def _pickle_bounded(snapshot: dict[str, Any], path: Path, limit: int) -> bool:
    """Pickle ``snapshot`` into a new file ``path`` (fsync'd); False (file removed) if over ``limit``."""
    try:
        with new_file(path, mode=0o666) as raw:  # removed again if pickling fails
            pickle.dump(snapshot, _Bounded(raw, limit), protocol=pickle.DEFAULT_PROTOCOL)  # as torch's _dump_snapshot
            raw.flush()
            os.fsync(raw.fileno())
        return True
    except _TooLargeError:
        return False


class SnapshotWriter:
    """Saves snapshots under trace names in ``save_path`` through this process's private scratch folder."""

    def __init__(self, options: MemorySnapshots, publish: Publish, report: Report) -> None:
        self.options = options
        self._publish = publish
        self._report = report
        self._writes = Finisher(
            self._write, report, what="could not write a memory snapshot", name="instrument-snapshots", pending=PENDING
        )

    def save(
        self,
        snapshot: dict[str, Any],
        spec: TraceSpec,
        *,
        window: tuple[int, int] | None = None,
        partial: bool = False,
        stage: str = "",
        background: bool = True,
    ) -> None:
        """Save ``snapshot`` (stacks cut to ``stack_depth``) as ``spec``'s file; ``background``: by the writer.

        In the foreground a failure raises; in the background it is reported.
        """
        job = _Job(snapshot, spec, stage or spec.stage, window, partial)  # stacks are cut by whoever writes
        if not background:
            self._write(job)
            return
        try:
            self._writes.submit(job, timeout_s=WAIT_FOR_WRITER_S)  # bounded: a stuck disk must not stop training
        except queue.Full:
            self._report(
                "dropped a memory snapshot",
                TimeoutError(f"the writer is {PENDING} snapshots behind after {WAIT_FOR_WRITER_S:g} s (a slow disk?)"),
            )

    def flush(self) -> None:
        """Wait until every snapshot taken so far is written and published."""
        self._writes.flush()

    def _write(self, job: _Job) -> bool:
        spec, stage, window, partial = job.spec, job.stage, job.window, job.partial
        snapshot = cut_stacks(job.snapshot, self.options.stack_depth)
        temp = self._writes.folder(spec.save_path) / f"snapshot-{next(_TEMP_NAMES)}.tmp"  # a private folder
        try:
            if not _pickle_bounded(snapshot, temp, self.options.max_bytes):
                traces = snapshot.get("device_traces", [])
                if not _pickle_bounded(
                    {**snapshot, "device_traces": [[] for _ in traces]}, temp, self.options.max_bytes
                ):
                    self._report(
                        "a memory snapshot is larger than memory.max_bytes",
                        OverflowError(
                            f"even without its event history the snapshot of stage {stage!r} exceeds "
                            f"{self.options.max_bytes} bytes; it is not saved"
                        ),
                    )
                    return False
                self._report(
                    "a memory snapshot was saved without its event history",
                    OverflowError(
                        f"the snapshot of stage {stage!r} exceeds memory.max_bytes ({self.options.max_bytes}); "
                        "raise it or lower memory.max_entries / memory.stack_depth to keep the history"
                    ),
                )
            final = publish_as(spec, SNAPSHOT_SUFFIX, lambda _final: temp, stage=stage, window=window, partial=partial)
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()
        self._publish(record_of(spec, final, tool=MEMORY_TOOL, stage=stage, window=window, partial=partial))
        return True

    def close(self) -> None:
        """Write what is pending, end the writer thread and remove the (empty) scratch folder."""
        self._writes.close()
