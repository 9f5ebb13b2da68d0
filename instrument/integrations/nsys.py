"""Nsight Systems around instrument's capture ranges: options, command line, Ray runtime_env, reports.

Launch-side helpers, not a recorder: the ``nvtx`` recorder opens the capture ranges in the
process, these build the ``nsys profile`` around it and bring its reports home.

``nsys profile --capture-range=cudaProfilerApi`` records only between ``cudaProfilerStart`` and
``cudaProfilerStop``, which the NVTX backend calls around what is profiled. nsys finalises a
report only when its capture range ends (``--capture-range-end``) or the process exits, so the
number of ranges a process really opens matters (:func:`capture_ranges_for`). Imports neither
nvtx nor torch.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from instrument import naming
from instrument._files import move_into, wait_until_stable
from instrument.config import ProfilerConfig
from instrument.manifest import Manifest, TraceRecord
from instrument.plan import StageSpec, plan_run

__all__ = ["capture_ranges_for", "nsys_command", "nsys_options", "nsys_runtime_env", "relocate_nsys_reports"]

logger = logging.getLogger(__name__)


def capture_ranges_for(
    config: ProfilerConfig,
    *,
    rank: int,
    world_size: int,
    num_steps: int,
    stages: Sequence[StageSpec] = (),
    num_mini_batches: int = 1,
) -> int | None:
    """How many capture ranges this rank really opens in a run, or ``None`` when it cannot be known.

    Continuous mode: one per profiled step. Discrete mode: one per trace ``instrument plan``
    lists for the rank, which needs the stages (and mini-batches for scheduled ones).
    """
    if not config.active or not config.profiles_rank(rank):
        return 0
    if config.discrete and not stages:
        return None
    run = plan_run(
        config,
        num_steps=num_steps,
        world_size=world_size,
        num_mini_batches=num_mini_batches,
        stages=tuple(stages) if stages else (StageSpec("step"),),
    )
    return sum(1 for trace in run.traces if trace.rank == rank)


def nsys_options(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, str]:
    """nsys options recording only the capture ranges; ``capture-range-end`` finalises the report.

    ``repeat-shutdown:N`` needs N to be the number of ranges the process really opens (see
    :func:`capture_ranges_for`): a count never reached leaves no report. Unknown → ``stop``
    (only the first range is recorded, but the report is written). For continuous mode with
    listed steps N is the number of steps.
    """
    if capture_ranges is None and not config.discrete and config.steps is not None:
        capture_ranges = len(config.steps)
    if capture_ranges is not None and (isinstance(capture_ranges, bool) or capture_ranges < 1):
        raise ValueError(f"'capture_ranges' must be >= 1: {capture_ranges}")
    return {
        "trace": "cuda,nvtx,osrt,cudnn,cublas",
        "cuda-memory-usage": "true",
        "capture-range": "cudaProfilerApi",
        "capture-range-end": f"repeat-shutdown:{capture_ranges}" if capture_ranges else "stop",
        "kill": "none",
    }


def nsys_runtime_env(config: ProfilerConfig, *, capture_ranges: int | None = None) -> dict[str, dict[str, str]]:
    """Ray's ``runtime_env`` running an actor under nsys with :func:`nsys_options`: ``{"nsight": {...}}``."""
    return {"nsight": nsys_options(config, capture_ranges=capture_ranges)}


def nsys_command(
    config: ProfilerConfig, *, output: str | os.PathLike[str], capture_ranges: int | None = None
) -> list[str]:
    """``nsys profile …`` to put in front of the training command; ``output`` without ``.nsys-rep``."""
    options = nsys_options(config, capture_ranges=capture_ranges)
    return [
        "nsys",
        "profile",
        *(f"--{key}={value}" for key, value in options.items()),
        f"--output={os.fspath(output)}",
        "--force-overwrite=false",
    ]


# --------------------------------------------------------------------------- relocation


def relocate_nsys_reports(
    search_dir: str | os.PathLike[str],
    *,
    pid: int,
    save_path: str | os.PathLike[str],
    role: str,
    rank: int,
    world_size: int,
    manifest: Manifest | None = None,
    quiet_s: float = 1.0,
    timeout_s: float = 300.0,
) -> list[TraceRecord]:
    """Move the finished ``.nsys-rep`` reports of process ``pid`` from ``search_dir`` into ``save_path``.

    Reports of other processes are left alone; each is moved once its size stops changing
    (nsys writes it at finalisation), under ``{role}_nsys_rank{r}-of-{W}_{host}_pid{pid}_{ns}.nsys-rep``.
    """
    pattern = re.compile(rf"(?<!\d){pid}(?!\d)")
    moved: list[TraceRecord] = []
    Path(save_path).mkdir(parents=True, exist_ok=True)
    for report in sorted(Path(search_dir).glob("*.nsys-rep")):
        if not pattern.search(report.name):
            continue
        if not wait_until_stable(report, quiet_s=quiet_s, timeout_s=timeout_s):
            logger.warning("instrument: %s did not settle within %g s; left in place", report, timeout_s)
            continue
        name = (
            f"{naming.sanitize_label(role)}_nsys_rank{rank}-of-{world_size}_{naming.short_hostname()}"
            f"_pid{pid}_{naming.next_timestamp_ns()}.nsys-rep"
        )
        target = move_into(report, save_path, name)
        record = TraceRecord(
            path=target.name,  # relative to save_path, like every manifest line
            role=role,
            stage="nsys",
            step=0,
            rank=rank,
            world_size=world_size,
            window=None,
            partial=False,
            bytes=target.stat().st_size,
            tool="nvtx",
        )
        moved.append(record)
        if manifest is not None:
            manifest.append(record)
    return moved
