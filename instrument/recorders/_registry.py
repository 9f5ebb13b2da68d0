"""Building recorders from the one list of tool names (:mod:`instrument._tools`, re-exported here).

The list sits below :mod:`instrument.config`, which validates tool names against it; this module
adds what needs the recorders: importing a ``"module:Class"`` factory on first use
(:func:`recorder_class`), building a run's recorders (:func:`build`, ``"a+b"`` as one
:class:`Recorders`) and the test seam :func:`override`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from instrument._extras import needs_extra
from instrument._tools import (
    BUILT_IN_TOOLS,
    ENTRY_POINT_GROUP,
    Registration,
    keep_imported,
    register,
    registered_tools,
    registration,
    uses_cupti,
)
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
        keep_imported(name, found, loaded)
        return loaded
    return found.factory


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
