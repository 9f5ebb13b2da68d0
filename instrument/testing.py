"""Helpers for tests of code that uses instrument (ours and users').

``reset()`` ends the current run without its finish hook and forgets it, so every test
starts from "not configured".  Use it in a fixture::

    @pytest.fixture(autouse=True)
    def _clean_instrument():
        yield
        instrument.testing.reset()
"""

from __future__ import annotations

from instrument._session import STATE, uninstall_process_hooks

__all__ = ["reset"]


def reset() -> None:
    """Close any open run (traces are flushed, the finish hook is not run) and clear all state."""
    session = STATE.session
    if session is not None:
        session.finish(run_hook=False)
    STATE.session = None
    STATE.recording = False
    STATE.engaged = False
    uninstall_process_hooks()
