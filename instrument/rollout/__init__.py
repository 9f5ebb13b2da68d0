"""Rollout engines: profile vLLM and SGLang servers and bring their traces into ``save_path``.

The engine-neutral part (the driver protocol, :class:`RolloutProfiler`, relocation) is here;
:mod:`instrument.rollout.vllm` and :mod:`instrument.rollout.sglang` hold each engine's launch
arguments and driver. ``instrument rollout`` (:mod:`._cli`) fans the start and stop out to many
servers (:mod:`._fanout`) and keeps start markers (:mod:`._markers`) so a later stop relocates.
"""

from __future__ import annotations

from instrument.rollout._profiler import (
    SGLANG_TRACES,
    VLLM_TRACES,
    EngineDriver,
    EngineProfilerError,
    EngineStillFlushingError,
    EngineTraces,
    LaunchArgs,
    RelocationResult,
    RolloutProfiler,
    engine_to_drive,
    relocate_engine_traces,
    replica_profiler_dir,
)

__all__ = [
    "SGLANG_TRACES",
    "VLLM_TRACES",
    "EngineDriver",
    "EngineProfilerError",
    "EngineStillFlushingError",
    "EngineTraces",
    "LaunchArgs",
    "RelocationResult",
    "RolloutProfiler",
    "engine_to_drive",
    "relocate_engine_traces",
    "replica_profiler_dir",
]
