"""The ``memory`` section of the configuration: CUDA memory snapshots per stage and on OOM.

The memory recorder (:mod:`instrument.recorders.memory`, tool ``torch_memory``) declares this
field as its options at registration (``options="memory"``); it is defined here, not there, because
``ProfilerConfig`` validates it at construction and config never imports the recorders. Kept apart
from :mod:`instrument.config._settings` so that module stays small; re-exported as
``instrument.MemorySnapshots``. Standard library and attrs only (``import instrument`` never
imports torch).
"""

from __future__ import annotations

import attrs

from instrument.config._validators import boolean, guesses_keywords, int_at_least, one_of

__all__ = ["MEMORY_CONTEXTS", "MEMORY_STACKS", "MemorySnapshots"]

MEMORY_CONTEXTS = ("all", "alloc", "state")
"""Allowed ``MemorySnapshots.context`` values (``torch.cuda.memory._record_memory_history(context=)``)."""

MEMORY_STACKS = ("python", "all")
"""Allowed ``MemorySnapshots.stacks`` values: Python frames only, or C++ frames as well."""


@guesses_keywords
@attrs.frozen
class MemorySnapshots:
    """How CUDA memory snapshots are recorded (``ProfilerConfig(memory=...)``; docs/memory.md).

    With ``tool="torch_memory"`` (or ``"torch+torch_memory"``, ``"nvtx+torch_memory"``) each profiled
    stage, or each mini-batch window of a scheduled stage, records the allocator's history and
    saves one ``{name}.pickle`` snapshot. ``on_oom=True`` saves a snapshot when a CUDA
    out-of-memory error leaves a ``profiled_stage``, on any step, whatever the tool.
    """

    max_entries: int = attrs.field(default=100_000, validator=int_at_least(1))
    """Allocation events kept (a ring buffer; verl's ``trace_alloc_max_entries``)."""
    stack_depth: int = attrs.field(default=32, validator=int_at_least(1))
    """Frames kept per event and block in a saved snapshot, innermost first (verl's ``stack_depth``);
    torch records whole stacks, the cut is made when saving and bounds the file size."""
    context: str = attrs.field(default="all", validator=one_of(MEMORY_CONTEXTS))
    """Which events get a stack: ``"all"`` (allocations and frees), ``"alloc"``, ``"state"`` (live blocks only)."""
    stacks: str = attrs.field(default="python", validator=one_of(MEMORY_STACKS))
    """``"python"`` frames, or ``"all"`` with C++ frames (slower to record, larger files)."""
    on_oom: bool = attrs.field(default=False, validator=boolean)
    """Save a snapshot when a CUDA out-of-memory error leaves a ``profiled_stage`` (any step); the
    allocation history is then recorded from ``configure()`` on, so the snapshot shows who allocated."""
    oom_max_snapshots: int = attrs.field(default=1, validator=int_at_least(1))
    """Out-of-memory snapshots saved per run and process at most."""
    max_bytes: int = attrs.field(default=1 << 30, validator=int_at_least(1 << 20))
    """Largest snapshot file written (bytes, at least 1 MiB); a larger one is saved without its event
    history (segments and blocks only), and dropped with a warning if even that does not fit."""
