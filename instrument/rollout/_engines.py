"""Engine profiles: everything that differs between rollout engines, one frozen value per engine, in one registry.

An :class:`EngineProfile` holds an engine's name, its launch arguments by version, the driver of
one of its servers, its trace-name grammar (:class:`~instrument.ranks.TraceNames`) and what the
command line says about it. Relocation, ``instrument rollout``, the fan-out and ``ranks`` read
engines only through these values, so an engine is one module plus one :func:`register_engine`
call. vLLM's and SGLang's profiles are built in and imported the first time the registry is read
(``import instrument`` loads neither). Imports neither an engine nor torch.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from instrument import ranks
from instrument.config import ProfilerConfig
from instrument.rollout._profiler import LaunchArgs

__all__ = [
    "EngineProfile",
    "HttpDriverFactory",
    "LaunchArgsFactory",
    "ServerDriver",
    "engine_of",
    "engine_profile",
    "engine_profiles",
    "register_engine",
    "unregister_engine",
]


@runtime_checkable
class ServerDriver(Protocol):
    """One engine server as ``instrument rollout`` drives it (each call bounded by its own deadline).

    ``start_profile`` returns ``True`` when the server was profiling already and was restarted;
    ``stop`` waits for the flush and raises :class:`~instrument.rollout.NotProfilingError` when the
    engine says nothing was profiling. Two optional attributes: ``refuses_idle_stop`` (true: the
    engine refuses a stop when idle, so a stop it accepts flushed something even without a start
    recorded here) and ``stops_by_itself`` (true after a start that the engine ends by itself;
    remembered in the start's marker).
    """

    def has_profiler_routes(self) -> bool:
        """Whether the server can profile (it was launched with a profiler)."""
        ...

    def start_profile(self, prefix: str | None = None) -> bool:
        """Start profiling; ``True`` when a running profiler was flushed and started again."""
        ...

    def stop(self) -> float:
        """Stop profiling once the traces are flushed; the seconds it took."""
        ...


class LaunchArgsFactory(Protocol):
    """``(config, *, profiler_dir, version) -> LaunchArgs``: what a server of ``version`` (``None``: the
    installed one, else the newest) needs at launch to profile into ``profiler_dir``."""

    def __call__(self, config: ProfilerConfig, *, profiler_dir: str, version: str | None) -> LaunchArgs: ...


class HttpDriverFactory(Protocol):
    """The :class:`ServerDriver` of the server at ``url``. ``started_here``: a start of it was recorded
    here and not stopped; ``stops_by_itself``: that start asked the engine to stop by itself."""

    def __call__(
        self,
        url: str,
        config: ProfilerConfig,
        *,
        timeout_s: float,
        stop_timeout_s: float,
        started_here: bool,
        stops_by_itself: bool,
    ) -> ServerDriver: ...


def _installed_unknown() -> str | None:
    return None


def _any_prefix(prefix: str | None) -> None:
    return None


def _check_text(field: str, value: object, *, empty: bool = False) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{field}' must be a str: {value!r}")
    if not empty and not value.strip():
        raise ValueError(f"'{field}' must not be empty")


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """What one rollout engine is to ``instrument``: its name, launch, driver, trace names and CLI words.

    ``name`` (``--engine NAME``, the manifest's tool, the start marker's engine) must be the
    grammar's ``traces.engine``. ``launch_args`` builds the launch arguments for a version (the
    CLI adds ``--{name}-version`` and reads ``installed_version()`` otherwise; ``version_example``
    is shown in its help). ``http_driver`` drives one server. ``start_sends_config``: a start
    carries the profiler configuration (else it is fixed at launch, and ``start --config`` is
    refused); ``check_prefix`` raises ``ValueError`` for a file-name prefix the engine cannot take.
    ``label``, ``launch_command``, ``launch_summary`` and ``writes_when`` are the words the
    command line uses. Invalid values raise ``TypeError`` / ``ValueError`` naming the field.
    """

    name: str
    label: str
    traces: ranks.TraceNames
    launch_args: LaunchArgsFactory
    http_driver: HttpDriverFactory
    installed_version: Callable[[], str | None] = _installed_unknown
    version_example: str = "1.0.0"
    launch_command: str = "the server's launch command"
    launch_summary: str = "what its profiler needs at launch"
    start_sends_config: bool = False
    check_prefix: Callable[[str | None], object] = _any_prefix
    writes_when: str = "the engine writes into it at the stop"

    def __post_init__(self) -> None:
        if not isinstance(self.traces, ranks.TraceNames):
            raise TypeError(f"'traces' must be a TraceNames: {type(self.traces).__name__}")
        if self.name != self.traces.engine:
            raise ValueError(f"'name' must be the engine of its 'traces' ({self.traces.engine!r}): {self.name!r}")
        for field in ("launch_args", "http_driver", "installed_version", "check_prefix"):
            if not callable(getattr(self, field)):
                raise TypeError(f"'{field}' must be callable: {getattr(self, field)!r}")
        for field in ("label", "version_example", "launch_command", "launch_summary", "writes_when"):
            _check_text(field, getattr(self, field))
        if not isinstance(self.start_sends_config, bool):
            raise TypeError(f"'start_sends_config' must be a bool: {self.start_sends_config!r}")

    @property
    def version_flag(self) -> str:
        """The ``launch-args`` option that names this engine's version: ``--{name}-version``."""
        return f"--{self.name}-version"


# The built-in engines, imported on first use ("module:attribute"); register_engine adds the others.
_REGISTRY: dict[str, str | EngineProfile] = {
    "vllm": "instrument.rollout.vllm:PROFILE",
    "sglang": "instrument.rollout.sglang:PROFILE",
}
_LOCK = threading.RLock()  # re-entrant: resolving a built-in imports its module, which may read the registry


def _resolve(name: str) -> EngineProfile:
    with _LOCK:
        target = _REGISTRY[name]
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module), attribute)
            if not isinstance(target, EngineProfile) or target.name != name:
                raise TypeError(f"{_REGISTRY[name]} is not the EngineProfile of {name!r}")
            ranks.register_trace_names(target.traces)
            _REGISTRY[name] = target
        return target


def register_engine(profile: EngineProfile) -> EngineProfile:
    """Make ``profile`` an engine of ``instrument`` (the CLI's ``--engine``, relocation, ``ranks``); returns it.

    Registering the same profile again does nothing; another profile under a registered name raises
    ``ValueError`` (unregister that one first). Its trace names are tried after those registered
    before it, the built-ins first.
    """
    if not isinstance(profile, EngineProfile):
        raise TypeError(f"'profile' must be an EngineProfile: {type(profile).__name__}")
    with _LOCK:
        if profile.name in _REGISTRY:
            known = _resolve(profile.name)
            if known == profile:
                return known
            raise ValueError(f"an engine named {profile.name!r} is registered already: unregister_engine() it first")
        ranks.register_trace_names(profile.traces)  # before the profile: a clash of names leaves nothing behind
        _REGISTRY[profile.name] = profile
    return profile


def unregister_engine(name: str) -> None:
    """Forget the engine ``name`` and its trace names (nothing if there is none)."""
    with _LOCK:
        if _REGISTRY.pop(name, None) is not None:
            ranks.unregister_trace_names(name)


def engine_profiles() -> tuple[EngineProfile, ...]:
    """Every registered engine, the built-ins first, then in registration order."""
    with _LOCK:
        return tuple(_resolve(name) for name in list(_REGISTRY))


def engine_profile(name: str) -> EngineProfile:
    """The registered engine ``name``; ``ValueError`` naming the registered ones otherwise."""
    with _LOCK:
        if name not in _REGISTRY:
            raise ValueError(f"no engine named {name!r}; registered: {', '.join(_REGISTRY)}")
        return _resolve(name)


def engine_of(filename: str) -> EngineProfile | None:
    """The registered engine whose trace names ``filename`` (a path or a base name) follows, else ``None``."""
    parsed = ranks.parse_engine_trace_name(filename)
    if parsed is None:
        return None
    with _LOCK:
        return _resolve(parsed.engine) if parsed.engine in _REGISTRY else None
