"""How recorders publish a file: written in a private folder, fsync'd, then linked under a free trace name.

Shared by the torch backend (traces, memory timelines) and the memory recorder (snapshots), so
every file in ``save_path`` is made the same way: never half-written under a visible name, never
overwriting, never through a planted symlink. Standard library only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from instrument import naming
from instrument._manifest import TraceRecord
from instrument.backends import TraceSpec
from instrument.naming import SCRATCH_PREFIX

__all__ = [
    "EXCLUSIVE_ATTEMPTS",
    "basename_of",
    "fsynced",
    "link_exclusively",
    "private_folder",
    "publish_as",
    "record_of",
]

EXCLUSIVE_ATTEMPTS = 5
"""Names tried (each with a new timestamp) before giving up on a free one."""


def private_folder(save_path: str) -> Path:
    """A new folder in ``save_path`` for this process's unfinished files.

    Made by ``mkdtemp`` (mode 0700, an unpredictable name): nobody can plant a symlink where the
    file is written, and a half-written file is never visible under a trace name.
    """
    Path(save_path).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=save_path))


def fsynced(path: Path) -> Path:
    """``path``, its content on disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    return path


def link_exclusively(source: Path, final: Path) -> bool:
    """Publish ``source`` as ``final`` unless that name exists (never overwrites); fsync the folder."""
    try:
        os.link(source, final)
    except FileExistsError:
        return False
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


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
    """Link ``source(final name)`` (a complete, fsync'd file) under a trace name no file has; that name.

    ``stage`` replaces the spec's (an out-of-memory snapshot's ``oom-{stage}``). A taken name is
    tried again with a new timestamp, :data:`EXCLUSIVE_ATTEMPTS` times.
    """
    for _ in range(EXCLUSIVE_ATTEMPTS):
        basename = basename_of(spec, stage=stage, window=window, partial=partial)
        final = Path(spec.save_path).absolute() / (basename + suffix)
        if not os.path.lexists(final) and link_exclusively(source(final), final):
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
    return TraceRecord(
        path=final.name,
        role=spec.role,
        stage=spec.stage if stage is None else stage,
        step=spec.step,
        rank=spec.rank,
        world=spec.world_size,
        window=window,
        partial=partial,
        bytes=final.stat().st_size,
        tool=tool,
        triggered=spec.triggered,
    )
