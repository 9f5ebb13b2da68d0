"""The torch.profiler backend: one trace per stage, step or mini-batch window.

Loaded only when a torch session starts.  The training thread exports plain JSON
(torch's own ``.json.gz`` export compresses in Python and is far slower); a background
thread compresses it with gzip level 1 into the final, exclusively created name and
adds the manifest line.  :meth:`TorchBackend.flush` joins that work.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import logging
import os
import queue
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.profiler

from instrument import naming
from instrument._manifest import Manifest, TraceRecord
from instrument.backends import TraceSpec
from instrument.schedule import Action, action_at, window_of

__all__ = ["TorchBackend"]

logger = logging.getLogger("instrument")

_FastRange: Any
try:  # ~0.25 µs per range against ~5 µs for record_function; private, so guarded
    from torch._C._profiler import _RecordFunctionFast as _FastRange
except ImportError:  # pragma: no cover - older or newer torch without it
    _FastRange = None

_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)
_EXCLUSIVE_ATTEMPTS = 5


class _Profile(torch.profiler.profile):
    """torch.profiler.profile that leaves out ``ProfilerStep#`` rows and always carries rank metadata."""

    def __init__(self, spec: TraceSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record_steps = False  # windows are named by mini-batch; ProfilerStep# rows only add noise
        self._spec = spec

    def start_trace(self) -> None:
        super().start_trace()
        spec = self._spec
        if self._get_distributed_info() is None:  # type: ignore[no-untyped-call]  # HTA reads the rank from distributedInfo
            info = {"backend": "none", "rank": spec.rank, "world_size": spec.world_size}
            self.add_metadata_json("distributedInfo", json.dumps(info))
        meta = {"role": spec.role, "stage": spec.stage, "step": spec.step, "rank": spec.rank}
        self.add_metadata_json("instrument", json.dumps(meta))


@dataclass(frozen=True)
class _Export:
    json_path: Path
    spec: TraceSpec
    window: tuple[int, int] | None
    partial: bool


class TorchBackend:
    """Drives torch.profiler for one process; every failure goes to ``report`` and never raises from export."""

    tool = "torch"
    stage_range_in_windows = False  # a window trace starts mid-stage: a stage range would be cut

    def on_step(self, role: str, step: int) -> None:
        """A step begins (torch needs nothing: every trace is opened by :meth:`start`)."""

    def __init__(self, manifest: Manifest, report: Callable[[str, BaseException], None]) -> None:
        self._manifest = manifest
        self._report = report
        self._profile: _Profile | None = None
        self._spec: TraceSpec | None = None
        self._stopping = False
        self._cuda_warned = False
        self._jobs: queue.Queue[_Export | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._done: list[TraceRecord] = []
        self._done_lock = threading.Lock()
        self.windows_saved = 0

    # ------------------------------------------------------------------ tracing

    @property
    def tracing(self) -> bool:
        """Whether a trace is open."""
        return self._profile is not None

    def start(self, spec: TraceSpec) -> None:
        """Open a trace; with ``spec.schedule`` it records only the scheduled mini-batch windows."""
        if self._profile is not None:
            raise RuntimeError(f"a trace is already open ({self._spec})")
        schedule_fn = None
        if spec.schedule is not None:
            sched = spec.schedule

            def schedule_fn(step_num: int) -> torch.profiler.ProfilerAction:
                return torch.profiler.ProfilerAction(action_at(step_num, sched).value)

        with warnings.catch_warnings():
            # "Profiler clears events at the end of each cycle": intended, each window is its own file.
            warnings.simplefilter("ignore", UserWarning)
            profile = _Profile(
                spec,
                activities=self._activities(spec.contents),
                schedule=schedule_fn,
                on_trace_ready=self._on_trace_ready,
                record_shapes="shapes" in spec.contents,
                profile_memory="memory" in spec.contents,
                with_stack="stack" in spec.contents,
            )
        self._spec = spec
        self._stopping = False
        self.windows_saved = 0
        try:
            profile.start()
        except BaseException:
            self._spec = None
            raise
        self._profile = profile

    def window_step(self) -> None:
        """One mini-batch of a scheduled trace has ended: advance its schedule."""
        if self._profile is not None:
            self._profile.step()

    def stop(self) -> None:
        """Close the open trace; a window the loop ended inside is saved as partial."""
        profile, self._profile = self._profile, None
        if profile is None:
            return
        self._stopping = True
        try:
            profile.stop()
        finally:
            self._stopping = False
            self._spec = None

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """A named range (a CPU event) in the open trace."""
        with _FastRange(name) if _FastRange is not None else torch.autograd.profiler.record_function(name):
            yield

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a range now; the returned function closes it (cheaper than a generator context)."""
        if _FastRange is not None:
            fast = _FastRange(name)
            fast.__enter__()
            return functools.partial(fast.__exit__, None, None, None)  # a C-level call, unlike a lambda
        slow = torch.autograd.profiler.record_function(name)
        slow.__enter__()  # type: ignore[no-untyped-call]
        return lambda: slow.__exit__(None, None, None)

    def _activities(self, contents: tuple[str, ...]) -> list[torch.profiler.ProfilerActivity]:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if "cuda" in contents:
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            elif not self._cuda_warned:
                self._cuda_warned = True
                logger.warning(
                    "instrument: contents asks for 'cuda' but CUDA is not available here; recording CPU activity only"
                )
        return activities

    # ------------------------------------------------------------------ export

    def _on_trace_ready(self, profile: torch.profiler.profile) -> None:
        spec = self._spec
        if spec is None:  # pragma: no cover - torch calls this only between start and stop
            return
        window: tuple[int, int] | None = None
        partial = False
        if spec.schedule is not None:
            done = profile.step_num  # mini-batches finished so far
            if self._stopping and action_at(done, spec.schedule) in _RECORDING:
                first, last = window_of(done, spec.schedule)[0], done - 1
                partial = True
            else:
                first, last = window_of(done - 1, spec.schedule)
            if last < first:
                return  # the loop ended where a window begins: nothing was recorded
            window = (first, last)
        basename = self._basename(spec, window, partial)
        json_path = Path(spec.save_path) / f".{basename}.json.tmp"
        profile.export_chrome_trace(str(json_path))
        if not json_path.is_file():  # kineto logs a failed save instead of raising
            raise OSError(f"torch.profiler wrote no trace to {json_path}")
        self.windows_saved += 1
        self._submit(_Export(json_path, spec, window, partial))

    @staticmethod
    def _basename(spec: TraceSpec, window: tuple[int, int] | None, partial: bool) -> str:
        return naming.trace_basename(
            role=spec.role,
            stage=spec.stage,
            step=spec.step,
            rank=spec.rank,
            world_size=spec.world_size,
            window=window,
            partial=partial,
            triggered=spec.triggered,
        )

    def _submit(self, job: _Export) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="instrument-export", daemon=True)
            self._worker.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._compress(job)
            except BaseException as exc:  # the export thread must outlive any single failure
                self._report("could not compress and save a trace", exc)
            finally:
                self._jobs.task_done()

    def _compress(self, job: _Export) -> None:
        # Compress under a hidden temporary name and publish with a hard link: a process killed
        # mid-write leaves only temporaries (the plain JSON among them), never a truncated trace.
        packed_path = job.json_path.with_name(job.json_path.name.removesuffix(".json.tmp") + ".gz.tmp")
        try:
            with (
                job.json_path.open("rb") as source,
                open(packed_path, "xb") as raw,
                gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as packed,
            ):
                shutil.copyfileobj(source, packed, 1 << 20)
            final = self._publish(packed_path, job)
        except BaseException:
            with contextlib.suppress(OSError):
                packed_path.unlink()
            # Keep the plain JSON, a readable trace, under a visible name rather than lose the window.
            with contextlib.suppress(OSError):
                os.link(job.json_path, job.json_path.with_name(job.json_path.name[1:].removesuffix(".tmp")))
                job.json_path.unlink()
            raise
        packed_path.unlink()
        job.json_path.unlink()
        record = TraceRecord(
            path=str(final),
            role=job.spec.role,
            stage=job.spec.stage,
            step=job.spec.step,
            rank=job.spec.rank,
            world=job.spec.world_size,
            window=job.window,
            partial=job.partial,
            bytes=final.stat().st_size,
            tool=self.tool,
            triggered=job.spec.triggered,
        )
        with self._done_lock:
            self._done.append(record)
        self._manifest.append(record)

    def _publish(self, packed_path: Path, job: _Export) -> Path:
        """Give the finished file a final name no process has used (a new timestamp on a clash)."""
        for _ in range(_EXCLUSIVE_ATTEMPTS):
            final = packed_path.parent / (self._basename(job.spec, job.window, job.partial) + naming.TRACE_SUFFIX)
            try:
                os.link(packed_path, final)  # fails if the name exists: never overwrites
            except FileExistsError:
                continue
            return final
        raise FileExistsError(f"no free trace name in {packed_path.parent} after {_EXCLUSIVE_ATTEMPTS} attempts")

    def flush(self) -> list[TraceRecord]:
        """Wait for pending exports; return the records written since the last flush."""
        if self._worker is not None and self._worker.is_alive():
            self._jobs.join()
        with self._done_lock:
            done, self._done = self._done, []
        return done

    def close(self) -> list[TraceRecord]:
        """Stop any open trace, finish exports and end the export thread."""
        try:
            self.stop()
        finally:
            done = self.flush()
            if self._worker is not None and self._worker.is_alive():
                self._jobs.put(None)
                self._worker.join(timeout=5)
            self._worker = None
        return done
