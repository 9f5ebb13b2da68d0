"""The flags the hot path reads, one object per process (no imports: everything may import it)."""

from __future__ import annotations

from typing import Any

__all__ = ["STATE"]


class _State:
    """``recording``: a profiled step is open on this rank; ``engaged``: recording, or stage metrics
    on (decorated calls take the slow path); ``session``: the run of this process, if any."""

    __slots__ = ("engaged", "recording", "session")

    def __init__(self) -> None:
        self.recording = False
        self.engaged = False
        self.session: Any = None  # instrument._session.Session (not imported: no cycle)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Decorated methods hold this object in their closure, and Ray pickles worker classes
        # by value: unpickling must give the receiving process's own state, not a frozen copy.
        return (_process_state, ())


STATE = _State()


def _process_state() -> _State:
    return STATE
