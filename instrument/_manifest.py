"""The per-process manifest: one JSON line per file written into ``save_path``.

Each process appends to its own ``instrument-manifest-{host}-pid{pid}.jsonl``, so ranks on a
shared filesystem never write into the same file; each record is one ``write`` on an
``O_APPEND`` descriptor, so a crash leaves whole lines behind.  Readers take every
``instrument-manifest-*.jsonl`` and skip lines they cannot parse.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from instrument import naming

__all__ = ["MANIFEST_GLOB", "Manifest", "TraceRecord", "manifest_name", "read_manifests"]

MANIFEST_GLOB = "instrument-manifest-*.jsonl"


@dataclass(frozen=True)
class TraceRecord:
    """One file in ``save_path`` and what it holds."""

    path: str
    role: str
    stage: str
    step: int
    rank: int
    world: int
    window: tuple[int, int] | None
    partial: bool
    bytes: int
    tool: str
    triggered: bool = False

    def to_json(self) -> str:
        """The record as one JSON line (without newline)."""
        data: dict[str, Any] = asdict(self)
        data["window"] = None if self.window is None else list(self.window)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def manifest_name(host: str | None = None, pid: int | None = None) -> str:
    """This process's manifest file name."""
    host = naming.short_hostname() if host is None else naming.sanitize_label(host)
    return f"instrument-manifest-{host}-pid{os.getpid() if pid is None else pid}.jsonl"


class Manifest:
    """Appends :class:`TraceRecord` lines to this process's manifest in ``save_path``."""

    def __init__(self, save_path: str | os.PathLike[str]) -> None:
        self.path = Path(save_path) / manifest_name()
        self._lock = threading.Lock()

    def append(self, record: TraceRecord) -> None:
        """Add one record; raises ``OSError`` when the file cannot be written."""
        line = (record.to_json() + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)


def read_manifests(save_path: str | os.PathLike[str]) -> Iterator[TraceRecord]:
    """Every record of every manifest in ``save_path``; malformed lines are skipped."""
    for manifest in sorted(Path(save_path).glob(MANIFEST_GLOB)):
        with manifest.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    data = json.loads(line)
                    window = data.pop("window")
                    yield TraceRecord(window=None if window is None else (window[0], window[1]), **data)
                except (ValueError, TypeError, KeyError, IndexError):
                    continue
