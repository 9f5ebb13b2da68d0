"""``instrument rollout start|stop|status``: fan a profiler call out to every engine server behind a router.

Workers come from a router's ``/workers`` (or repeated ``--worker-url``); each is called with
bounded concurrency and its own overall deadline (:mod:`instrument.rollout._http`); one dead, slow or
broken worker never stops the others and always becomes a row of the table, never a traceback.
Each worker is driven by the :class:`~instrument.rollout.ServerDriver` its engine's profile makes
(``EngineProfile.http_driver``); nothing here knows which engine it is.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from instrument._terminal import Display, wanted
from instrument.rollout._engines import ServerDriver
from instrument.rollout._http import HttpError, check_http_url, check_timeout
from instrument.rollout._http import request as http_request
from instrument.rollout._profiler import EngineProfilerError, EngineStillFlushingError, NotProfilingError

__all__ = [
    "STATES",
    "DriverFactory",
    "EngineProgress",
    "NotProfilingError",
    "WorkerOutcome",
    "fan_out",
    "list_router_workers",
    "render_table",
]

ACTIONS = ("start", "stop", "status")
_WAITING = {"start": "starting the profiler", "stop": "waiting for flush", "status": "checking"}


@dataclass(frozen=True)
class WorkerOutcome:
    """What one worker answered: ``state`` is one of :data:`STATES`, ``detail`` says it in words."""

    url: str
    ok: bool
    detail: str
    seconds: float
    state: str = "failed"


STATES = (
    "profiling",  # start: it is profiling now
    "restarted",  # start: it was profiling already; stopped (flushed) and started again
    "flushed",  # stop: stopped after a start recorded here, traces written
    "not-profiling",  # stop: nothing was profiling (no start recorded here, or the engine refused the stop)
    "still-flushing",  # stop: past its deadline while the server answers /health
    "routes",  # status: it has profiling routes
    "no-routes",  # status: started without a profiler
    "unhealthy",  # the router says so: not contacted
    "failed",  # anything else that went wrong; detail says what
)


# sgl-router --dp-aware lists one entry per DP rank of a server, "http://host:port@{rank}".
_DP_RANK_SUFFIX = re.compile(r"@\d+$")


def _worker_urls(payload: Any) -> list[tuple[str, bool]]:
    """``(url, healthy)`` pairs from the shapes routers answer with; ``ValueError`` otherwise.

    The entries of one server's DP ranks (``http://host:port@0``, ``@1``; sgl-router ``--dp-aware``)
    become that server, once, healthy when any of them is: its profiler is the server's.
    """
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
    servers: dict[str, bool] = {}
    for url, healthy in out:
        server = _DP_RANK_SUFFIX.sub("", url)
        servers[server] = servers.get(server, False) or healthy
    return list(servers.items())


def list_router_workers(router_url: str, *, timeout_s: float = 10.0) -> list[tuple[str, bool]]:
    """The router's workers as ``(url, healthy)``; ``ValueError`` with a clear message on any problem.

    Reads ``GET /workers`` (vLLM's router and SGLang's gateway: ``{"workers": [{"url", "is_healthy"}]}``),
    falling back to ``GET /list_workers`` (``{"urls": [...]}``, no health). A server answering 404
    to both is not a router (a stale port now serving a vLLM worker, say). Each request has
    ``timeout_s`` overall.
    """
    base = check_http_url(router_url, "router URL")
    check_timeout(timeout_s)
    route = "/workers"
    try:
        status, body = http_request(f"{base}{route}", timeout_s=timeout_s)
        if status == 404:  # older routers list URLs only
            route = "/list_workers"
            status, body = http_request(f"{base}{route}", timeout_s=timeout_s)
    except HttpError as exc:  # its message names the request and what went wrong
        raise ValueError(f"router: {exc}") from None
    if status == 404:
        raise ValueError(
            f"{base} is not a router (no /workers, no /list_workers: both answered 404); "
            "if it is a vLLM server, pass it with --worker-url"
        )
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


DriverFactory = Callable[[str, float, float], ServerDriver]
"""``(url, timeout_s, stop_timeout_s) -> driver``: the :class:`~instrument.rollout.ServerDriver` of one
worker. A driver whose ``refuses_idle_stop`` is true raises :class:`NotProfilingError` from a stop
when nothing was profiling, so a stop it accepts flushed something even without a start recorded here."""


def _act(
    action: str,
    url: str,
    prefix: str | None,
    timeout_s: float,
    stop_timeout_s: float,
    driver_for: DriverFactory,
    started_here: bool | None,
) -> WorkerOutcome:
    started = time.monotonic()

    def outcome(ok: bool, state: str, detail: str) -> WorkerOutcome:
        return WorkerOutcome(url, ok, detail, time.monotonic() - started, state)

    try:
        driver = driver_for(url, timeout_s, stop_timeout_s)
        if action == "start":
            if driver.start_profile(prefix):
                return outcome(True, "restarted", "was profiling: restarted; earlier traces flushed under their prefix")
            return outcome(True, "profiling", "profiling")
        if action == "stop":
            try:
                driver.stop()
            except NotProfilingError as exc:
                return outcome(True, "not-profiling", str(exc))
            if started_here is False and getattr(driver, "refuses_idle_stop", False):
                return outcome(True, "flushed", "was profiling (not started from here): stopped, traces flushed")
            if started_here is False:  # an engine that accepts a stop when idle flushed nothing for it
                return outcome(True, "not-profiling", "not profiling: nothing flushed (no start recorded for it)")
            return outcome(True, "flushed", "stopped, traces flushed")
        if driver.has_profiler_routes():
            return outcome(True, "routes", "profiling routes present")
        return outcome(False, "no-routes", "no profiling routes (started without a profiler)")
    except EngineStillFlushingError as exc:
        return outcome(False, "still-flushing", str(exc))
    except (EngineProfilerError, HttpError, ValueError) as exc:
        return outcome(False, "failed", str(exc))
    except OSError as exc:
        return outcome(False, "failed", f"unreachable: {exc}")
    except Exception as exc:  # a row, never a traceback that loses every other worker's row
        return outcome(False, "failed", f"{type(exc).__name__}: {exc}")


def fan_out(
    action: str,
    urls: Sequence[str],
    *,
    prefix: str | None = None,
    concurrency: int = 16,
    timeout_s: float = 10.0,
    stop_timeout_s: float = 600.0,
    driver_for: DriverFactory,
    progress: Callable[[str, WorkerOutcome | None], None] | None = None,
    started: Collection[str] | None = None,
) -> list[WorkerOutcome]:
    """Run ``action`` on every worker, at most ``concurrency`` at a time; outcomes in input order.

    Each call ends by its deadline (``timeout_s``; ``stop_timeout_s`` for ``stop``), so the whole
    run ends by about ``ceil(len(urls) / concurrency)`` deadlines. A start that meets a running
    profiler (409) stops it and starts again (state ``restarted``): up to ``2 * timeout_s +
    stop_timeout_s``. A stop past its deadline is ``still-flushing`` when the server answers
    ``/health`` (one more ``min(timeout_s, 5)`` s). ``progress(url, None)`` is called as a worker's
    call begins, ``progress(url, outcome)`` as it ends (from the calling threads; it must not
    raise). ``driver_for`` makes each worker's driver. ``started``, when given,
    lists the workers whose start was recorded: a stop of any other is ``not-profiling``.
    """
    if action not in ACTIONS:
        raise ValueError(f"'action' must be one of {', '.join(ACTIONS)}: {action!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"'concurrency' must be an int >= 1: {concurrency!r}")
    if concurrency < 1:
        raise ValueError(f"'concurrency' must be >= 1: {concurrency}")
    check_timeout(timeout_s, "timeout_s")
    check_timeout(stop_timeout_s, "stop_timeout_s")

    def call(url: str) -> WorkerOutcome:
        if progress is not None:
            progress(url, None)
        here = None if started is None else url in started
        outcome = _act(action, url, prefix, timeout_s, stop_timeout_s, driver_for, here)
        if progress is not None:
            progress(url, outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(urls)))) as pool:
        return list(pool.map(call, urls))


def render_table(outcomes: Sequence[WorkerOutcome]) -> str:
    """A per-worker table: URL, OK / FAILED, seconds, detail."""
    width = max([len("worker"), *(len(o.url) for o in outcomes)])
    lines = [f"{'worker':<{width}}  result  seconds  detail"]
    for o in outcomes:
        lines.append(f"{o.url:<{width}}  {'ok' if o.ok else 'FAILED':<6}  {o.seconds:7.2f}  {o.detail}")
    failed = sum(not o.ok for o in outcomes)
    lines.append(f"{len(outcomes) - failed} of {len(outcomes)} workers ok" + (f", {failed} failed" if failed else ""))
    return "\n".join(lines)


class EngineProgress:
    """Per engine on a terminal (stderr, and stdout a terminal too): waiting, with the time elapsed,
    then how it ended; nothing in pipes, with ``--json`` or ``--quiet`` (:mod:`instrument.finish._progress`)."""

    def __init__(self, action: str, *, quiet: bool = False) -> None:
        shown = not quiet and sys.stdout.isatty() and wanted(sys.stderr)
        self._action = action
        self._display = Display(sys.stderr if shown else None, kind="elapsed")
        self._tasks: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> EngineProgress:
        self._display.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._display.close()

    def __call__(self, url: str, outcome: WorkerOutcome | None) -> None:
        with self._lock:  # called from the fan-out threads
            if outcome is None:
                self._tasks[url] = self._display.add(f"{url}: {_WAITING.get(self._action, self._action)}")
                return
            task = self._tasks.get(url)
        ended = outcome.state.replace("-", " ") if outcome.ok or outcome.state == "still-flushing" else "FAILED"
        self._display.update(task, description=f"{url}: {ended} after {outcome.seconds:.1f} s")
        self._display.stop_task(task)
