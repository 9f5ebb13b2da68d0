"""Finding the trace files of a ``save_path``, and who wrote each one (:func:`discover`).

The manifests come first (every ``instrument-manifest-*.jsonl``), then every other ``.json`` /
``.json.gz`` file by its name (:mod:`._names`): SDK names, relocated vLLM engine and frontend traces
(``{role}_engine_step{S}_rank{g}-of-{W}_replica{r}_…``, ``{role}_frontend_step{S}_replica{r}_…``),
plain vLLM / SGLang worker names (:func:`~instrument.ranks.engine_trace_local_rank`), and last the
trace's own ``distributedInfo.rank`` (:func:`~instrument.analyze.traces._reader.read_header`).
Nothing is opened here but the manifests and the directory listing.
"""

from __future__ import annotations

import os
from pathlib import Path

from instrument.analyze._model import Skipped, TraceFile
from instrument.analyze.traces import _safe_io
from instrument.analyze.traces._names import TRACE_SUFFIXES, complete_dp_ranks, from_name, is_trace_name
from instrument.manifest import read_manifests

__all__ = ["discover"]


def discover(directory: str | os.PathLike[str]) -> tuple[list[TraceFile], list[Skipped]]:
    """Every trace file of ``directory`` (manifest records first, then names), sorted by path.

    Files whose rank the name does not give come back with ``rank=None`` and ``source="trace"``:
    :func:`~._reader.read_header` reads it from the trace.  Entries named like a trace or manifest that are no
    regular file, and bad manifest lines, come back :class:`Skipped`.  Raises ``OSError`` when the
    directory cannot be listed, ``ValueError`` for a bad ``$INSTRUMENT_ANALYZE_MAX_BYTES``.
    """
    root = Path(directory)
    _safe_io.max_decoded_bytes()  # a bad override fails the run here, not once per file
    on_disk: dict[str, Path] = {}
    skipped: list[Skipped] = []
    named: set[str] = set()  # reported once: not again as "listed in a manifest"
    with os.scandir(root) as listing:
        for name in (item.name for item in listing if is_trace_name(item.name)):
            problem = _safe_io.entry_problem(str(root / name))  # manifests: read_manifests checks them
            if problem is None:
                on_disk[name] = root / name
            else:
                skipped.append(Skipped(str(root / name), problem))
                named.add(name)
    found: dict[str, TraceFile] = {}
    for record in read_manifests(root, on_skip=lambda path, reason: skipped.append(Skipped(path, reason))):
        # By name: relative to save_path, or (older manifests) absolute, maybe from another machine
        name = os.path.basename(record.path)
        if not name.endswith(TRACE_SUFFIXES):
            continue  # an nsys report or another file we cannot read
        if name not in on_disk:
            if name not in named:
                named.add(name)
                skipped.append(Skipped(str(root / name), "listed in a manifest but not in the directory"))
            continue
        if record.rank < 0:
            continue  # relocated with an unknown rank: the name decides below
        found.setdefault(
            name,
            TraceFile(
                path=str(on_disk[name]),
                role=record.role,
                stage=record.stage,
                step=record.step,
                rank=record.rank,
                world_size=record.world_size,
                window=record.window,
                partial=record.partial,
                tool=record.tool,
            ),
        )
    for name, entry in on_disk.items():
        if name in found:
            continue
        by_name = from_name(entry)
        if by_name is None:
            by_name = TraceFile(
                path=str(entry),
                role="unknown",
                stage="trace",
                step=None,
                rank=None,
                world_size=None,
                source="trace",
                inside=True,
            )
        found[name] = by_name
    return complete_dp_ranks(sorted(found.values(), key=lambda f: f.path)), skipped
