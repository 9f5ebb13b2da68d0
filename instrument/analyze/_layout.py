"""Export layouts: a ``save_path`` rearranged so HTA and TensorBoard's profiler plugin read it right.

Both tools take one *folder* as one run: HTA keeps one file per rank in it (the rank read from the
trace's ``distributedInfo``; a second file of the same rank replaces the first), and TensorBoard's
profiler plugin makes a "worker" of each ``{worker}[.{timestamp}].pt.trace.json[.gz]`` name in it.
A ``save_path`` holds every stage, step and rank flat in one folder, so both misread it.  The export
gives each (role, stage, step[, window]) its own folder with one file per rank::

    OUT/actor/update-actor/step1/rank0.1712345678901.pt.trace.json.gz     (tensorboard)
    OUT/actor/update-actor/step1/rank-0.json.gz                           (hta)

Files are hard links to the originals where the filesystem allows, else symlinks (to the absolute
path), else copies.  For HTA a file whose first ``"rank": N`` (what HTA reads) is not its rank here
(a vLLM engine trace numbers ranks inside its engine) is written as a copy with that rank set.

Safety: ``OUT`` must be absent or an empty directory (not a symlink) and must not lie inside ``DIR``;
every folder and file is created exclusively under a directory descriptor opened without following
symlinks (:class:`~instrument._safe_files.FolderTree`, :func:`~instrument._safe_files.new_file`), so
nothing is written outside ``OUT`` and no name is overwritten.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instrument import naming
from instrument._safe_files import FolderTree, new_file
from instrument.analyze.model import Filters, Skipped, TraceFile
from instrument.analyze.traces._discover import Run
from instrument.analyze.traces._exports import hta_rank, is_gzip, ranked_traces, raw_chunks, text_with_rank
from instrument.analyze.traces._reader import TraceError

__all__ = ["LAYOUTS", "Export", "Exported", "export_layout"]

LAYOUTS = ("hta", "tensorboard")
"""The layouts :func:`export_layout` writes."""

MAX_OPEN_FOLDERS = 32
"""Folder descriptors the export keeps open at once (:class:`~instrument._safe_files.FolderTree`)."""


@dataclass(frozen=True)
class Exported:
    """One file placed in the layout."""

    source: str
    target: str  # relative to OUT
    how: str  # link | symlink | copy | rewritten (HTA: a copy with the rank set)


@dataclass(frozen=True)
class Export:
    """What :func:`export_layout` wrote and what it left out (and why)."""

    layout: str
    out: str
    files: tuple[Exported, ...]
    skipped: tuple[Skipped, ...]

    @property
    def folders(self) -> tuple[str, ...]:
        """The run folders, relative to ``out``, sorted."""
        return tuple(sorted({os.path.dirname(f.target) for f in self.files}))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "layout": self.layout,
            "out": self.out,
            "folders": list(self.folders),
            "files": [{"source": f.source, "target": f.target, "how": f.how} for f in self.files],
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
        }


# --------------------------------------------------------------------------- choosing files


def _folder_label(label: str) -> str:
    """``label`` as one safe path component (never empty, ``.`` or ``..``)."""
    try:
        return naming.sanitize_label(label)
    except (TypeError, ValueError):
        return "unnamed"


def folder_of(trace: TraceFile) -> str:
    """``{role}/{stage}/step{S}[_mb{a}[-{b}]]`` (``no-step`` when the name gives none)."""
    leaf = "no-step" if trace.step is None else f"step{trace.step}"
    if trace.window is not None:
        first, last = trace.window
        leaf += f"_mb{first}" if first == last else f"_mb{first}-{last}"
    return "/".join((_folder_label(trace.role), _folder_label(trace.stage), leaf))


def _chosen(
    directory: str | os.PathLike[str],
    ranks: Iterable[int] | None,
    steps: Iterable[int] | None,
    stages: Iterable[str] | None,
    run: str | Run | None,
) -> tuple[list[TraceFile], list[Skipped]]:
    """The traces to export (one per folder and rank, first by path: those the analysis with the same run and
    filters reads), and the files left out."""
    chosen, skipped = ranked_traces(directory, Filters.of(ranks, steps, stages), run)
    taken: dict[tuple[str, str], str] = {}
    unique: list[TraceFile] = []
    for trace in chosen:
        who = f"rank{trace.rank}" if trace.rank is not None else f"replica{trace.replica}"
        slot = (folder_of(trace), who)
        if slot in taken:
            skipped.append(Skipped(trace.path, f"duplicate: {slot[0]} already has {who} from {taken[slot]}"))
            continue
        taken[slot] = trace.path
        unique.append(trace)
    return unique, skipped


# --------------------------------------------------------------------------- OUT


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _prepare_out(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """``out`` created or checked empty; raises ``ValueError`` naming the problem."""
    target = Path(out)
    source = Path(directory).resolve()
    if _inside(target.resolve(), source):
        raise ValueError(f"OUT {target} is inside DIR {directory}: choose a folder outside it")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        try:
            target.mkdir(parents=True)
        except OSError as exc:
            raise ValueError(f"cannot create OUT {target}: {exc.strerror or exc}") from exc
        return target
    except OSError as exc:
        raise ValueError(f"cannot check OUT {target}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(mode):
        raise ValueError(f"OUT {target} is a symlink: give the real folder")
    if not stat.S_ISDIR(mode):
        raise ValueError(f"OUT {target} exists and is not a folder")
    try:
        with os.scandir(target) as entries:
            if any(True for _ in entries):
                raise ValueError(f"OUT {target} is not empty: give a new or empty folder")
    except OSError as exc:
        raise ValueError(f"cannot list OUT {target}: {exc.strerror or exc}") from exc
    return target


# --------------------------------------------------------------------------- placing one file


def _write(chunks: Iterator[bytes], name: str, folder: int, *, packed: bool) -> None:
    """``chunks`` into the new file ``name`` of ``folder``, gzip-compressed when ``packed``."""
    with new_file(name, mode=0o644, dir_fd=folder) as raw:
        sink = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if packed else None
        write = raw.write if sink is None else sink.write
        try:
            for chunk in chunks:
                write(chunk)
        finally:
            if sink is not None:
                sink.close()  # writes gzip's trailer; leaves raw open for new_file


def _copy(source: str, name: str, folder: int) -> None:
    _write(raw_chunks(source), name, folder, packed=False)


def _rewrite(source: str, name: str, folder: int, rank: int) -> None:
    """A copy of ``source`` whose first rank (as HTA reads it) is ``rank``; gzip kept when the source had it."""
    _write(text_with_rank(source, rank), name, folder, packed=is_gzip(source))


def _place(source: str, name: str, folder: int) -> str:
    """Put ``source`` at ``name``: a hard link, else a symlink, else a copy; returns which."""
    try:
        os.link(source, name, dst_dir_fd=folder, follow_symlinks=True)  # the file a symlink names, not the link
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise
    else:
        # The source may have been swapped for a FIFO or device since it was checked: refuse that
        if not stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=folder)
            raise TraceError("not a regular file (swapped after it was listed)")
        return "link"
    try:
        os.symlink(os.path.realpath(source), name, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise
    else:
        return "symlink"
    _copy(source, name, folder)
    return "copy"


def file_name(layout: str, trace: TraceFile, gz: bool) -> str:
    """The name each tool expects for ``trace`` inside its folder."""
    suffix = ".json.gz" if gz else ".json"
    if layout == "hta":
        return f"rank-{trace.rank}{suffix}"
    who = f"rank{trace.rank}" if trace.rank is not None else f"replica{trace.replica}"
    # {worker}.{timestamp}: the plugin numbers each worker's timestamps as its spans, so one file per
    # worker is span 1 on every rank and the distributed view lines them up
    millis = os.stat(trace.path).st_mtime_ns // 1_000_000
    return f"{who}.{millis}.pt.trace{suffix}"


def _export_one(layout: str, trace: TraceFile, tree: FolderTree) -> Exported:
    relative = folder_of(trace)
    name = file_name(layout, trace, is_gzip(trace.path))
    folder = tree.folder(relative)
    how = ""
    if layout == "hta" and trace.rank is not None and hta_rank(trace.path) != trace.rank:  # frontends never reach here
        _rewrite(trace.path, name, folder, trace.rank)
        how = "rewritten"
    if not how:
        how = _place(trace.path, name, folder)
    return Exported(trace.path, f"{relative}/{name}", how)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TraceError):
        return str(exc)
    if isinstance(exc, OSError):
        if exc.errno == errno.EEXIST:
            return "cannot export: its name in OUT was taken meanwhile (left alone)"
        return f"cannot export ({exc.strerror or exc})"
    if isinstance(exc, EOFError):
        return "truncated gzip (the compressed stream ends early)"
    return f"cannot export ({type(exc).__name__}: {exc})"


def export_layout(
    directory: str | os.PathLike[str],
    out: str | os.PathLike[str],
    layout: str,
    *,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    stages: Iterable[str] | None = None,
    run: str | Run | None = None,
) -> Export:
    """Write the ``layout`` (``"hta"`` or ``"tensorboard"``) of the traces in ``directory`` into ``out``.

    ``out`` must be absent (it is created) or an empty folder, outside ``directory``.  ``run`` (the newest
    by default, ``"all"``, an id) / ``ranks`` / ``steps`` / ``stages`` keep the files
    :func:`~instrument.analyze.analyze` keeps with the same ones.
    Raises ``ValueError`` for a bad layout, filter or ``out``, ``OSError`` when ``directory`` cannot be listed.
    Files that cannot be exported are returned in :attr:`Export.skipped`, the rest is still written.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
    chosen, skipped = _chosen(directory, ranks, steps, stages, run)
    root = _prepare_out(directory, out)
    files: list[Exported] = []
    tree = FolderTree(root, max_open=MAX_OPEN_FOLDERS)
    try:
        # folder by folder, ranks in order: few folder descriptors are needed and the listing reads well
        for trace in sorted(chosen, key=lambda t: (folder_of(t), t.rank is None, t.rank or 0, t.replica or 0)):
            if layout == "hta" and trace.rank is None:
                skipped.append(Skipped(trace.path, "no rank: a vLLM frontend trace (HTA needs one rank per file)"))
                continue
            try:
                files.append(_export_one(layout, trace, tree))
            except (OSError, TraceError, EOFError, zlib.error) as exc:
                skipped.append(Skipped(trace.path, _reason(exc)))
    finally:
        tree.close()
    return Export(layout, str(root), tuple(files), tuple(skipped))
