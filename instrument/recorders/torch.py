"""The torch.profiler backend: one trace per stage, step or mini-batch window.

Loaded only when a torch session starts.  The training thread exports plain JSON
(torch's own ``.json.gz`` export compresses in Python and is far slower); a background
thread compresses it with gzip level 1 into the final, exclusively created name and
adds the manifest line.  :meth:`TorchBackend.flush` joins that work.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.profiler

from instrument import naming
from instrument._safe_files import fsynced, new_file, publish_exclusively
from instrument._warnings import WarnOnce
from instrument.config._settings import contents_named
from instrument.naming import TRACE_SUFFIX
from instrument.recorders import FastRange, FastScope, Publish, Report, TraceSpec
from instrument.recorders._publish import Finisher, basename_of, publish_as, record_of
from instrument.schedule import Action, action_at, window_of

__all__ = ["MEMORY_TIMELINE_SUFFIX", "TorchBackend", "wants_memory_timeline"]

logger = logging.getLogger(__name__)

# Stage and mini-batch ranges are user annotations (category ``user_annotation``, as record_function
# writes them): HTA, TensorBoard and Perfetto read them as annotations, and kineto projects them onto the
# GPU timeline (``gpu_user_annotation``). torch's own pybind pair does it for ~1.3 µs a range against ~4 µs
# for record_function (benchmarks/overhead.py); _RecordFunctionFast is cheaper but can only write cpu_op.
_enter_annotation: Callable[[str], Any]
_exit_annotation: Callable[[Any], None]
try:  # private, so guarded
    _enter_annotation = torch._C._autograd._record_function_with_args_enter
    _exit_annotation = torch._C._autograd._record_function_with_args_exit
except AttributeError:  # pragma: no cover - a torch without the pair: record_function, the same category

    def _enter_annotation(name: str) -> Any:
        annotation = torch.autograd.profiler.record_function(name)
        annotation.__enter__()  # type: ignore[no-untyped-call]
        return annotation

    def _exit_annotation(annotation: Any) -> None:
        annotation.__exit__(None, None, None)


_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)
_TAIL_BYTES = 1 << 16  # kineto ends a trace with `"traceName": "<path>" }`: the tail holds it whole
MEMORY_TIMELINE_SUFFIX = naming.MEMORY_TIMELINE_SUFFIX
"""Beside a trace whose contents hold memory, shapes and stack: torch's memory timeline plot."""


def wants_memory_timeline(contents: tuple[str, ...]) -> bool:
    """Whether a trace also gets a memory timeline: torch's ``export_memory_timeline`` needs
    ``profile_memory``, ``record_shapes`` and ``with_stack`` (it refuses otherwise), so contents
    ``memory``, ``shapes`` and ``stack``; it works on the CPU too (tests/recorders/test_memory_cpu.py)."""
    return all(c in contents for c in ("memory", "shapes", "stack"))


def _all_threads_config() -> dict[str, Any]:
    """Record every thread's ops, not only the starting thread's: stages entered by other threads
    while a trace is open are ranges in it (torch >= 2.7 has ``profile_all_threads``)."""
    try:
        return {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):  # pragma: no cover - older torch: the starting thread only
        return {}


_ALL_THREADS = _all_threads_config()

KINETO_LOGS_ENV = "INSTRUMENT_KINETO_LOGS"
"""Set to ``1`` to see kineto's own lines (``USDT: … profiler_start``, its warnings and errors) again."""
_KINETO_LEVEL_ENV = "KINETO_LOG_LEVEL"
_KINETO_QUIET = "6"  # above kineto's USDT level (5), its highest: torch 2.13 prints two USDT lines a trace
_kineto_started = False


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Around this process's first profiler start: kineto reads ``KINETO_LOG_LEVEL`` once, as it
    initialises, and prints two lines per trace to fd 2 otherwise. A level the user set, or
    ``INSTRUMENT_KINETO_LOGS=1``, is left alone; the variable is removed again once kineto has read
    it, so child processes and the user's view of the environment stay as they were."""
    global _kineto_started
    first, _kineto_started = not _kineto_started, True
    quiet = first and _KINETO_LEVEL_ENV not in os.environ and os.environ.get(KINETO_LOGS_ENV, "").strip() in ("", "0")
    if quiet:
        os.environ[_KINETO_LEVEL_ENV] = _KINETO_QUIET
    try:
        yield
    finally:
        if quiet and os.environ.get(_KINETO_LEVEL_ENV) == _KINETO_QUIET:
            del os.environ[_KINETO_LEVEL_ENV]


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
        self.add_metadata_json("instrument", json.dumps(meta, ensure_ascii=False))  # kineto mangles backslashes


@dataclass(frozen=True)
class _Export:
    json_path: Path
    spec: TraceSpec
    window: tuple[int, int] | None
    partial: bool
    basename: str
    """Tried first for the published trace: a memory timeline beside it has the same one."""


class TorchBackend:
    """Drives torch.profiler for one process; every failure goes to ``report`` and never raises from export."""

    tool = "torch"
    stage_range_in_windows = False  # a window trace starts mid-stage: a stage range would be cut

    def on_step(self, role: str, step: int) -> None:
        """A step begins (torch needs nothing: every trace is opened by :meth:`start`)."""

    def __init__(self, publish: Publish, report: Report) -> None:
        self._publish_record = publish
        self._report = report
        self._profile: _Profile | None = None
        self._spec: TraceSpec | None = None
        self._stopping = False
        self._warn = WarnOnce(logger)
        self._exports = Finisher(
            self._compress, report, what="could not compress and save a trace", name="instrument-export"
        )
        self.windows_saved = 0
        # Ranges opened by decorated calls on the step's thread: nested, so the last opened closes first.
        opened: list[Any] = []
        push, pop = opened.append, opened.pop
        enter, leave = _enter_annotation, _exit_annotation

        def open_fast(name: str) -> None:
            push(enter(name))

        def close_fast() -> None:
            leave(pop())

        self._open_fast, self._close_fast = open_fast, close_fast

    # ------------------------------------------------------------------ tracing

    @property
    def tracing(self) -> bool:
        """Whether a trace is open."""
        return self._profile is not None

    def start(self, spec: TraceSpec) -> None:
        """Open a trace; with ``spec.schedule`` it records only the scheduled mini-batch windows.

        A continuous step's trace with a schedule (verl's dialect) is saved per window too: what lies
        outside the windows (stages before the first recorded mini-batch, after the last) is dropped.
        """
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
                # torch 2.13 records no [memory] events with every thread on: memory wins when asked for
                **({} if "memory" in spec.contents else _ALL_THREADS),
            )
        self._spec = spec
        self._stopping = False
        self.windows_saved = 0
        try:
            with _quiet_kineto():
                profile.start()
        except BaseException:
            self._spec = None
            raise
        self._profile = profile

    def window_step(self) -> None:
        """One mini-batch of a scheduled trace has ended: advance its schedule."""
        if self._profile is not None:
            with warnings.catch_warnings():
                # "Profiler clears events at the end of each cycle" (torch warns at a second cycle): intended
                warnings.filterwarnings("ignore", ".*Profiler clears events", UserWarning)
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

    def fast_ranges(self, *, discrete: bool) -> FastScope | None:
        """Continuous steps only (a discrete stage starts a profiler), on the step's thread: ranges lie in its trace."""
        return None if discrete else "step thread"

    def fast_range(self, name: str, *, discrete: bool) -> FastRange | None:
        """A user-annotation range per call (continuous steps; a discrete stage goes through the session)."""
        return None if discrete else (self._open_fast, name, self._close_fast)

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        """Open a user-annotation range now; the returned function closes it (cheaper than a generator context)."""
        return functools.partial(_exit_annotation, _enter_annotation(name))  # a C-level call, unlike a lambda

    def _activities(self, contents: tuple[str, ...]) -> list[torch.profiler.ProfilerActivity]:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if "cuda" in contents:
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            elif contents_named(contents):  # the default means "CUDA when there is one": no warning on a CPU box
                self._warn(
                    "no cuda",
                    "instrument: contents asks for 'cuda' but CUDA is not available here; recording CPU activity only",
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
            if done == 0 and spec.stage == naming.CONTINUOUS_STAGE:
                partial = False  # a step without scheduled mini-batches, recording at its end: all of it, as verl
            elif last < first:
                return  # the loop ended where a window begins: nothing was recorded
            else:
                window = (first, last)
        basename = basename_of(spec, window=window, partial=partial)
        json_path = self._exports.folder(spec.save_path) / f"{basename}.json"
        profile.export_chrome_trace(str(json_path))
        if not json_path.is_file():  # kineto logs a failed save instead of raising
            raise OSError(f"torch.profiler wrote no trace to {json_path}")
        if wants_memory_timeline(spec.contents):
            self._export_memory_timeline(profile, spec, window, partial, basename)
        self.windows_saved += 1
        self._exports.submit(_Export(json_path, spec, window, partial, basename))

    def _export_memory_timeline(
        self, profile: torch.profiler.profile, spec: TraceSpec, window: tuple[int, int] | None, partial: bool, base: str
    ) -> None:
        """Save torch's memory timeline (an HTML page with the plot) next to the trace; a failure is reported."""
        html = self._exports.folder(spec.save_path) / f"{base}{MEMORY_TIMELINE_SUFFIX}"
        try:
            on_cuda = "cuda" in spec.contents and torch.cuda.is_available()
            device = f"cuda:{torch.cuda.current_device()}" if on_cuda else "cpu"  # this rank's GPU, not GPU 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of CUDA snapshots (CPU has none)
                profile.export_memory_timeline(str(html), device=device)
            final = Path(spec.save_path).absolute() / html.name
            if not publish_exclusively(fsynced(html), final):
                raise FileExistsError(f"{final} exists; the memory timeline is not saved")
            self._publish_record(record_of(spec, final, tool=self.tool, window=window, partial=partial))
        except Exception as exc:  # the trace itself is still saved
            self._report("could not save a memory timeline", exc)
        finally:
            with contextlib.suppress(OSError):
                html.unlink()

    def _compress(self, job: _Export) -> None:
        # Compress in the private folder, fsync, and publish exclusively under a name no
        # process has used: a process killed mid-write, or a full disk, never leaves a truncated
        # trace under a visible name.
        packed = job.json_path.with_suffix(".gz.tmp")
        try:
            tail = _complete_tail(job.json_path)
            try:
                final = self._publish(job, lambda name: _pack(job.json_path, packed, tail, trace_name=str(name)))
            except OSError as exc:  # e.g. no space for the .gz: the complete JSON costs nothing more to keep
                final = self._publish(job, None)
                self._report("could not compress a trace; it is kept as plain JSON", exc)
        finally:
            for leftover in (job.json_path, packed):
                with contextlib.suppress(OSError):
                    leftover.unlink()
        self._publish_record(record_of(job.spec, final, tool=self.tool, window=job.window, partial=job.partial))

    def _publish(self, job: _Export, pack: Callable[[Path], Path] | None) -> Path:
        """Place ``pack(final name)`` (or, with ``pack=None``, the plain JSON) under a free final name:
        ``job.basename``'s, which a memory timeline of the trace shares, unless that one is taken."""
        suffix = TRACE_SUFFIX if pack is not None else TRACE_SUFFIX.removesuffix(".gz")
        source = pack if pack is not None else (lambda _final: fsynced(job.json_path))
        paired = Path(job.spec.save_path).absolute() / (job.basename + suffix)
        if not os.path.lexists(paired) and publish_exclusively(source(paired), paired):
            return paired
        return publish_as(job.spec, suffix, source, window=job.window, partial=job.partial)

    def flush(self) -> None:
        """Wait for pending exports (each was published as it finished)."""
        self._exports.flush()

    def close(self) -> None:
        """Stop any open trace, finish exports and end the export thread."""
        try:
            self.stop()
        finally:
            self._exports.close()


def _complete_tail(json_path: Path) -> bytes:
    """The last bytes of a finished kineto trace; ``OSError`` if the file was cut short (a full disk)."""
    with open(json_path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        source.seek(max(0, size - _TAIL_BYTES))
        tail = source.read()
    if not tail.rstrip().endswith(b"}") or tail.rfind(b'"traceName"') < 0:
        raise OSError(errno.EIO, f"the trace was cut short at {size} bytes (disk full?); it is not published")
    return tail


def _pack(json_path: Path, packed_path: Path, tail: bytes, *, trace_name: str) -> Path:
    """gzip (level 1) ``json_path`` into ``packed_path``, its ``traceName`` set to the final file; fsync'd."""
    cut = tail.rfind(b'"traceName"')
    new_tail = tail[:cut] + b'"traceName": ' + json.dumps(trace_name).encode() + b"}\n"
    with contextlib.suppress(FileNotFoundError):
        packed_path.unlink()  # an earlier attempt's
    with (
        open(json_path, "rb") as source,
        new_file(packed_path, mode=0o666) as raw,
    ):
        with gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as packed:
            remaining = os.fstat(source.fileno()).st_size - len(tail)
            while remaining > 0:
                chunk = source.read(min(remaining, 1 << 20))
                if not chunk:
                    raise OSError(errno.EIO, f"{json_path} shrank while being compressed")
                packed.write(chunk)
                remaining -= len(chunk)
            packed.write(new_tail)
        raw.flush()
        os.fsync(raw.fileno())
    return packed_path
