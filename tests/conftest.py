"""Shared fixtures: every test starts and ends unconfigured."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import instrument.testing
from instrument.naming import TIMELINE_SUFFIX

_T = TypeVar("_T")
_DATA = Path(__file__).parent / "data"


def _data_files() -> set[str]:
    return {os.path.join(root, name) for root, _dirs, names in os.walk(_DATA) for name in names}


@pytest.fixture(autouse=True)
def _unconfigured() -> Iterator[None]:
    instrument.testing.reset()
    yield
    instrument.testing.reset()


@pytest.fixture(autouse=True)
def _data_untouched() -> Iterator[None]:
    """Committed test data is read, never written: a test that analyses it in place must not leave a picture."""
    before = _data_files()
    yield
    added = _data_files() - before
    for path in added:
        os.unlink(path)  # the next tests see the data as committed
    assert not added, f"this test wrote into tests/data: {sorted(added)}"


def load_trace(path: str | Path) -> dict[str, Any]:
    """A gzip'd chrome trace as a dict."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def event_names(path: str | Path) -> set[str]:
    """Names of the events in a trace."""
    return {str(event.get("name")) for event in load_trace(path)["traceEvents"]}


def without_timeline(items: Iterable[_T]) -> list[_T]:
    """What a run wrote less its step timeline file (``timeline=True``, the default, adds one per process):
    paths or names (``str`` or ``Path``), ``TraceRecord``s or manifest lines (dicts), in their order."""

    def path(item: Any) -> str:
        if isinstance(item, (str, os.PathLike)):
            return os.fspath(item)
        return str(item["path"] if isinstance(item, dict) else item.path)

    return [item for item in items if not path(item).endswith(TIMELINE_SUFFIX)]


SPAWN_GUARD_S = 600.0
"""Ranks still running after this are killed and the test fails: a hang guard, never a timing."""


def spawn_ranks(target: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``target(rank, *args)`` in ``nprocs`` real processes (torch.multiprocessing) and wait for them all;
    a rank that fails fails the test, ranks that hang are killed after :data:`SPAWN_GUARD_S`."""
    import torch.multiprocessing as mp

    spawn: Any = mp.spawn  # type: ignore[attr-defined,unused-ignore]
    context = spawn(target, args=args, nprocs=nprocs, join=False)
    assert context is not None
    guard = time.monotonic() + SPAWN_GUARD_S
    while not context.join(timeout=1):
        if time.monotonic() > guard:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks were still running after {SPAWN_GUARD_S:g} s")
