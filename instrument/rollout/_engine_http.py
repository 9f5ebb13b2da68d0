"""What every HTTP engine driver does the same way: the stop that waits for the flush, and the health probe."""

from __future__ import annotations

from instrument.rollout._http import HttpTimeoutError
from instrument.rollout._http import request as http_request
from instrument.rollout._profiler import EngineStillFlushingError

__all__ = ["HEALTH_TIMEOUT_S", "post_stop_profile", "server_healthy"]

HEALTH_TIMEOUT_S = 5.0
"""The ``/health`` probe after a stop ran out of time: a live server answers at once."""


def server_healthy(base_url: str, timeout_s: float) -> bool:
    """Whether ``GET /health`` answers 200 within ``min(timeout_s, 5)`` seconds; never raises."""
    try:
        status, _ = http_request(f"{base_url}/health", timeout_s=min(timeout_s, HEALTH_TIMEOUT_S))
    except (OSError, ValueError):
        return False
    return status == 200


def post_stop_profile(base_url: str, *, timeout_s: float, stop_timeout_s: float, engine: str) -> tuple[int, bytes]:
    """``POST /stop_profile``, waiting up to ``stop_timeout_s`` for the flush; the status and body.

    Past the deadline, a server that still answers ``/health`` raises :class:`EngineStillFlushingError`
    (it goes on writing); one that does not re-raises the timeout.
    """
    try:
        return http_request(f"{base_url}/stop_profile", method="POST", timeout_s=stop_timeout_s)
    except HttpTimeoutError:
        if server_healthy(base_url, timeout_s):
            raise EngineStillFlushingError(
                f"{base_url}: still flushing after {stop_timeout_s:g} s (the server answers /health); "
                f"its traces appear once {engine} has written them: wait, or raise the stop timeout"
            ) from None
        raise
