"""``instrument rollout start|stop|status``: fan a profiler call out to every vLLM server behind a router.

Workers come from a router's ``/workers`` (or repeated ``--worker-url``); each is called with
bounded concurrency and its own overall deadline (:mod:`instrument._http`); one dead, slow or
broken worker never stops the others and always becomes a row of the table, never a traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from instrument._http import HttpError, check_http_url, check_timeout
from instrument._http import request as http_request
from instrument.backends.vllm import EngineProfilerError, HttpEngineDriver

__all__ = ["WorkerOutcome", "fan_out", "list_router_workers", "render_table"]

ACTIONS = ("start", "stop", "status")


@dataclass(frozen=True)
class WorkerOutcome:
    """What one worker answered."""

    url: str
    ok: bool
    detail: str
    seconds: float


def _worker_urls(payload: Any) -> list[tuple[str, bool]]:
    """``(url, healthy)`` pairs from the shapes routers answer with; ``ValueError`` otherwise."""
    items = payload
    if isinstance(payload, dict):
        for key in ("workers", "urls", "worker_urls"):
            if key in payload:
                items = payload[key]
                break
        else:
            raise ValueError(f"expected a list of workers or a 'workers' / 'urls' list, got keys {sorted(payload)}")
    if not isinstance(items, list):
        raise ValueError(f"expected a list of workers, got {type(items).__name__}")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, True))
        elif isinstance(item, dict) and isinstance(item.get("url"), str):
            healthy = item.get("is_healthy", item.get("healthy", True))
            status = str(item.get("status", "")).lower()
            out.append((item["url"], bool(healthy) and status not in ("unhealthy", "dead", "down")))
        else:
            raise ValueError(f"a worker must be a URL or an object with a 'url': {item!r}")
    return out


def list_router_workers(router_url: str, *, timeout_s: float = 10.0) -> list[tuple[str, bool]]:
    """The router's workers as ``(url, healthy)``; ``ValueError`` with a clear message on any problem.

    Reads ``GET /workers`` (vLLM's router and SGLang's gateway: ``{"workers": [{"url", "is_healthy"}]}``),
    falling back to ``GET /list_workers`` (``{"urls": [...]}``, no health). Each request has
    ``timeout_s`` overall.
    """
    base = check_http_url(router_url)
    check_timeout(timeout_s)
    route = "/workers"
    try:
        status, body = http_request(f"{base}{route}", timeout_s=timeout_s)
        if status == 404:  # older routers list URLs only
            route = "/list_workers"
            status, body = http_request(f"{base}{route}", timeout_s=timeout_s)
    except HttpError as exc:  # its message names the request and what went wrong
        raise ValueError(f"router: {exc}") from None
    if status != 200:
        raise ValueError(f"{base}{route} answered {status}")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"{base}{route} did not answer JSON: {body[:120]!r}") from exc
    try:
        workers = _worker_urls(payload)
    except ValueError as exc:
        raise ValueError(f"{base}{route}: {exc}") from exc
    if not workers:
        raise ValueError(f"{base}{route} lists no worker")
    return workers


def _act(action: str, url: str, prefix: str | None, timeout_s: float, stop_timeout_s: float) -> WorkerOutcome:
    started = time.monotonic()
    try:
        driver = HttpEngineDriver(url, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)
        if action == "start":
            driver.start(prefix)
            detail = "profiling"
        elif action == "stop":
            driver.stop()
            detail = "stopped, traces flushed"
        else:
            has_routes = driver.has_profiler_routes()
            detail = "profiling routes present" if has_routes else "no profiling routes (started without a profiler)"
            return WorkerOutcome(url, has_routes, detail, time.monotonic() - started)
        return WorkerOutcome(url, True, detail, time.monotonic() - started)
    except (EngineProfilerError, HttpError, ValueError) as exc:
        return WorkerOutcome(url, False, str(exc), time.monotonic() - started)
    except OSError as exc:
        return WorkerOutcome(url, False, f"unreachable: {exc}", time.monotonic() - started)
    except Exception as exc:  # a row, never a traceback that loses every other worker's row
        return WorkerOutcome(url, False, f"{type(exc).__name__}: {exc}", time.monotonic() - started)


def fan_out(
    action: str,
    urls: Sequence[str],
    *,
    prefix: str | None = None,
    concurrency: int = 16,
    timeout_s: float = 10.0,
    stop_timeout_s: float = 600.0,
) -> list[WorkerOutcome]:
    """Run ``action`` on every worker, at most ``concurrency`` at a time; outcomes in input order.

    Each call ends by its deadline (``timeout_s``; ``stop_timeout_s`` for ``stop``), so the whole
    run ends by about ``ceil(len(urls) / concurrency)`` deadlines. A start that meets a running
    profiler (409) stops it and starts again: up to ``2 * timeout_s + stop_timeout_s``.
    """
    if action not in ACTIONS:
        raise ValueError(f"'action' must be one of {', '.join(ACTIONS)}: {action!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"'concurrency' must be an int >= 1: {concurrency!r}")
    if concurrency < 1:
        raise ValueError(f"'concurrency' must be >= 1: {concurrency}")
    check_timeout(timeout_s, "timeout_s")
    check_timeout(stop_timeout_s, "stop_timeout_s")
    with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(urls)))) as pool:
        return list(pool.map(lambda url: _act(action, url, prefix, timeout_s, stop_timeout_s), urls))


def render_table(outcomes: Sequence[WorkerOutcome]) -> str:
    """A per-worker table: URL, OK / FAILED, seconds, detail."""
    width = max([len("worker"), *(len(o.url) for o in outcomes)])
    lines = [f"{'worker':<{width}}  result  seconds  detail"]
    for o in outcomes:
        lines.append(f"{o.url:<{width}}  {'ok' if o.ok else 'FAILED':<6}  {o.seconds:7.2f}  {o.detail}")
    failed = sum(not o.ok for o in outcomes)
    lines.append(f"{len(outcomes) - failed} of {len(outcomes)} workers ok" + (f", {failed} failed" if failed else ""))
    return "\n".join(lines)
