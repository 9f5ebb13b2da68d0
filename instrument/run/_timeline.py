"""The always-on step timeline's writer: spans appended by the training thread, written by a thread of its own.

The hot path pays for two clock reads and one ``deque.append`` of a plain tuple
``(name, step, start_ns, end_ns, thread_ident)``, where ``name`` is a ``(kind, role, stage)`` key built
once per decorated function (``role`` ``None``: the process's role). Everything else — interning names
and threads, encoding (:mod:`instrument.timeline`), writing — happens on the writer's daemon thread,
woken at the end of each step and every :data:`FLUSH_EVERY_S` seconds. ``deque.append`` and
``popleft`` are atomic, so neither side takes a lock.

The file is created exclusively in ``save_path`` (never through a symlink; ``ready`` says first whether the
run could make that folder, and reports it when not) at the first write and
appended to as the run goes, so a crash keeps every span written so far; it is listed in the manifest
when the run closes it. Failures are reported once through ``report`` and stop the timeline (training
goes on). At most :data:`MAX_PENDING` spans wait at once: beyond that, spans are dropped and counted
(a writer starved for a long time must not grow the training process without bound).

A request (:mod:`instrument.run._requests`) is the tuple
``(REQUEST, step, start_ns, end_ns, thread_ident, stage_entry, prompt_tokens, output_tokens)``: ``stage_entry``
is the innermost entry of the request's own stage stack, made a name by :attr:`TimelineWriter.stage_key` here,
off the hot path. A request whose context held no stage (a decorated stage on an unprofiled step pushes
nothing on the stack: that is what keeps it cheap) waits here until the end of its step, then takes the
innermost stage span of this process that contains it in time (its own thread's first); one that none contains
is written with no stage and reported through :attr:`TimelineWriter.on_stray`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from instrument import naming
from instrument._safe_files import create_new
from instrument.manifest import TraceRecord
from instrument.naming import TIMELINE_STAGE, TIMELINE_SUFFIX
from instrument.run._clock import reported_host
from instrument.run._state import STATE
from instrument.timeline import (
    encode_clock,
    encode_header,
    encode_name,
    encode_request,
    encode_span,
    encode_thread,
)

__all__ = ["FLUSH_EVERY_S", "MAX_PENDING", "OUTSIDE_STAGE", "REQUEST", "NameKey", "TimelineWriter"]

FLUSH_EVERY_S = 1.0
"""The writer writes what is pending at least this often (and at the end of every step)."""
MAX_PENDING = 1 << 20
"""Spans waiting for the writer at most; more are dropped (and counted in ``dropped``)."""
_CLOSE_WAIT_S = 10.0  # close() waits this long for the writer thread before writing the rest itself
_CLOCK = ("clock", None, None)  # the name key of a clock estimate in the pending queue
REQUEST = ("request", None, None)
"""The name slot of a request's tuple in the pending queue (compared by identity)."""
_NO_STAGE = 0xFFFF

NameKey = tuple[str, "str | None", str]
"""``(kind, role, stage)`` of a span; role ``None`` stands for the process's role."""


class TimelineWriter:
    """One process's timeline file: ``pending.append((name, step, start_ns, end_ns, ident))`` records a span."""

    def __init__(
        self,
        save_path: str,
        *,
        role: str,
        rank: int,
        world_size: int,
        publish: Callable[[TraceRecord], None],
        report: Callable[[str, BaseException], None],
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.pending: deque[tuple[Any, ...]] = deque()
        self.dropped = 0
        self._save_path, self._role, self._rank, self._world_size = save_path, role, rank, world_size
        self._publish, self._report, self._ready = publish, report, ready
        self._host = reported_host()  # read once, at configure: the clock exchange reports the same host
        self._names: dict[Any, int] = {}
        self._threads: dict[int, int] = {}
        self._fd: int | None = None
        self._path: Path | None = None
        self._failed = False
        self._closed = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._io = threading.Lock()  # the writer thread and close() never write at once
        self.stage_key: Callable[[object], NameKey | None] = _stage_key
        """A stage-stack entry's name in the timeline."""
        self.on_stray: Callable[[int], None] | None = _strays
        """Called on the writer's thread with how many requests just written lay in no stage."""
        self.stray_requests = 0
        self._held: list[tuple[Any, ...]] = []  # requests whose context held no stage, until their step ends
        self._recent: list[tuple[int, int, int, int]] = []  # (start, end, thread ident, name id) of stages since

    @property
    def path(self) -> Path | None:
        """The file, once its first span is written."""
        return self._path

    @property
    def active(self) -> bool:
        """Whether spans are still recorded (not closed, no failure)."""
        return not (self._failed or self._closed)

    def add_clock(self, offset_ns: int, uncertainty_ns: int, source: str) -> None:
        """Record a clock estimate: this process's clock minus the reference's, within ``uncertainty_ns``."""
        self.pending.append((_CLOCK, offset_ns, uncertainty_ns, source, 0))

    def wake(self) -> None:
        """Ask the writer to write what is pending now (the end of a step); starts it on first use."""
        if not self.active:
            self.pending.clear()
            return
        if len(self.pending) > MAX_PENDING:
            self._drop_excess()
        thread = self._thread
        if thread is None:
            try:
                thread = self._thread = threading.Thread(target=self._run, name="instrument-timeline", daemon=True)
                thread.start()
            except Exception as exc:  # no thread to be had: no timeline, training goes on
                self._fail("cannot start the timeline writer", exc)
                return
        self._wake.set()

    def write_now(self) -> None:
        """Write what is pending from this thread (SIGTERM's flush: the process may end next); bounded."""
        if self._io.acquire(timeout=_CLOSE_WAIT_S):
            try:
                self._write_pending()
            finally:
                self._io.release()

    def close(self) -> None:
        """Write what is pending, close the file and list it in the manifest (bounded; never raises)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_CLOSE_WAIT_S)
        if thread is not None and thread.is_alive():
            self._fail("the timeline writer did not finish in time", TimeoutError(f"{_CLOSE_WAIT_S:.0f} s"))
            return
        with self._io:
            self._write_pending(final=True)
            self._finish_file()

    def forget(self) -> None:
        """In a forked child: this file is the parent's; never write to it from here."""
        self._failed = self._closed = True
        self.pending.clear()
        self._thread, self._fd, self._io = None, None, threading.Lock()

    # ------------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        while not self._closed and not self._failed:
            self._wake.wait(FLUSH_EVERY_S)
            self._wake.clear()
            if self._closed:
                return  # close() writes the rest under the lock
            with self._io:
                self._write_pending()

    def _drop_excess(self) -> None:
        while len(self.pending) > MAX_PENDING:
            self.pending.popleft()
            self.dropped += 1

    def _write_pending(self, *, final: bool = False) -> None:
        if self._failed or not (self.pending or (final and self._held)):
            return
        chunk = bytearray()
        pending = self.pending
        try:
            while pending:
                item = pending.popleft()
                name = item[0]
                if name is _CLOCK:
                    chunk += encode_clock(item[1], item[2], item[3])
                    continue
                if name is REQUEST:
                    key = self.stage_key(item[5])
                    if key is None:
                        self._held.append(item)
                    else:
                        self._encode_request(chunk, item, self._name(chunk, key))
                    continue
                _, a, b, c, ident = item
                name_id = self._name(chunk, name)
                chunk += encode_span(name_id, self._thread_index(chunk, ident), a, b, c)
                if self._held and name[0] == "stage":
                    self._recent.append((b, c, ident, name_id))
                elif name[0] == "step" and (self._held or self._recent):
                    self._place_held(chunk)
            if final or len(self._held) > MAX_PENDING:
                self._place_held(chunk)
            self._write(bytes(chunk))
        except Exception as exc:
            self._fail("cannot write the step timeline", exc)

    def _name(self, chunk: bytearray, name: NameKey) -> int:
        name_id = self._names.get(name)
        if name_id is None:
            name_id = self._names[name] = len(self._names)
            kind, role, stage = name
            chunk += encode_name(name_id, kind, self._role if role is None else role, stage)
        return name_id

    def _thread_index(self, chunk: bytearray, ident: int) -> int:
        thread = self._threads.get(ident)
        if thread is None:
            thread = self._threads[ident] = len(self._threads)
            chunk += encode_thread(thread, ident)
        return thread

    def _encode_request(self, chunk: bytearray, item: tuple[Any, ...], stage_id: int) -> None:
        _, step, start, end, ident, _, prompt, output = item
        chunk += encode_request(stage_id, self._thread_index(chunk, ident), step, start, end, prompt, output)

    def _place_held(self, chunk: bytearray) -> None:
        """A step ended (or the file closes): each held request takes the innermost stage span containing it,
        its own thread's first; the ones none contains are written with no stage and reported."""
        stray = 0
        recent = self._recent
        for item in self._held:
            start, end, ident = item[2], item[3], item[4]
            best: tuple[bool, int] | None = None
            stage_id = _NO_STAGE
            for began, ended, thread, name_id in recent:
                if began <= start and end <= ended:
                    rank = (thread == ident, began)
                    if best is None or rank > best:
                        best, stage_id = rank, name_id
            if stage_id == _NO_STAGE:
                stray += 1
            self._encode_request(chunk, item, stage_id)
        self._held, self._recent = [], []
        if stray:
            self.stray_requests += stray
            if self.on_stray is not None:
                with contextlib.suppress(Exception):  # a report that fails must not stop the timeline
                    self.on_stray(stray)

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            if self._ready is not None and not self._ready():  # save_path unusable: reported by the run, once
                self._failed = True
                self.pending.clear()
                return
            self._fd = self._create()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _create(self) -> int:
        Path(self._save_path).mkdir(parents=True, exist_ok=True)
        host = self._host
        for _ in range(5):  # a taken name (a recycled pid, a planted file) gets a new timestamp
            name = naming.trace_basename(
                role=self._role, stage=TIMELINE_STAGE, step=0, rank=self._rank, world_size=self._world_size, host=host
            )
            path = Path(self._save_path) / (name + TIMELINE_SUFFIX)
            try:
                fd = create_new(path, mode=0o644, append=True)
            except FileExistsError:
                continue
            self._path = path
            header = encode_header(
                role=self._role,
                rank=self._rank,
                world_size=self._world_size,
                host=host,
                pid=os.getpid(),
                mono_ns=time.perf_counter_ns(),
                wall_ns=time.time_ns(),
            )
            os.write(fd, header)
            return fd
        raise FileExistsError(f"no free timeline name in {self._save_path}")

    def _finish_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None or self._path is None:
            return
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
        except OSError as exc:
            self._fail("cannot finish the step timeline", exc)
            return
        finally:
            os.close(fd)
        record = TraceRecord(
            role=self._role,
            stage=TIMELINE_STAGE,
            step=0,
            rank=self._rank,
            world_size=self._world_size,
            path=self._path.name,
            bytes=size,
            tool="timeline",
        )
        try:
            self._publish(record)
        except Exception as exc:
            self._fail("cannot list the step timeline in the manifest", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        self._failed = True
        self.pending.clear()
        self._held = []
        self._report(what, exc)


def _stage_key(entry: object) -> NameKey | None:
    """The timeline name of a stage-stack entry: a ``profiled_stage`` (a with-block's marker), a shortcut's tuple
    (that object first) or a frame (its with-block's object as ``owner``, else its ``name``); None for none.
    Read by attribute: the stack's kinds live in modules that import this one."""
    if type(entry) is tuple:
        entry = entry[0]
    key = getattr(entry, "_key", None)
    if key is None:
        key = getattr(getattr(entry, "owner", None), "_key", None)
    if key is None:
        name = getattr(entry, "name", None)
        return ("stage", None, name) if isinstance(name, str) else None
    return key  # type: ignore[no-any-return]


OUTSIDE_STAGE = "request outside a stage"
"""The misuse kind of a request that no stage of its process held."""


def _strays(count: int) -> None:
    """``count`` requests lay in no stage: named once by the run (its misuse), on the writer's thread."""
    session = STATE.session
    if session is None:
        return
    session.misuse(
        OUTSIDE_STAGE,
        "instrument: %d request(s) ran outside any stage (role %s, rank %s): recorded in their step with no stage; "
        "call them inside the rollout's @profiled_stage (or `with profiled_stage(...)`); training continues",
        count,
        session.role,
        session.rank,
    )
