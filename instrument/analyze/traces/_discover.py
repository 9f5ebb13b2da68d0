"""Finding the trace files of a ``save_path``, and who wrote each one (:func:`discover`).

The manifests come first (every ``instrument-manifest-*.jsonl``), then every other ``.json`` /
``.json.gz`` file by its name (:mod:`._names`): SDK names, relocated vLLM engine and frontend traces
(``{role}_engine_step{S}_rank{g}-of-{W}_replica{r}_…``, ``{role}_frontend_step{S}_replica{r}_…``),
plain vLLM / SGLang worker names (:func:`~instrument.ranks.engine_trace_local_rank`), and last the
trace's own ``distributedInfo.rank`` (:func:`~instrument.analyze.traces._reader.read_header`).
Nothing is opened here but the manifests and the directory listing.

:func:`find_runs` tells the runs of a ``save_path`` apart by the run id on each manifest line (see
``instrument/run/_run_id.py``). A file no manifest gives an id (a foreign trace, an older version's run,
traces relocated by ``instrument rollout``) joins the run of another file of its writer (host and pid in
the SDK's names); else the newest run when it was written after that run started (an engine's traces, a
file added since); else it is of the run :data:`NO_RUN_ID`, the files from before.
Runs whose id comes from the start's minute (``time``) and of one world size, started less than
:data:`RUN_JOIN_S` apart, are one run: a job whose processes straddle a minute boundary is not split.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instrument.analyze.model import Skipped, TraceFile
from instrument.analyze.traces import _safe_io
from instrument.analyze.traces._names import TRACE_SUFFIXES, complete_dp_ranks, from_name, is_trace_name
from instrument.manifest import read_manifests
from instrument.naming import MEMORY_TIMELINE_SUFFIX, SNAPSHOT_SUFFIX, TIMELINE_SUFFIX, parse_trace_name

__all__ = ["ALL_RUNS", "NO_RUN_ID", "RUN_JOIN_S", "Run", "discover", "find_runs", "runs_line", "select_run"]

NO_RUN_ID = "none"
"""The run of the files no manifest line gives a run id (foreign traces, manifests of older versions)."""
ALL_RUNS = "all"
"""What ``run=`` takes for every run at once (duplicates across runs then keep the first file by path)."""
RUN_JOIN_S = 60.0
"""``time`` runs of one world size started less apart than this are one run."""
_OTHER_FILES = (TIMELINE_SUFFIX, SNAPSHOT_SUFFIX, MEMORY_TIMELINE_SUFFIX)
_NAMED_RUNS = 5  # runs named on the one line; the rest counted


@dataclass(frozen=True)
class Run:
    """One run found in a ``save_path``: its id, when it started, and the names of its files there."""

    id: str
    started: float | None
    """Seconds since the epoch: its earliest process start (files with no id: the oldest one's mtime)."""
    names: frozenset[str]

    @property
    def files(self) -> int:
        """How many of its files (traces, timelines, memory files) are in the directory."""
        return len(self.names)

    def to_dict(self, *, selected: bool) -> dict[str, Any]:
        """The run as ``instrument analyze --json`` lists it under ``runs``."""
        return {"id": self.id, "started": _iso(self.started), "files": self.files, "selected": selected}


def _iso(started: float | None) -> str | None:
    return None if started is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))


def _analysed(name: str) -> bool:
    return is_trace_name(name) or (not name.startswith(".") and name.endswith(_OTHER_FILES))


def find_runs(directory: str | os.PathLike[str]) -> list[Run]:
    """The runs whose files are in ``directory``, newest first (empty when it holds none).

    Raises ``OSError`` when the directory cannot be listed.
    """
    root = Path(directory)
    with os.scandir(root) as listing:
        on_disk = {item.name: item for item in listing if _analysed(item.name)}
    owner: dict[str, str] = {}  # file name -> run id
    writer: dict[tuple[str, int], str] = {}  # (host, pid) in the SDK's names -> run id
    seen: dict[str, list[Any]] = {}  # run id -> [earliest start, source, world size]
    for record in read_manifests(root):
        if record.run is None:
            continue
        stamp = record.run
        known = seen.setdefault(stamp.id, [stamp.started, stamp.source, record.world_size])
        known[0] = min(known[0], stamp.started)
        name = os.path.basename(record.path)
        owner.setdefault(name, stamp.id)
        parsed = parse_trace_name(name)
        if parsed is not None:
            writer.setdefault((parsed.host, parsed.pid), stamp.id)
    alias = _joined(seen)
    newest = max(seen, key=lambda run_id: seen[run_id][0], default=None)
    names: dict[str, set[str]] = {}
    for name, entry in on_disk.items():
        run_id = owner.get(name)
        if run_id is None:
            parsed = parse_trace_name(name)
            run_id = None if parsed is None else writer.get((parsed.host, parsed.pid))
        if run_id is None and newest is not None and _mtime(entry) >= seen[newest][0]:
            run_id = newest
        names.setdefault(NO_RUN_ID if run_id is None else alias.get(run_id, run_id), set()).add(name)
    runs = []
    for run_id, held in names.items():
        if run_id == NO_RUN_ID:
            started = min((_mtime(on_disk[name]) for name in held), default=None)
        else:
            started = min(seen[other][0] for other in seen if alias.get(other, other) == run_id)
        runs.append(Run(run_id, started, frozenset(held)))
    return sorted(runs, key=lambda r: (-(r.started or 0.0), r.id))


def _joined(seen: dict[str, list[Any]]) -> dict[str, str]:
    """Each ``time`` run (processes that agreed no id) and the run it is part of: the run of the same world size
    agreed through the store and started nearest, less than :data:`RUN_JOIN_S` apart (a rank that gave up
    waiting for rank 0's id, which configured later), else the ``time`` run it started less than that after."""
    alias: dict[str, str] = {}
    stores = [(run_id, started, world) for run_id, (started, source, world) in seen.items() if source == "store"]
    heads: dict[int, tuple[str, float]] = {}  # world size -> the run it joins, and that run's start
    for run_id, (started, source, world) in sorted(seen.items(), key=lambda item: item[1][0]):
        if source != "time":
            continue
        near = [(abs(begun - started), other) for other, begun, size in stores if size == world]
        gap, nearest = min(near, default=(RUN_JOIN_S, ""))
        head = heads.get(world)
        if gap < RUN_JOIN_S:
            alias[run_id] = nearest
        elif head is not None and started - head[1] < RUN_JOIN_S:
            alias[run_id] = head[0]
        else:
            heads[world] = (run_id, started)
    return alias


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def select_run(runs: list[Run], wanted: str | None, directory: str | os.PathLike[str]) -> Run | None:
    """The run ``wanted`` names (``None``: the newest with an id; a unique prefix of an id will do); ``None``
    for every file (``"all"``, or no run at all). ``ValueError`` naming the runs there when none matches."""
    if wanted == ALL_RUNS or not runs:
        if wanted not in (None, ALL_RUNS):
            raise ValueError(f"no run {wanted!r} in {directory}: it holds no run")
        return None
    if wanted is None:  # files of no run are older than every run with an id: never the default
        return next((run for run in runs if run.id != NO_RUN_ID), runs[0])
    exact = [run for run in runs if run.id == wanted]
    matches = exact or [run for run in runs if run.id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    some = "several runs start with" if matches else "no run"
    listed = ", ".join(f"{run.id} ({_when(run.started)}, {run.files} files)" for run in runs)
    raise ValueError(f"{some} {wanted!r} in {directory}; runs there, newest first: {listed}; or --run {ALL_RUNS}")


def _when(started: float | None) -> str:
    return "?" if started is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))


def runs_line(runs: list[Run], selected: Run | None) -> str | None:
    """One line naming the runs left out of the analysis and how to pick one; ``None`` with a single run."""
    if len(runs) < 2:
        return None
    rest = [run for run in runs if run is not selected]
    others = ", ".join(f"{run.id} ({_when(run.started)}, {run.files} files)" for run in rest[:_NAMED_RUNS])
    if len(rest) > _NAMED_RUNS:
        others += f" and {len(rest) - _NAMED_RUNS} more (--json lists every one)"
    if selected is None:
        return f"{len(runs)} runs analysed together (--run {ALL_RUNS}): {others}"
    shown = f"{selected.id} ({_when(selected.started)}, {selected.files} files)"
    return (
        f"{len(runs)} runs here; analysed the newest, {shown}; older: {others}; "
        f"pick one with --run ID, or --run {ALL_RUNS}"
        if selected is next((run for run in runs if run.id != NO_RUN_ID), runs[0])
        else f"{len(runs)} runs here; analysed {shown}; the others: {others}; --run {ALL_RUNS} takes every one"
    )


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
