"""The one list of tool names: name -> how to build its recorder, and what the run must know about it.

Built-in recorders are registered as ``"module:Class"`` strings, imported when a run first builds
one (``import instrument`` imports no torch). Third-party recorders come from :func:`register`, or
from the entry-point group ``instrument.recorders``, read only when a name is not registered
(validated or looked up): ``entry_points(group="instrument.recorders", name=...)``, the way
OpenTelemetry finds its providers. A bad entry point logs one warning and counts as unknown.
A tool ``"a+b"`` is built as one recorder per part, driven as one (:class:`Recorders`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from instrument._extras import needs_extra
from instrument._warnings import WarnOnce
from instrument.recorders._combined import Recorders
from instrument.recorders._protocol import Publish, Recorder, RecorderFactory, Report

__all__ = [
    "BUILT_IN_TOOLS",
    "ENTRY_POINT_GROUP",
    "Registration",
    "build",
    "override",
    "recorder_class",
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

    factory: str | RecorderFactory
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
    """The ``instrument[...]`` extra installing what its module imports, named when that is missing."""


_REGISTRY: dict[str, Registration] = {
    "torch": Registration("instrument.recorders.torch:TorchBackend", uses_cupti=True, extra="torch"),
    "nvtx": Registration("instrument.recorders.nvtx:NvtxBackend", extra="nvtx"),
    # CUDA memory snapshots, alone or beside a tracer (docs/memory.md)
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
    factory: str | RecorderFactory,
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


def recorder_class(name: str) -> RecorderFactory:
    """The factory (usually a class) of recorder ``name``, importing its module on first use."""
    found = registration(name)
    if isinstance(found.factory, str):
        module, _, attribute = found.factory.partition(":")
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # a missing third-party package reads better as the extra to install than as a traceback
            if found.extra is None or (exc.name or "instrument").partition(".")[0] == "instrument":
                raise
            raise needs_extra(f"tool={name!r}", found.extra, exc) from exc
        loaded: RecorderFactory = getattr(imported, attribute)
        if _REGISTRY.get(name) is found:  # not replaced meanwhile
            _REGISTRY[name] = replace(found, factory=loaded)
        return loaded
    return found.factory


def uses_cupti(tool: str) -> bool:
    """Whether a recorder of ``tool`` (``"a+b"``: any part) records CUDA through CUPTI; unknown names do not."""
    for name in tool.split("+"):
        with contextlib.suppress(KeyError):
            if registration(name).uses_cupti:
                return True
    return False


# ---------------------------------------------------------------------- building


@dataclass(frozen=True)
class _Override:
    factory: RecorderFactory
    alongside: bool


_overrides: list[_Override] = []


@contextlib.contextmanager
def override(factory: RecorderFactory, *, alongside: bool = False) -> Iterator[None]:
    """Runs whose recorder is built inside the block record with ``factory(publish, report)`` instead of the
    configured tool's recorders (``alongside=True``: beside them). The test seam of
    :func:`instrument.testing.capture`; process-wide, the innermost block wins."""
    entry = _Override(factory, alongside)
    _overrides.append(entry)
    try:
        yield
    finally:
        _overrides.remove(entry)


def build(tool: str, publish: Publish, report: Report, *, config: Any) -> Recorder:
    """The recorder a run with ``config`` (a ``ProfilerConfig`` naming ``tool``) drives.

    ``"a+b"``: one per part in the order written, outermost ones first, driven as one. Raises what a
    factory raises (the session absorbs it); the recorders built before it are closed.
    """
    chosen = _overrides[-1] if _overrides else None
    names = [] if chosen is not None and not chosen.alongside else tool.split("+")
    parts = sorted(((name, registration(name)) for name in names), key=lambda pair: not pair[1].outermost)
    built: list[Recorder] = []
    try:
        for name, part in parts:
            factory = recorder_class(name)
            if part.options is None:
                built.append(factory(publish, report))
            else:
                built.append(factory(publish, report, options=getattr(config, part.options)))
        if chosen is not None:
            built.append(chosen.factory(publish, report))
    except BaseException:
        for recorder in reversed(built):
            with contextlib.suppress(Exception):
                recorder.close()
        raise
    return built[0] if len(built) == 1 else Recorders(built)


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
