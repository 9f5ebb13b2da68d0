"""instrument: profile distributed LLM reinforcement-learning training without drowning in traces.

The public surface is re-exported here; backends (torch, NVTX, vLLM) load lazily,
so ``import instrument`` imports neither torch, nvtx, vllm nor ray.
"""

from __future__ import annotations

from instrument._api import configure, finish, profile_step, profile_window, profiled_stage
from instrument._session import Session
from instrument._version import __version__
from instrument.config import CONTENTS, TOOLS, FinishHook, ProfilerConfig, Schedule, SlowStep

__all__ = [
    "CONTENTS",
    "TOOLS",
    "FinishHook",
    "ProfilerConfig",
    "Schedule",
    "Session",
    "SlowStep",
    "__version__",
    "configure",
    "finish",
    "profile_step",
    "profile_window",
    "profiled_stage",
]
