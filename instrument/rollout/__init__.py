"""Rollout engines: profile vLLM, SGLang or any registered engine and bring their traces into ``save_path``.

An engine is an :class:`EngineProfile` (its launch arguments, its server driver, its trace-name
grammar :class:`TraceNames`, its command-line words) in one registry: :func:`register_engine`,
:func:`engine_profiles`, :func:`engine_profile`, :func:`engine_of`. vLLM's and SGLang's
(:mod:`instrument.rollout.vllm`, :mod:`instrument.rollout.sglang`) are built in and imported on
first use. The engine-neutral part is here too: the driver protocol, :class:`RolloutProfiler`
and relocation. ``instrument rollout`` (:mod:`._cli`) fans the start and stop out to many servers
(:mod:`._fanout`) and keeps start markers (:mod:`._markers`) so a later stop relocates.
"""

from __future__ import annotations

from instrument.ranks import EngineTraceName, TraceNames
from instrument.rollout._engines import (
    EngineProfile,
    HttpDriverFactory,
    LaunchArgsFactory,
    ServerDriver,
    engine_of,
    engine_profile,
    engine_profiles,
    register_engine,
    unregister_engine,
)
from instrument.rollout._profiler import (
    EngineDriver,
    EngineProfilerError,
    EngineStillFlushingError,
    LaunchArgs,
    NotProfilingError,
    RelocationResult,
    RolloutProfiler,
    engine_ranks_to_keep,
    engine_to_drive,
    relocate_engine_traces,
    replica_profiler_dir,
    verl_declines,
)

__all__ = [
    "EngineDriver",
    "EngineProfile",
    "EngineProfilerError",
    "EngineStillFlushingError",
    "EngineTraceName",
    "HttpDriverFactory",
    "LaunchArgs",
    "LaunchArgsFactory",
    "NotProfilingError",
    "RelocationResult",
    "RolloutProfiler",
    "ServerDriver",
    "TraceNames",
    "engine_of",
    "engine_profile",
    "engine_profiles",
    "engine_ranks_to_keep",
    "engine_to_drive",
    "register_engine",
    "relocate_engine_traces",
    "replica_profiler_dir",
    "unregister_engine",
    "verl_declines",
]
