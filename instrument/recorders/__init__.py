"""Recorders: what records a profiled stage or step (loaded lazily: importing instrument never imports them).

A recorder receives plain frozen values (:class:`TraceSpec`), never the session, and hands
back each file it saved through the ``publish`` callable it was built with; the session alone
writes the manifest. Recorders are found by tool name in a registry of ``"module:Class"``
strings, so the core has no if/elif on tool names and a new recorder is one
:func:`register_recorder` call away (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from instrument.manifest import TraceRecord
from instrument.naming import TraceIdentity
from instrument.schedule import ScheduleLike

__all__ = [
    "Publish",
    "Recorder",
    "Recorders",
    "Report",
    "TraceSpec",
    "recorder_class",
    "register_recorder",
    "registered_tools",
]

Publish = Callable[[TraceRecord], None]
"""Called by a recorder (from any thread) for each complete file it saved in ``save_path``."""
Report = Callable[[str, BaseException], None]
"""Called by a recorder for a failure it absorbed: what failed, and the exception."""


@dataclass(frozen=True, kw_only=True)
class TraceSpec(TraceIdentity):
    """What one trace is of (its identity: the values its file name and manifest line are made from),
    where it goes and what it records. ``window`` and ``partial`` are the recorder's to fill in per file."""

    save_path: str
    contents: tuple[str, ...]
    schedule: ScheduleLike | None = None
    memory: Any = None  # the run's MemorySnapshots options (ProfilerConfig.memory), for memory recorders


class Recorder(Protocol):
    """What the session drives. Built as ``cls(publish, report)``; only the session calls it, under its lock."""

    tool: str
    stage_range_in_windows: bool  # whether a windowed stage also gets a stage range

    @property
    def windows_saved(self) -> int: ...  # traces (or capture ranges) saved since the last start
    @property
    def tracing(self) -> bool: ...
    def on_step(self, role: str, step: int) -> None: ...
    def start(self, spec: TraceSpec) -> None: ...
    def window_step(self) -> None: ...
    def stop(self) -> None: ...
    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]: ...
    def flush(self) -> None: ...  # block until every file saved so far is published
    def close(self) -> None: ...  # stop, flush, release threads and folders


_REGISTRY: dict[str, str | type[Any]] = {
    "torch": "instrument.recorders.torch:TorchBackend",
    "nvtx": "instrument.recorders.nvtx:NvtxBackend",
    # CUDA memory snapshots, alone or beside a tracer (docs/memory.md); "+" names are not identifiers,
    # so register_recorder cannot shadow them.
    "torch_memory": "instrument.recorders.memory:MemoryRecorder",
    "torch+torch_memory": "instrument.recorders.memory:TorchWithMemory",
    "nvtx+torch_memory": "instrument.recorders.memory:NvtxWithMemory",
}


def register_recorder(tool: str, target: str | type[Any]) -> None:
    """Make ``ProfilerConfig(tool=tool)`` record with ``target`` (a class or ``"module:Class"``, imported lazily)."""
    if not isinstance(tool, str) or not tool.isidentifier() or tool == "none":
        raise ValueError(f"'tool' must be an identifier other than 'none' (got {tool!r})")
    if not isinstance(target, (str, type)):
        raise TypeError(f"'target' must be a class or a 'module:Class' string (got {target!r})")
    if isinstance(target, str) and target.count(":") != 1:
        raise ValueError(f"'target' must look like 'package.module:Class' (got {target!r})")
    _REGISTRY[tool] = target


def registered_tools() -> tuple[str, ...]:
    """Tool names a configuration may use (besides ``none``)."""
    return tuple(sorted(_REGISTRY))


def recorder_class(tool: str) -> type[Any]:
    """The recorder class for ``tool``, importing its module on first use."""
    target = _REGISTRY[tool]
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = _REGISTRY[tool] = getattr(importlib.import_module(module), name)
    return target


class Recorders:
    """Several recorders driven as one (torch.profiler beside a memory recorder, say)."""

    def __init__(self, recorders: list[Any]) -> None:
        self._all = recorders
        self.tool = "+".join(r.tool for r in recorders)
        # A stage range goes to every recorder that wants one in windows: then ask for it.
        self.stage_range_in_windows = any(r.stage_range_in_windows for r in recorders)

    @property
    def windows_saved(self) -> int:
        return max(int(r.windows_saved) for r in self._all)

    @property
    def tracing(self) -> bool:
        return any(r.tracing for r in self._all)

    def on_step(self, role: str, step: int) -> None:
        for r in self._all:
            r.on_step(role, step)

    def start(self, spec: TraceSpec) -> None:
        for r in self._all:
            r.start(spec)

    def window_step(self) -> None:
        for r in self._all:
            r.window_step()

    def stop(self) -> None:
        for r in reversed(self._all):
            r.stop()

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        closers = [r.enter_range(name, concurrent=concurrent) for r in self._all]

        def close() -> None:
            for closer in reversed(closers):
                closer()

        return close

    def flush(self) -> None:
        for r in self._all:
            r.flush()

    def close(self) -> None:
        for r in reversed(self._all):
            r.close()
