"""The one list of tool names: name -> how to build its recorder, and what the run must know about it.

It sits below :mod:`instrument.config` (which validates ``ProfilerConfig.tool`` against it) and
:mod:`instrument.recorders` (which builds from it and re-exports its public names), so neither
imports the other's way up. Built-in recorders are registered as ``"module:Class"`` strings, imported
by :func:`instrument.recorders.recorder_class` when a run first builds one (``import instrument``
imports no torch). Third-party recorders come from :func:`register`, or from the entry-point group
``instrument.recorders``, read only when a name is not registered (validated or looked up):
``entry_points(group="instrument.recorders", name=...)``, the way OpenTelemetry finds its providers.
A bad entry point logs one warning and counts as unknown. Standard library only (and
:mod:`instrument._warnings`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from instrument._warnings import WarnOnce

__all__ = [
    "BUILT_IN_TOOLS",
    "ENTRY_POINT_GROUP",
    "Registration",
    "keep_imported",
    "register",
    "registered_tools",
    "registration",
    "uses_cupti",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "instrument.recorders"
"""Entry points of this group name a recorder factory (``name = "package.module:Class"``)."""


@dataclass(frozen=True)
class Registration:
    """A recorder as the registry holds it: its factory and what the run must know before building it."""

    factory: str | Callable[..., Any]
    """A recorder class (or any factory), or ``"package.module:Class"``, imported on first use."""
    options: str | None = None
    """The ``ProfilerConfig`` field whose value the factory receives as ``options=`` (``"memory"``)."""
    uses_cupti: bool = False
    """It records CUDA activity through CUPTI itself: ``configure()`` drops an NVTX injection library (nsys),
    which would take CUPTI from it, when ``cuda`` is in ``contents``."""
    outermost: bool = False
    """Beside other recorders it starts first and stops last, so its own work (a memory snapshot) stays out
    of their traces."""
    extra: str | None = None
    """The ``instrument-rl[...]`` extra installing what its module imports, named when that is missing."""


_REGISTRY: dict[str, Registration] = {
    "torch": Registration("instrument.recorders.torch:TorchBackend", uses_cupti=True, extra="torch"),
    "nvtx": Registration("instrument.recorders.nvtx:NvtxBackend", extra="nvtx"),
    # CUDA memory snapshots, alone or beside a tracer (docs/memory.md); the recorder takes the
    # ``memory`` section of the configuration (MemorySnapshots) as its options
    "torch_memory": Registration(
        "instrument.recorders.memory:MemoryRecorder", options="memory", outermost=True, extra="torch"
    ),
}

BUILT_IN_TOOLS = tuple(sorted(_REGISTRY))
"""The recorders this package ships (``"none"`` records nothing and is no recorder)."""

_broken: set[str] = set()  # entry points that failed to load: never tried again
_warn = WarnOnce(logger)


def register(
    name: str,
    factory: str | Callable[..., Any],
    *,
    options: str | None = None,
    uses_cupti: bool = False,
    outermost: bool = False,
) -> None:
    """Make ``ProfilerConfig(tool=name)`` (and ``tool="torch+name"``, ...) record with ``factory``.

    ``factory`` is a recorder class (or any callable building one) or ``"package.module:Class"``,
    imported on first use; it is called as ``factory(publish, report)``, with ``options=`` the value
    of the ``ProfilerConfig`` field named by ``options`` if given. ``uses_cupti`` and ``outermost``:
    see :class:`Registration`. A name registered again is replaced.
    """
    if not isinstance(name, str) or not name.isidentifier() or name == "none":
        raise ValueError(f"'name' must be an identifier other than 'none' (got {name!r})")
    if not isinstance(factory, str) and not callable(factory):
        raise TypeError(f"'factory' must be a recorder class, a callable or a 'module:Class' string (got {factory!r})")
    if isinstance(factory, str) and factory.count(":") != 1:
        raise ValueError(f"'factory' must look like 'package.module:Class' (got {factory!r})")
    if options is not None and (not isinstance(options, str) or not options.isidentifier()):
        raise ValueError(f"'options' must name a ProfilerConfig field such as 'memory' (got {options!r})")
    _REGISTRY[name] = Registration(factory, options=options, uses_cupti=bool(uses_cupti), outermost=bool(outermost))
    _broken.discard(name)


def registered_tools() -> tuple[str, ...]:
    """Recorder names a configuration may use, alone or joined by ``+`` (besides ``none``), sorted.

    Lists entry points by name without loading them.
    """
    return tuple(sorted({*_REGISTRY, *(n for n in _entry_point_names() if n not in _broken and n.isidentifier())}))


def registration(name: str) -> Registration:
    """What the registry holds for recorder ``name`` (an entry point is loaded now); ``KeyError`` if none."""
    found = _REGISTRY.get(name)
    if found is None:
        found = _from_entry_point(name)
        if found is None:
            raise KeyError(f"no recorder is registered as {name!r} (registered: {', '.join(registered_tools())})")
    return found


def keep_imported(name: str, found: Registration, factory: Callable[..., Any]) -> None:
    """Hold ``factory``, imported from ``found``'s ``"module:Class"``, in its place (unless replaced meanwhile)."""
    if _REGISTRY.get(name) is found:
        _REGISTRY[name] = replace(found, factory=factory)


def uses_cupti(tool: str) -> bool:
    """Whether a recorder of ``tool`` (``"a+b"``: any part) records CUDA through CUPTI; unknown names do not."""
    for name in tool.split("+"):
        with contextlib.suppress(KeyError):
            if registration(name).uses_cupti:
                return True
    return False


# ---------------------------------------------------------------------- entry points


def _entry_points(name: str | None = None) -> importlib.metadata.EntryPoints:
    try:
        if name is None:
            return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    except Exception as exc:  # unreadable metadata of some installed distribution
        _warn("scan", "instrument: cannot read the %r entry points: %s: %s", ENTRY_POINT_GROUP, type(exc).__name__, exc)
        return importlib.metadata.EntryPoints(())


def _entry_point_names() -> set[str]:
    return {entry.name for entry in _entry_points()}


def _from_entry_point(name: str) -> Registration | None:
    """Load and register the entry point ``name``, if there is one; a bad one warns once and stays unknown."""
    if name in _broken or not name.isidentifier() or name == "none":
        return None
    for entry in _entry_points(name=name):
        try:
            factory = entry.load()
            register(name, factory)
        except Exception as exc:  # import errors, a missing attribute, a value that is no factory
            _broken.add(name)
            _warn(
                name,
                "instrument: recorder entry point %r (%s) is skipped: %s: %s",
                name,
                entry.value,
                type(exc).__name__,
                exc,
            )
            return None
        return _REGISTRY[name]
    return None
