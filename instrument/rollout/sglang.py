"""Profile SGLang rollout engines: launch environment, the ``/start_profile`` body, an HTTP driver, trace names.

SGLang always serves ``/start_profile`` and ``/stop_profile``; what a start can ask for grew
release by release. Read from the release wheels (``sglang/srt/managers/io_struct.py``, the
``ProfileReqInput`` dataclass, from 0.5.15 the ``ProfileReq`` struct itself is the body;
``entrypoints/http_server.py``; the scheduler's profiler mixin, from 0.5.14
``managers/scheduler_components/profiler_manager.py``):

===========  ================================================================================
release      what changed
===========  ================================================================================
<= 0.4.3     no body; a profiler only when ``SGLANG_TORCH_PROFILER_DIR`` is set at launch;
             ``/stop_profile`` returns before the trace is written; names ``{time}.trace.json.gz``
0.4.4        body ``output_dir``, ``num_steps``, ``activities``; names ``{id}-TP-{t}.trace.json.gz``
0.4.6.post5  ``with_stack``, ``record_shapes``
0.4.7        ``profile_by_stage``; ``/stop_profile`` waits for the flush (fails when not profiling);
             ``SGLANG_PROFILE_WITH_STACK`` (default true; false overrides the body)
0.4.10       ``start_step`` (a forward count since the server started, not relative)
0.5.3        stage names ``-EXTEND`` / ``-DECODE`` (``str(ForwardMode)`` before: ``-1`` / ``-2``)
0.5.4        ``merge_profiles``
0.5.5        ``SGLANG_PROFILE_RECORD_SHAPES`` (default true; false overrides the body)
0.5.6        ``profile_prefix`` (names ``{prefix}-{id}-TP-…``), ``profile_stages``
0.5.8        ``GET /server_info`` (``/get_server_info`` before; both name the version)
0.5.15       ``profile_id`` (the body is the ``ProfileReq`` struct)
0.5.19       ``detailed_annotations``
===========  ================================================================================

Unknown body fields are ignored by every release (pydantic's default), so the version decides
what is *honoured*; only fields the target knows are sent, and a wish it cannot honour is warned
about. :data:`PROFILE` is SGLang's :class:`~instrument.rollout.EngineProfile` (trace names
:data:`TRACES`; :class:`SglangWorker` drives a server for ``instrument rollout``), registered as
a built-in. Imports neither SGLang nor torch.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import time
from typing import Any

from instrument import ranks
from instrument.config import ProfilerConfig
from instrument.rollout._engine_http import post_stop_profile, server_healthy
from instrument.rollout._engines import EngineProfile
from instrument.rollout._http import check_http_url, check_timeout
from instrument.rollout._http import request as http_request
from instrument.rollout._profiler import EngineProfilerError, LaunchArgs, NotProfilingError

__all__ = [
    "PROFILE",
    "SGLANG_TRACES",
    "TRACES",
    "LaunchArgs",
    "SglangHttpDriver",
    "SglangRefusedError",
    "SglangWorker",
    "check_prefix",
    "installed_sglang_version",
    "parse_version",
    "profiler_launch_args",
    "sglang_start_body",
    "sglang_trace_local_rank",
    "start_body_fields",
]

logger = logging.getLogger(__name__)

# SGLang: "[{prefix}-]{profile_id}-TP-{t}[-DP-{d}][-PP-{p}][-EP-{e}][-memory][-{stage}]" + ".trace.json.gz" or
# ".pickle" (memory snapshots). Stage suffixes: "-EXTEND" / "-DECODE" (0.5.3+), "-prefill" / "-decode"
# (SGLANG_PROFILE_V2), str(ForwardMode) before (0.4.7-0.5.2: "-1" / "-2" on Python >= 3.11,
# "-ForwardMode.EXTEND" before); activities ("-CPU"); ROCm: "rpd-{time}-TP-{t}.trace.json.gz".
# EP ranks live on the TP ranks' GPUs. With -DP- or -PP- the GPU depends on the engine's mode and
# sizes (DP attention numbers TP ranks across DP ranks, plain DP does not): recognised, rank unknown.
_SGLANG_TAIL = r"(?:-EP-\d+)?(?:-memory)?(?:-(?:ForwardMode\.)?[A-Za-z]+|-\d+)?\.(?:trace\.json(?:\.gz)?|pickle)$"
TRACES = ranks.TraceNames(
    engine="sglang",
    workers=(rf"-TP-(?P<rank>\d+){_SGLANG_TAIL}", rf"-TP-\d+(?:-DP-\d+)?(?:-PP-\d+)?{_SGLANG_TAIL}"),
    prefix_joint="-",
)
"""How SGLang names its trace files (``[{prefix}-]{id}-TP-{t}[-DP-{d}][-PP-{p}][-EP-{e}]…`` and memory
snapshots): the one copy of it, registered in :mod:`instrument.ranks` with :data:`PROFILE`."""

SGLANG_TRACES = TRACES
"""The former name of :data:`TRACES`."""

Version = tuple[int, int, int, int]  # major, minor, patch, post

NEWEST: Version = (99, 0, 0, 0)
"""Assumed when the version is unknown: the newest behaviour."""

BODY_SINCE: Version = (0, 4, 4, 0)
"""First SGLang release whose ``/start_profile`` reads a JSON body."""

STOP_WAITS_SINCE: Version = (0, 4, 7, 0)
"""First SGLang release whose ``/stop_profile`` answers once the traces are written."""

# /start_profile body fields by the release that first read them from the HTTP body.
_FIELDS_SINCE: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 4, 4, 0), frozenset({"output_dir", "num_steps", "activities"})),
    ((0, 4, 6, 5), frozenset({"with_stack", "record_shapes"})),
    ((0, 4, 7, 0), frozenset({"profile_by_stage"})),
    ((0, 4, 10, 0), frozenset({"start_step"})),
    ((0, 5, 4, 0), frozenset({"merge_profiles"})),
    ((0, 5, 6, 0), frozenset({"profile_prefix", "profile_stages"})),
    ((0, 5, 15, 0), frozenset({"profile_id"})),
    ((0, 5, 19, 0), frozenset({"detailed_annotations"})),
)
_ENV_SINCE: dict[str, Version] = {
    "SGLANG_TORCH_PROFILER_DIR": (0, 0, 0, 0),
    "SGLANG_PROFILE_WITH_STACK": (0, 4, 7, 0),
    "SGLANG_PROFILE_RECORD_SHAPES": (0, 5, 5, 0),
}
# ProfilerConfig.contents -> SGLang activities ("MEM": CUDA memory history, saved as a .pickle snapshot).
_ACTIVITIES = (("cpu", "CPU"), ("cuda", "GPU"), ("memory", "MEM"))
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.=+_-]{0,63}$")  # SGLang joins it into a path: no "/" ever


# --------------------------------------------------------------------------- versions


def installed_sglang_version() -> str | None:
    """The installed SGLang version, or ``None``."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_version(version: str) -> Version:
    """``"0.4.6.post5"`` as ``(0, 4, 6, 5)``; ``ValueError`` naming the value for anything else."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?", version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"'sglang_version' must look like '0.5.23' or '0.4.6.post5': {version!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0), int(match[4] or 0)


def _target(sglang_version: str | None) -> Version:
    version = sglang_version or installed_sglang_version()
    return NEWEST if version is None else parse_version(version)


def start_body_fields(sglang_version: str) -> frozenset[str]:
    """The ``/start_profile`` body fields SGLang ``sglang_version`` reads (empty before 0.4.4)."""
    return _fields(parse_version(sglang_version))


def _fields(target: Version) -> frozenset[str]:
    return frozenset().union(*(names for since, names in _FIELDS_SINCE if target >= since))


# --------------------------------------------------------------------------- launch and start


def profiler_launch_args(
    config: ProfilerConfig, *, profiler_dir: str | os.PathLike[str], sglang_version: str | None = None
) -> LaunchArgs:
    """The environment an SGLang server needs for profiling into ``profiler_dir`` (no arguments: none exist).

    ``SGLANG_TORCH_PROFILER_DIR`` (the default output directory; before 0.4.4 the only one, and
    required), and where the version reads them ``SGLANG_PROFILE_WITH_STACK`` /
    ``SGLANG_PROFILE_RECORD_SHAPES`` from ``contents`` (both default to true in SGLang, and false
    there wins over any request: a start without a body records no stack either). The
    environment is returned, never written into ``os.environ``.
    """
    target = _target(sglang_version)
    wanted = {
        "SGLANG_TORCH_PROFILER_DIR": os.path.abspath(profiler_dir),
        "SGLANG_PROFILE_WITH_STACK": "true" if "stack" in config.contents else "false",
        "SGLANG_PROFILE_RECORD_SHAPES": "true" if "shapes" in config.contents else "false",
    }
    env = {name: value for name, value in wanted.items() if target >= _ENV_SINCE[name]}
    return LaunchArgs(args=(), env=env, dropped=tuple(sorted(set(wanted) - set(env))))


def check_prefix(prefix: str | None) -> None:
    """Raise ``ValueError`` for a file-name prefix SGLang cannot take (it joins it into a path: no ``/``)."""
    if prefix is not None and not (isinstance(prefix, str) and _PREFIX.match(prefix)):
        raise ValueError(f"'prefix' must be 1-64 of [A-Za-z0-9.=+_-], starting with a letter or digit: {prefix!r}")


def sglang_start_body(
    config: ProfilerConfig,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    prefix: str | None = None,
    sglang_version: str | None = None,
    profile_by_stage: bool = False,
    num_steps: int | None = None,
) -> dict[str, Any] | None:
    """The JSON body of ``POST /start_profile`` for ``config``, with only the fields SGLang ``sglang_version`` reads.

    ``contents`` → ``activities`` (``cpu`` → ``CPU``, ``cuda`` → ``GPU``, ``memory`` → ``MEM``),
    ``with_stack`` (off unless ``stack``: a stack-laden flush is many times slower) and
    ``record_shapes``; ``output_dir`` is made absolute; ``prefix`` → ``profile_prefix`` (0.5.6+).
    ``num_steps`` (forward passes, then SGLang stops by itself) defaults to the length of
    ``token_window``; SGLang cannot delay the start relative to now (its ``start_step`` counts
    from the server's start), so a window's first iteration is not honoured (warned).
    ``profile_by_stage`` (0.4.7+: one trace per prefill / decode stage, each ``num_steps`` long)
    needs ``num_steps``. A wish the version cannot honour is warned about. Bad values raise
    ``ValueError`` naming the field. ``None`` for releases that read no body (before 0.4.4).
    ``sglang_version`` defaults to the installed SGLang, else the newest behaviour.
    """
    body, notes = _start_body(
        config,
        output_dir=output_dir,
        prefix=prefix,
        target=_target(sglang_version),
        profile_by_stage=profile_by_stage,
        num_steps=num_steps,
    )
    for note in notes:
        logger.warning("instrument: %s", note)
    return body


def _start_body(
    config: ProfilerConfig,
    *,
    output_dir: str | os.PathLike[str] | None,
    prefix: str | None,
    target: Version,
    profile_by_stage: bool,
    num_steps: int | None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """:func:`sglang_start_body`'s body and its warnings, without logging them."""
    if not isinstance(config, ProfilerConfig):
        raise TypeError(f"'config' must be a ProfilerConfig: {type(config).__name__}")
    notes = []
    activities = [name for content, name in _ACTIVITIES if content in config.contents]
    if not activities:
        raise ValueError(f"'contents' must hold cpu, cuda or memory for an SGLang profile (got {config.contents!r})")
    if num_steps is None and config.token_window is not None:
        first, last = config.token_window
        num_steps = last - first + 1
        if first > 0:
            notes.append(
                f"SGLang cannot start profiling {first} iterations from now ('token_window' {config.token_window}): "
                f"it records the first {num_steps} forward passes after the start"
            )
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1):
        raise ValueError(f"'num_steps' must be an int >= 1 or None: {num_steps!r}")
    if not isinstance(profile_by_stage, bool):
        raise TypeError(f"'profile_by_stage' must be a bool: {profile_by_stage!r}")
    if profile_by_stage and num_steps is None:
        # SGLang counts each stage up to num_steps; without it its scheduler fails at the first batch.
        raise ValueError("'profile_by_stage' needs 'num_steps' (or a 'token_window'): SGLang counts each stage to it")
    check_prefix(prefix)
    if target < BODY_SINCE:
        return None, [*notes, f"SGLang {_show(target)} reads no /start_profile body: its launch environment decides"]
    wanted: dict[str, Any] = {
        "activities": activities,
        "with_stack": "stack" in config.contents,
        "record_shapes": "shapes" in config.contents,
    }
    if output_dir is not None:
        wanted["output_dir"] = os.path.abspath(output_dir)
    if num_steps is not None:
        wanted["num_steps"] = num_steps
    if profile_by_stage:
        wanted["profile_by_stage"] = True
    if prefix:
        wanted["profile_prefix"] = prefix
    known = _fields(target)
    body = {key: value for key, value in wanted.items() if key in known}
    unheard = sorted(set(wanted) - set(body) - {"profile_prefix"})  # a prefix only names files: relocation labels them
    if unheard:
        notes.append(f"SGLang {_show(target)} does not read {', '.join(unheard)} from /start_profile: not honoured")
    return body, notes


def _show(version: Version) -> str:
    major, minor, patch, post = version
    return f"{major}.{minor}.{patch}" + (f".post{post}" if post else "")


# --------------------------------------------------------------------------- trace names


def sglang_trace_local_rank(filename: str) -> int | None:
    """The rank inside its replica written in an SGLang trace or memory snapshot name, or ``None``.

    The TP rank, for names without ``-DP-`` / ``-PP-`` (EP ranks live on the TP ranks' GPUs).
    With ``-DP-`` or ``-PP-`` the GPU depends on the engine's mode and sizes (DP attention
    numbers TP ranks across DP ranks, plain DP does not), so ``None``: relocation keeps such a
    file, labelled ``rank-unknown``, rather than risk dropping the wrong one.
    """
    return TRACES.local_rank(filename)


# --------------------------------------------------------------------------- driving


class SglangRefusedError(EngineProfilerError):
    """SGLang refused a start or stop with its bare 500: already profiling, or not profiling."""


class SglangHttpDriver:
    """Start and stop one SGLang server's profiler over HTTP (``POST /start_profile`` with a JSON body,
    ``POST /stop_profile``); an :class:`instrument.rollout.EngineDriver`.

    The body comes from :func:`sglang_start_body` for the server's version: ``sglang_version``,
    else the server's own answer (``GET /server_info``, ``/get_server_info`` before 0.5.8), asked
    once; what that version cannot honour is warned about once. ``output_dir`` is where the
    server writes (give each replica its own, :func:`replica_profiler_dir`); without it, the
    server's ``SGLANG_TORCH_PROFILER_DIR`` (SGLang's default: ``/tmp``). Every call is one
    exchange with an overall deadline (``timeout_s``; ``stop_timeout_s`` for the flush). Failures
    raise :class:`EngineProfilerError` (a bad answer; a stop past its deadline on a live server:
    :class:`EngineStillFlushingError`) or ``OSError`` (no complete answer), each naming the
    request; :class:`RolloutProfiler` absorbs and counts them. Bad settings raise ``ValueError``
    here, naming the field.
    """

    traces = TRACES

    def __init__(
        self,
        base_url: str,
        config: ProfilerConfig,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        sglang_version: str | None = None,
        profile_by_stage: bool = False,
        num_steps: int | None = None,
        timeout_s: float = 10.0,
        stop_timeout_s: float = 600.0,
    ) -> None:
        self.base_url = check_http_url(base_url)
        self.config = config
        self.output_dir = None if output_dir is None else os.path.abspath(output_dir)
        self.profile_by_stage = profile_by_stage
        self.num_steps = num_steps
        self.timeout_s = check_timeout(timeout_s, "timeout_s")
        self.stop_timeout_s = check_timeout(stop_timeout_s, "stop_timeout_s")
        self.version: Version | None = None if sglang_version is None else parse_version(sglang_version)
        self._base: dict[str, Any] | None = self._build(NEWEST)  # bad settings fail here, naming the field
        self._base_for: Version | None = None
        self.stops_by_itself = False  # the last start sent num_steps: SGLang may have stopped by itself

    def _build(self, target: Version) -> dict[str, Any] | None:
        body, self._notes = _start_body(
            self.config,
            output_dir=self.output_dir,
            prefix=None,
            target=target,
            profile_by_stage=self.profile_by_stage,
            num_steps=self.num_steps,
        )
        return body

    def server_version(self) -> Version:
        """The server's SGLang version (``GET /server_info``, else ``/get_server_info``), asked once."""
        if self.version is not None:
            return self.version
        for route in ("server_info", "get_server_info"):
            status, text = http_request(f"{self.base_url}/{route}", timeout_s=self.timeout_s)
            if status == 404:
                continue
            if status != 200:
                raise EngineProfilerError(f"{self.base_url}/{route} answered {status}: {text[:200]!r}")
            try:
                self.version = parse_version(json.loads(text)["version"])
            except (ValueError, KeyError, TypeError) as exc:
                raise EngineProfilerError(f"{self.base_url}/{route} names no SGLang version: {text[:200]!r}") from exc
            return self.version
        raise EngineProfilerError(
            f"{self.base_url} has neither /server_info nor /get_server_info: not an SGLang server "
            "(behind a proxy that hides them, pass sglang_version=)"
        )

    def start_body(self, prefix: str | None = None) -> dict[str, Any] | None:
        """The body the next :meth:`start` sends (asks the server's version once)."""
        target = self.server_version()
        if self._base_for != target:
            self._base = self._build(target)
            self._base_for = target
            notes = list(self._notes)
            if target < STOP_WAITS_SINCE:
                notes.append(
                    f"SGLang {_show(target)} answers /stop_profile before its traces are written: a trace "
                    "written after relocation is missed; SGLang >= 0.4.7 waits for them"
                )
            for note in notes:
                logger.warning("instrument: %s: %s", self.base_url, note)
        if self._base is None:
            return None
        body = dict(self._base)
        check_prefix(prefix)
        if prefix and "profile_prefix" in _fields(target):
            body["profile_prefix"] = prefix
        return body

    def start(self, prefix: str | None = None) -> None:
        """Start profiling with this configuration's body; ``prefix`` (``step{S}``) names the files (0.5.6+)."""
        body = self.start_body(prefix)
        status, text = http_request(
            f"{self.base_url}/start_profile", method="POST", body=body, timeout_s=self.timeout_s
        )
        self._check(status, text, "start_profile")
        self.stops_by_itself = body is not None and "num_steps" in body

    def stop(self) -> float:
        """Stop profiling and wait for the flush (up to ``stop_timeout_s``); returns the seconds it took.

        After a start with ``num_steps`` SGLang may have stopped (and written its traces) by itself;
        its refusal then (a bare 500: "not in progress") is that, not a failure: relocation finds
        the files (and says so when there are none).
        """
        started = time.monotonic()
        status, text = post_stop_profile(
            self.base_url, timeout_s=self.timeout_s, stop_timeout_s=self.stop_timeout_s, engine="SGLang"
        )
        stopped_by_itself, self.stops_by_itself = self.stops_by_itself, False
        if status == 500 and stopped_by_itself:
            logger.debug("instrument: %s had stopped by itself after num_steps", self.base_url)
        else:
            self._check(status, text, "stop_profile")
        return time.monotonic() - started

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 within ``min(timeout_s, 5)`` seconds; never raises."""
        return server_healthy(self.base_url, self.timeout_s)

    def _check(self, status: int, text: bytes, route: str) -> None:
        if 200 <= status < 300:
            return
        if status == 404:
            raise EngineProfilerError(f"{self.base_url}/{route} does not exist: not an SGLang server")
        if status in (401, 403):
            raise EngineProfilerError(
                f"{self.base_url}/{route} answered {status}: the server wants an API key (--api-key / "
                "--admin-api-key), which this driver does not send; launch the engine without one"
            )
        if status == 500:
            # SGLang answers a refused profile request with a bare 500; the reason is only in its log.
            hint = (
                "already profiling (POST /stop_profile flushes it)"
                if route == "start_profile"
                else "not profiling (nothing to flush)"
            )
            raise SglangRefusedError(f"{self.base_url}/{route} answered 500: most likely {hint}; the server log says")
        raise EngineProfilerError(f"{self.base_url}/{route} answered {status}: {text[:200]!r}")


# --------------------------------------------------------------------------- instrument rollout


class SglangWorker:
    """:class:`SglangHttpDriver` as ``instrument rollout`` drives it (a :class:`~instrument.rollout.ServerDriver`).

    SGLang answers every refusal with a bare 500 (:class:`SglangRefusedError`), so a stop asks the
    server's version first (a server that is not SGLang, or wants an API key, fails there with its
    own message); a refused stop is then SGLang saying "not profiling". ``started_here``: a start
    of this worker was recorded and not stopped, so a start flushes it first (SGLang 0.5.23 loses a
    running session's trace when it refuses a second start, so that start is never sent while it
    runs). ``stops_by_itself`` comes from the start's marker: that start sent ``num_steps``.
    """

    refuses_idle_stop = True

    def __init__(self, driver: SglangHttpDriver, *, started_here: bool = False, stops_by_itself: bool = False) -> None:
        self.driver = driver
        self.started_here = started_here
        driver.stops_by_itself = stops_by_itself

    @property
    def stops_by_itself(self) -> bool:
        """The last start sent ``num_steps``: SGLang stops by itself, and refuses the stop after it."""
        return self.driver.stops_by_itself

    def has_profiler_routes(self) -> bool:
        """SGLang always serves ``/start_profile``; ``True`` once the server names its SGLang version."""
        self.driver.server_version()
        return True

    def start_profile(self, prefix: str | None = None) -> bool:
        """Start profiling; ``True`` when a start recorded here was still running: flushed, then started again."""
        restarted = False
        if self.started_here:
            try:
                self.stop()
                restarted = True
            except NotProfilingError:
                pass  # it had ended (num_steps, a stop from elsewhere, a restarted server): nothing to flush
        self.driver.start(prefix)
        self.started_here = True
        return restarted

    def stop(self) -> float:
        """Stop and wait for the flush; :class:`NotProfilingError` when SGLang was not profiling."""
        self.driver.server_version()  # a server that is not SGLang fails here, with its own message
        try:
            return self.driver.stop()  # a refusal after a num_steps start is not one: the driver knows
        except SglangRefusedError:
            raise NotProfilingError(
                "not profiling: nothing flushed (SGLang refused the stop with a bare 500, as it does when not "
                "profiling; its log says why)"
            ) from None


def _launch_args(config: ProfilerConfig, *, profiler_dir: str, version: str | None) -> LaunchArgs:
    return profiler_launch_args(config, profiler_dir=profiler_dir, sglang_version=version)


def _server_driver(
    url: str,
    config: ProfilerConfig,
    *,
    timeout_s: float,
    stop_timeout_s: float,
    started_here: bool,
    stops_by_itself: bool,
) -> SglangWorker:
    # No output_dir: each server writes into its launch's SGLANG_TORCH_PROFILER_DIR (launch-args --replica N).
    driver = SglangHttpDriver(url, config, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)
    return SglangWorker(driver, started_here=started_here, stops_by_itself=stops_by_itself)


PROFILE = EngineProfile(
    name="sglang",
    label="SGLang",
    traces=TRACES,
    launch_args=_launch_args,
    http_driver=_server_driver,
    installed_version=installed_sglang_version,
    version_example="0.5.23",
    launch_command="python -m sglang.launch_server --model-path MODEL",
    launch_summary="VAR=value environment assignments (SGLANG_TORCH_PROFILER_DIR, and what the version reads of "
    "stacks and shapes)",
    start_sends_config=True,
    check_prefix=check_prefix,
    writes_when="SGLang writes into it at the stop",
)
"""SGLang as ``instrument rollout --engine sglang`` and relocation know it."""
