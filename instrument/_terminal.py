"""Progress on a terminal for work that can take more than a couple of seconds (``rich.progress``).

Shown only when the stream is a terminal: never in a pipe or a file, never with ``--quiet`` and
never in a CI log (``CI`` set) or on a dumb terminal (``TERM=dumb``); ``NO_COLOR`` drops colour
(rich reads it).  Without ``rich`` (the ``analyze`` extra) there is simply no progress.  Nothing
here raises: a display must never stop the work it reports on, least of all training, so every
failure turns the display off (logged at DEBUG).  ``sys.stdout`` / ``sys.stderr`` are never
swapped (rich's redirection is off): other threads keep writing where they did.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from typing import Any, TextIO

__all__ = ["Display", "human_bytes", "wanted"]

logger = logging.getLogger(__name__)


def wanted(stream: TextIO | None, *, quiet: bool = False) -> bool:
    """Whether progress may be drawn on ``stream``: a terminal, not quiet, not CI, and rich installed."""
    if quiet or stream is None:
        return False
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        if not stream.isatty():
            return False
    except (AttributeError, OSError, ValueError):  # closed, or no file behind it
        return False
    return importlib.util.find_spec("rich") is not None


def human_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 kB'`` (decimal units, as ``ls -h --si`` and the analyze table write them)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover - the loop always returns


class Display:
    """One ``rich.progress.Progress`` on ``stream`` when :func:`wanted`, else nothing; a context manager.

    ``kind`` picks the columns: ``"bytes"`` (a bar of bytes read, files in the description),
    ``"elapsed"`` (a spinner and the time since each task began) or ``"timeout"`` (a bar of seconds
    against a timeout).
    """

    def __init__(self, stream: TextIO | None, *, quiet: bool = False, kind: str = "elapsed") -> None:
        self._lock = threading.RLock()
        self._progress: Any = None
        if not wanted(stream, quiet=quiet):
            return
        try:
            self._progress = _build(stream, kind)
        except Exception:
            logger.debug("no progress display", exc_info=True)

    @property
    def live(self) -> bool:
        """Whether a display is being drawn."""
        return self._progress is not None

    def __enter__(self) -> Display:
        self._call("start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the display (it is transient); later calls do nothing."""
        with self._lock:
            self._call("stop")
            self._progress = None

    def add(self, description: str, total: float | None = None) -> int | None:
        """A new task; ``None`` when nothing is drawn."""
        result = self._call("add_task", description, total=total)
        return result if isinstance(result, int) else None

    def update(self, task: int | None, **fields: Any) -> None:
        """``Progress.update`` of ``task`` (``description=``, ``completed=``, ``advance=``, ``total=``)."""
        if task is not None:
            self._call("update", task, **fields)

    def stop_task(self, task: int | None) -> None:
        """Freeze the task's elapsed time."""
        if task is not None:
            self._call("stop_task", task)

    def print(self, text: str) -> bool:
        """Print ``text`` above the display, as it is (no markup); ``False`` when nothing is drawn."""
        with self._lock:
            if self._progress is None:
                return False
            try:
                self._progress.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
            except Exception:
                self._off()
                return False
            return True

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._progress is None:
                return None
            try:
                return getattr(self._progress, method)(*args, **kwargs)
            except Exception:
                self._off()
                return None

    def _off(self) -> None:
        logger.debug("progress display turned off after a failure", exc_info=True)
        progress, self._progress = self._progress, None
        try:
            progress.stop()
        except Exception:
            logger.debug("stopping the progress display failed", exc_info=True)


def _build(stream: TextIO | None, kind: str) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(file=stream, highlight=False)  # rich itself honours NO_COLOR
    columns: list[Any]
    if kind == "bytes":
        columns = [TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(), TimeElapsedColumn()]
    elif kind == "timeout":
        columns = [
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("of {task.total:.0f} s"),
        ]
    else:
        columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn()]
    return Progress(
        *columns,
        console=console,
        transient=True,  # the display goes; the command's own lines stay
        redirect_stdout=False,
        redirect_stderr=False,
        refresh_per_second=4,
    )
