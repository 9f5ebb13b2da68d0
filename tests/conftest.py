"""Shared fixtures: every test starts and ends unconfigured."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import instrument.testing


@pytest.fixture(autouse=True)
def _unconfigured() -> Iterator[None]:
    instrument.testing.reset()
    yield
    instrument.testing.reset()


def load_trace(path: str | Path) -> dict[str, Any]:
    """A gzip'd chrome trace as a dict."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def event_names(path: str | Path) -> set[str]:
    """Names of the events in a trace."""
    return {str(event.get("name")) for event in load_trace(path)["traceEvents"]}
