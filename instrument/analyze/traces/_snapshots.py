"""Memory files beside the traces: CUDA snapshots (``.pickle``) and CPU memory timelines (HTML).

``instrument analyze`` lists them with their size and, for a snapshot small enough to read
cheaply (:data:`READ_MAX_BYTES`), the peak of allocated memory over its recorded history. A
snapshot is a pickle, and unpickling a file from a directory we do not trust could run code:
:class:`_PlainUnpickler` refuses every global (class or function), so only plain lists, dicts,
strings and numbers come out -- which is all a ``torch.cuda.memory._snapshot()`` holds; anything
else is reported as unreadable. Larger files are not read at all (the peak is then ``None``).

Open a snapshot in PyTorch's memory viewer, https://pytorch.org/memory_viz (drag the file in;
it runs in the browser), or ``python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html``.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from instrument import manifest, naming
from instrument.analyze.model import IntRanges, MemoryFile, label_key
from instrument.analyze.traces import _safe_io
from instrument.naming import parse_trace_name

__all__ = ["READ_BUDGET_BYTES", "READ_MAX_BYTES", "find_memory_files", "peak_allocated"]

READ_MAX_BYTES = 16 << 20
"""Snapshots up to this size are read for their peak; larger ones are only listed (memory_viz reads them)."""

READ_BUDGET_BYTES = 256 << 20
"""All snapshots read for peaks together: at thousands of ranks the rest are listed without one."""

_SNAPSHOT = naming.SNAPSHOT_SUFFIX
_TIMELINE = naming.MEMORY_TIMELINE_SUFFIX


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles builtin containers and scalars only: any class or function is refused, so nothing runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a memory snapshot holds plain values only")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id: a memory snapshot holds plain values only")


def peak_allocated(snapshot: Any) -> int:
    """Peak allocated bytes over a snapshot's recorded history, ending at its segments' allocated bytes.

    Walks the trace backwards from the final state: before an ``alloc`` there was less, before a
    ``free_completed`` more. Without history this is the allocated memory at the snapshot.
    """
    if not isinstance(snapshot, dict):
        raise ValueError("not a memory snapshot (no mapping at its top)")
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        raise ValueError("not a memory snapshot (no 'segments' list)")
    now = sum(int(s.get("allocated_size", 0)) for s in segments if isinstance(s, dict))
    peak = now
    for trace in snapshot.get("device_traces") or ():
        if not isinstance(trace, list):
            continue
        current = now  # each device's history is walked on its own from the same end state
        for entry in reversed(trace):
            if not isinstance(entry, dict):
                continue
            action, size = entry.get("action"), int(entry.get("size", 0) or 0)
            if action == "alloc":
                current -= size
            elif action == "free_completed":
                current += size
            peak = max(peak, current)
    return peak


def _read_peak(path: str, size: int) -> tuple[int | None, str]:
    if size > READ_MAX_BYTES:
        return None, f"not read: over {READ_MAX_BYTES >> 20} MiB"
    try:
        with _safe_io.open_regular(path) as handle:
            data = handle.read(READ_MAX_BYTES + 1)
        if len(data) > READ_MAX_BYTES:
            return None, f"not read: over {READ_MAX_BYTES >> 20} MiB"
        return peak_allocated(_PlainUnpickler(io.BytesIO(data)).load()), ""
    except (OSError, _safe_io.TraceError) as exc:
        return None, f"unreadable: {exc}"
    except Exception as exc:  # a broken or hostile pickle: any unpickling error
        return None, f"not a readable snapshot: {type(exc).__name__}: {exc}"


def find_memory_files(
    directory: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    stages: Iterable[str] | None = None,
) -> list[MemoryFile]:
    """The memory files of ``directory`` named by the SDK, filtered like the traces, sorted by name.

    Role and stage are as the run's manifests give them, the names the user wrote (``update_actor``); a file
    no manifest lists keeps its name's label form (``update-actor``)."""
    rank_set = None if ranks is None else IntRanges.of(ranks)  # intervals: a wide --ranks is never expanded
    step_set = None if steps is None else IntRanges.of(steps)
    stage_set = None if stages is None else frozenset(stages)
    found = []
    budget = READ_BUDGET_BYTES
    with os.scandir(directory) as listing:
        names = sorted(
            e.name for e in listing if not e.name.startswith(".") and e.name.endswith((_SNAPSHOT, _TIMELINE))
        )
    written = _written_names(directory) if names else {}
    for name in names:
        parsed = parse_trace_name(name)
        path = str(Path(directory) / name)
        if parsed is None or _safe_io.entry_problem(path) is not None:
            continue
        oom = parsed.stage.startswith(naming.OOM_STAGE_PREFIX)
        stage = parsed.stage.removeprefix(naming.OOM_STAGE_PREFIX)
        if (rank_set is not None and parsed.rank not in rank_set) or (
            step_set is not None and parsed.step not in step_set
        ):
            continue
        if stage_set is not None and label_key(stage) not in stage_set:
            continue
        try:
            size = os.stat(path).st_size
        except OSError:
            continue  # gone since the listing: the others are still listed
        if name.endswith(_TIMELINE):
            kind, peak, note = "timeline", None, ""
        else:
            kind = "oom snapshot" if oom else "snapshot"
            readable = size <= READ_MAX_BYTES
            if readable and size > budget:
                peak, note = None, f"not read: {READ_BUDGET_BYTES >> 20} MiB of snapshots were read already"
            else:
                budget -= size if readable else 0
                peak, note = _read_peak(path, size)
        role, stage = written.get(name, (parsed.role, stage))
        found.append(MemoryFile(path, kind, role, stage, parsed.step, parsed.rank, parsed.window, size, peak, note))
    return found


def _written_names(directory: str | os.PathLike[str]) -> dict[str, tuple[str, str]]:
    """File name -> (role, stage) as the manifests record them (an OOM snapshot's stage without its prefix)."""
    out: dict[str, tuple[str, str]] = {}
    for record in manifest.read_manifests(directory):  # a bad line is the traces' reading's to report
        if record.path.endswith((_SNAPSHOT, _TIMELINE)):
            stage = record.stage.removeprefix(naming.OOM_STAGE_PREFIX)
            out[os.path.basename(record.path)] = (record.role, stage)
    return out
