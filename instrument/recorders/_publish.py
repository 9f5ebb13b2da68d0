"""How recorders publish a file: written in a private folder, fsync'd, then placed under a free trace name.

Shared by the torch backend (traces, memory timelines) and the memory recorder (snapshots), so
every file in ``save_path`` is made the same way: never half-written under a visible name, never
overwriting, never through a planted symlink (:func:`instrument._safe_files.publish_exclusively`: a
hard link, or a rename over an exclusive placeholder where the filesystem has no hard links).
Standard library only.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from instrument import naming
from instrument._safe_files import publish_exclusively
from instrument.manifest import TraceRecord
from instrument.naming import SCRATCH_PREFIX
from instrument.recorders import Report, TraceSpec

__all__ = [
    "EXCLUSIVE_ATTEMPTS",
    "Finisher",
    "basename_of",
    "private_folder",
    "publish_as",
    "record_of",
]

EXCLUSIVE_ATTEMPTS = 5
"""Names tried (each with a new timestamp) before giving up on a free one."""


def private_folder(save_path: str, *, make_save_path: bool = True) -> Path:
    """A new folder in ``save_path`` for this process's unfinished files.

    Made by ``mkdtemp`` (mode 0700, an unpredictable name): nobody can plant a symlink where the
    file is written, and a half-written file is never visible under a trace name.
    ``make_save_path=False``: ``FileNotFoundError`` when ``save_path`` is gone rather than a new one.
    """
    if make_save_path:
        Path(save_path).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=save_path))


def basename_of(
    spec: TraceSpec, *, stage: str | None = None, window: tuple[int, int] | None = None, partial: bool = False
) -> str:
    """The file name (without suffix) of ``spec``'s file; a new timestamp at each call."""
    return naming.trace_basename(
        role=spec.role,
        stage=spec.stage if stage is None else stage,
        step=spec.step,
        rank=spec.rank,
        world_size=spec.world_size,
        window=window,
        partial=partial,
        triggered=spec.triggered,
    )


def publish_as(
    spec: TraceSpec,
    suffix: str,
    source: Callable[[Path], Path],
    *,
    stage: str | None = None,
    window: tuple[int, int] | None = None,
    partial: bool = False,
) -> Path:
    """Place ``source(final name)`` (a complete, fsync'd file) under a trace name no file has; that name.

    ``stage`` replaces the spec's (an out-of-memory snapshot's ``oom-{stage}``). A taken name is
    tried again with a new timestamp, :data:`EXCLUSIVE_ATTEMPTS` times.
    """
    for _ in range(EXCLUSIVE_ATTEMPTS):
        basename = basename_of(spec, stage=stage, window=window, partial=partial)
        final = Path(spec.save_path).absolute() / (basename + suffix)
        if not os.path.lexists(final) and publish_exclusively(source(final), final):
            return final
    raise FileExistsError(f"no free name for a {suffix} file in {spec.save_path} after {EXCLUSIVE_ATTEMPTS} attempts")


def record_of(
    spec: TraceSpec,
    final: Path,
    *,
    tool: str,
    stage: str | None = None,
    window: tuple[int, int] | None = None,
    partial: bool = False,
) -> TraceRecord:
    """The manifest line of ``final``, a published file of ``spec``."""
    identity = {**spec.identity_fields(), "window": window, "partial": partial}
    if stage is not None:
        identity["stage"] = stage
    return TraceRecord(**identity, path=final.name, bytes=final.stat().st_size, tool=tool)


class Finisher:
    """This process's private folders in each ``save_path``, and a daemon thread that finishes files there.

    ``finish(job)`` runs on the thread for each submitted job; a failure goes to ``report(what, exc)``
    and the thread goes on. ``pending`` bounds the jobs waiting (0: no bound).
    """

    def __init__(self, finish: Callable[[Any], object], report: Report, *, what: str, name: str, pending: int = 0):
        self._finish, self._report, self._what, self._name = finish, report, what, name
        self._jobs: queue.Queue[Any] = queue.Queue(maxsize=pending)
        self._worker: threading.Thread | None = None
        self._folders: dict[str, Path] = {}
        self._made: set[str] = set()  # save paths this process has made a private folder in
        self._folders_lock = threading.Lock()

    def folder(self, save_path: str) -> Path:
        """This process's private folder in ``save_path`` (see :func:`private_folder`).

        Made again after :meth:`flush` removed it, but never ``save_path`` itself: a ``save_path``
        removed under the run makes its files fail (reported), it is not silently recreated.
        """
        with self._folders_lock:
            folder = self._folders.get(save_path)
            if folder is None:
                folder = private_folder(save_path, make_save_path=save_path not in self._made)
                self._folders[save_path] = folder
                self._made.add(save_path)
            return folder

    def submit(self, job: Any, *, timeout_s: float | None = None) -> None:
        """Hand ``job`` to the thread; with a bound, wait at most ``timeout_s`` for a place (``queue.Full``)."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._worker.start()
        self._jobs.put(job, timeout=timeout_s)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._finish(job)
            except BaseException as exc:  # the thread must outlive any single failure
                self._report(self._what, exc)
            finally:
                self._jobs.task_done()

    def flush(self) -> None:
        """Wait until every job submitted so far is finished, then remove the empty private folders.

        The finish hook runs after a flush: what it sees in ``save_path`` (an archive of it) holds
        published files only, no empty ``.instrument-tmp-*`` folder.
        """
        if self._worker is not None and self._worker.is_alive():
            self._jobs.join()
        self._remove_empty_folders()

    def _remove_empty_folders(self) -> None:
        with self._folders_lock:
            for save_path, folder in list(self._folders.items()):
                try:
                    folder.rmdir()  # empty unless a failure left something worth a look (then kept)
                except OSError:
                    continue
                del self._folders[save_path]

    def close(self) -> None:
        """Finish what is pending, end the thread and remove the (empty) private folders."""
        self.flush()
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout=5)
        self._worker = None
        self._remove_empty_folders()
        with self._folders_lock:
            self._folders.clear()
