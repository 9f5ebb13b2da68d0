"""instrument: profile distributed LLM reinforcement-learning training without drowning in traces.

The public surface is re-exported here; backends (torch, NVTX, vLLM) load lazily,
so ``import instrument`` imports neither torch, nvtx, vllm nor ray.
"""

from __future__ import annotations

from instrument import ranks as _ranks
from instrument._version import __version__
from instrument.config import CONTENTS, TOOLS, FinishHook, MemorySnapshots, ProfilerConfig, Schedule, SlowStep
from instrument.run._api import (
    begin_step,
    configure,
    current_run,
    end_step,
    finish,
    profile_step,
    profile_window,
    profiled_stage,
)
from instrument.run._info import RunInfo
from instrument.run._requests import request

__all__ = [
    "CONTENTS",
    "TOOLS",
    "FinishHook",
    "MemorySnapshots",
    "ProfilerConfig",
    "RunInfo",
    "Schedule",
    "SlowStep",
    "__version__",
    "begin_step",
    "configure",
    "current_run",
    "end_step",
    "finish",
    "profile_step",
    "profile_window",
    "profiled_stage",
    "request",
]


def _load_built_in_engines() -> None:
    """Resolve the built-in engines, whose modules hold their trace-name grammars, into ``instrument.ranks``."""
    from instrument.rollout import engine_profiles  # on the first read of the grammars: import instrument stays light

    engine_profiles()


_ranks._set_engine_loader(_load_built_in_engines)  # ranks is pure (standard library only): handed its loader here
