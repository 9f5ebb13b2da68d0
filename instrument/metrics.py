"""Always-on stage timing as Prometheus metrics: *when and where* a step got slow, on every step and rank.

Enabled by ``ProfilerConfig(metrics=True)``: every ``@profiled_stage`` and ``profile_window``
then records its duration on every step, profiled or not. Metrics (``prometheus_client``, the
``metrics`` extra):

==========================================  =========  ==========================================
``instrument_stage_seconds{role,stage}``    histogram  each stage call (``stage="mini_batch"`` for windows)
``instrument_step_seconds{role}``           histogram  each ``profile_step``
``instrument_steps_total{role}``            counter    steps
``instrument_profile_windows_total{role}``  counter    traces saved (windows, stages, steps)
``instrument_profile_failures_total{role}`` counter    failures the SDK absorbed
``instrument_trace_bytes_total{role}``      counter    bytes of traces written
==========================================  =========  ==========================================

``rank`` is added as a label only with ``metrics_rank_label=True`` (one series per rank).
Label children are bound once per stage. With ``PROMETHEUS_MULTIPROC_DIR`` set (before the
workers start), forked workers share one scrape through :func:`serve`. Nothing here raises into
training.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from instrument._extras import needs_extra

__all__ = ["StageMetrics", "serve"]

logger = logging.getLogger(__name__)

# Stages run from milliseconds (a log-prob pass) to minutes (a rollout).
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

_shared: dict[tuple[str, bool], Any] = {}


def _prometheus_client(what: str) -> Any:
    """``prometheus_client``, or a ``ModuleNotFoundError`` naming the ``metrics`` extra."""
    try:
        import prometheus_client
    except ModuleNotFoundError as exc:
        raise needs_extra(what, "metrics", exc) from exc
    return prometheus_client


def _families(rank_label: bool) -> Any:
    """The metric families, created once per process (prometheus_client refuses duplicates).

    The first session decides whether they carry ``rank``; a later session of the same process
    asking otherwise gets them as they are, with a warning.
    """
    for (_, labelled), families in _shared.items():
        if labelled != rank_label:
            logger.warning(
                "instrument: metrics already registered %s a rank label in this process",
                "with" if labelled else "without",
            )
            return families
    key = ("families", rank_label)
    if key not in _shared:
        client = _prometheus_client("ProfilerConfig(metrics=True)")
        Counter, Histogram = client.Counter, client.Histogram  # noqa: N806 - the library's class names

        extra = ["rank"] if rank_label else []
        _shared[key] = {
            "stage": Histogram(
                "instrument_stage_seconds",
                "Duration of instrument stages and mini-batch windows.",
                ["role", "stage", *extra],
                buckets=_BUCKETS,
            ),
            "step": Histogram(
                "instrument_step_seconds", "Duration of RL steps (profile_step).", ["role", *extra], buckets=_BUCKETS
            ),
            "steps": Counter("instrument_steps", "RL steps seen.", ["role", *extra]),
            "windows": Counter("instrument_profile_windows", "Traces saved.", ["role", *extra]),
            "failures": Counter("instrument_profile_failures", "SDK failures absorbed.", ["role", *extra]),
            "bytes": Counter("instrument_trace_bytes", "Bytes of traces written.", ["role", *extra]),
        }
    return _shared[key]


class StageMetrics:
    """The metrics of one session: bound label children, one ``observe`` per stage call."""

    def __init__(self, *, role: str, rank: int, rank_label: bool) -> None:
        families = _families(rank_label)
        rank_label = "rank" in families["step"]._labelnames
        self._labels: tuple[str, ...] = (role, str(rank)) if rank_label else (role,)
        self._role, self._rank_label, self._rank = role, rank_label, rank
        self._stage_family = families["stage"]
        self.observers: dict[tuple[str | None, str], Callable[[float], None]] = {}
        """``(role, stage)`` -> its bound ``observe`` (role ``None``: the process's); decorated calls read it
        directly once a stage is in it."""
        self.step = families["step"].labels(*self._labels)
        self.steps = families["steps"].labels(*self._labels)
        self.windows = families["windows"].labels(*self._labels)
        self.failures = families["failures"].labels(*self._labels)
        self.bytes = families["bytes"].labels(*self._labels)

    def stage_observer(self, stage: str, role: str | None = None) -> Callable[[float], None]:
        """The bound ``observe`` of a stage's histogram child (created once per stage and role).

        ``role``: the stage's own (``profiled_stage(name, role="critic")``), as its traces are named;
        ``None`` is the process's role.
        """
        observe = self.observers.get((role, stage))
        if observe is None:
            named = self._role if role is None else role
            labels = (named, stage, str(self._rank)) if self._rank_label else (named, stage)
            observe = self.observers[role, stage] = self._stage_family.labels(*labels).observe
        return observe


def serve(port: int, addr: str = "127.0.0.1") -> Any:
    """Expose ``/metrics`` on ``addr:port`` (loopback by default); returns the server.

    Raises ``ModuleNotFoundError`` naming ``pip install 'instrument-rl[metrics]'`` without ``prometheus_client``.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, the scrape aggregates every process that wrote there
    (forked workers included).
    """
    client = _prometheus_client("instrument.metrics.serve()")
    registry: Any = client.REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _thread = client.start_http_server(port, addr=addr, registry=registry)
    return server
