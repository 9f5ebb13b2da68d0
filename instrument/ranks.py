"""Which ranks and engine replicas are profiled (pure; standard library only).

Ranks are global ranks of the job.  A rollout replica spans
``gpus_per_replica`` (tp x pp x dp) consecutive global ranks: global rank
``g`` is local rank ``g % gpus_per_replica`` of replica ``g // gpus_per_replica``.
Engine trace files carry only the local rank; :func:`engine_trace_local_rank`
reads it from vLLM and SGLang names, :func:`engine_trace_rank` turns it into a global rank.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Protocol

from instrument._checks import check_int

__all__ = [
    "LocalRankParser",
    "engine_trace_local_rank",
    "engine_trace_rank",
    "is_profiled_rank",
    "keep_engine_trace",
    "local_rank_of",
    "profiled_ranks",
    "ranks_to_keep",
    "replica_of",
    "replicas_to_drive",
    "sglang_trace_local_rank",
    "validate_ranks",
]


def _check_rank(rank: int, world_size: int, field: str = "rank") -> None:
    check_int("world_size", world_size, 1)
    check_int(field, rank, 0)
    if rank >= world_size:
        raise ValueError(f"'{field}' {rank} is outside the world of {world_size} ranks (0..{world_size - 1})")


def validate_ranks(ranks: Iterable[int], world_size: int, field: str = "ranks") -> None:
    """Raise ``ValueError`` naming the first selected rank that is not in ``0..world_size-1``."""
    check_int("world_size", world_size, 1)
    for rank in ranks:
        check_int(field, rank, 0)
        if rank >= world_size:
            raise ValueError(
                f"'{field}' selects rank {rank}, outside the world of {world_size} ranks (0..{world_size - 1})"
            )


def is_profiled_rank(rank: int, ranks: Iterable[int], all_ranks: bool = False) -> bool:
    """Whether global ``rank`` is selected by ``ranks`` / ``all_ranks``."""
    return all_ranks or rank in ranks


def profiled_ranks(ranks: Iterable[int], all_ranks: bool, world_size: int) -> tuple[int, ...]:
    """The selected global ranks of a world, sorted; rejects ranks outside it."""
    if all_ranks:
        check_int("world_size", world_size, 1)
        return tuple(range(world_size))
    selected = sorted(set(ranks))
    validate_ranks(selected, world_size)
    return tuple(selected)


def replica_of(global_rank: int, gpus_per_replica: int) -> int:
    """The replica that global rank ``global_rank`` belongs to."""
    check_int("gpus_per_replica", gpus_per_replica, 1)
    check_int("global_rank", global_rank, 0)
    return global_rank // gpus_per_replica


def local_rank_of(global_rank: int, gpus_per_replica: int) -> int:
    """The rank of ``global_rank`` inside its replica."""
    check_int("gpus_per_replica", gpus_per_replica, 1)
    check_int("global_rank", global_rank, 0)
    return global_rank % gpus_per_replica


def _check_world(world_size: int, gpus_per_replica: int) -> None:
    check_int("gpus_per_replica", gpus_per_replica, 1)
    check_int("world_size", world_size, 1)
    if world_size % gpus_per_replica:
        raise ValueError(
            f"'world_size' {world_size} is not a multiple of 'gpus_per_replica' {gpus_per_replica}: "
            "every replica spans gpus_per_replica ranks"
        )


def replicas_to_drive(ranks: Iterable[int], all_ranks: bool, world_size: int, gpus_per_replica: int) -> tuple[int, ...]:
    """The replicas holding at least one selected rank, sorted."""
    _check_world(world_size, gpus_per_replica)
    selected = profiled_ranks(ranks, all_ranks, world_size)
    return tuple(sorted({rank // gpus_per_replica for rank in selected}))


def ranks_to_keep(
    replica: int, ranks: Iterable[int], all_ranks: bool, world_size: int, gpus_per_replica: int
) -> frozenset[int]:
    """The selected global ranks of ``replica``: traces of its other workers (TP peers) are dropped."""
    _check_world(world_size, gpus_per_replica)
    _check_rank(replica, world_size // gpus_per_replica, "replica")
    first = replica * gpus_per_replica
    members = range(first, first + gpus_per_replica)
    selected = set(profiled_ranks(ranks, all_ranks, world_size))
    return frozenset(rank for rank in members if rank in selected)


class LocalRankParser(Protocol):
    """Reads the rank inside its replica from an engine's trace file name (``None``: not readable)."""

    def __call__(self, filename: str, *, ranks_per_dp_rank: int | None = None) -> int | None: ...


def engine_trace_rank(
    filename: str,
    replica: int,
    gpus_per_replica: int,
    *,
    ranks_per_dp_rank: int | None = None,
    parse: LocalRankParser | None = None,
) -> int | None:
    """The global rank that wrote engine trace ``filename`` of ``replica``, or ``None`` when the name
    does not tell (frontend traces, unknown names, a local rank outside the replica: a misread name).

    ``parse`` reads the local rank (default :func:`engine_trace_local_rank`: vLLM and SGLang names).
    """
    check_int("replica", replica, 0)
    check_int("gpus_per_replica", gpus_per_replica, 1)
    local = (parse or engine_trace_local_rank)(filename, ranks_per_dp_rank=ranks_per_dp_rank)
    if local is None or local >= gpus_per_replica:
        return None
    return replica * gpus_per_replica + local


def keep_engine_trace(
    filename: str,
    replica: int,
    gpus_per_replica: int,
    keep: Iterable[int],
    *,
    ranks_per_dp_rank: int | None = None,
    parse: LocalRankParser | None = None,
) -> bool:
    """Whether to keep engine trace ``filename`` of ``replica`` given the global ranks in ``keep``.

    A file whose global rank cannot be read (:func:`engine_trace_rank` gives ``None``) is kept:
    losing a trace is worse than moving one too many.
    """
    rank = engine_trace_rank(filename, replica, gpus_per_replica, ranks_per_dp_rank=ranks_per_dp_rank, parse=parse)
    return rank is None or rank in keep


# vLLM >= 0.17: "[{prefix}_]rank{R}.{ns}.pt.trace.json.gz", or with "dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_" before
# "rank" once parallel state is up; R counts within one data-parallel rank's tp x pp world.
_VLLM = re.compile(
    r"(?:^|_)(?:dp(?P<dp>\d+)_pp\d+_tp\d+_dcp\d+_ep\d+_)?rank(?P<rank>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$"
)
# vLLM's text summaries beside the traces: "{worker name}.profiler_out.txt" (0.32+), "profiler_out_{R}.txt" before.
_VLLM_SUMMARY = re.compile(
    r"(?:(?:^|_)(?:dp(?P<dp>\d+)_pp\d+_tp\d+_dcp\d+_ep\d+_)?rank(?P<rank>\d+)|^profiler_out_(?P<legacy>\d+))"
    r"\.(?:profiler_out\.)?txt$"
)
# vLLM < 0.17: "{id}-rank-{R}.{ns}.pt.trace.json.gz"
_VLLM_LEGACY = re.compile(r"-rank-(?P<rank>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")
# SGLang: "[{prefix}-]{profile_id}-TP-{t}[-DP-{d}][-PP-{p}][-EP-{e}][-memory][-{stage}]" + ".trace.json.gz" or
# ".pickle" (memory snapshots). Stage suffixes: "-EXTEND" / "-DECODE" (0.5.3+), "-prefill" / "-decode"
# (SGLANG_PROFILE_V2), str(ForwardMode) before (0.4.7-0.5.2: "-1" / "-2" on Python >= 3.11,
# "-ForwardMode.EXTEND" before); activities ("-CPU"); ROCm: "rpd-{time}-TP-{t}.trace.json.gz".
_SGLANG = re.compile(
    r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-\d+)?(?:-memory)?"
    r"(?:-(?:ForwardMode\.)?[A-Za-z]+|-\d+)?\.(?:trace\.json(?:\.gz)?|pickle)$"
)


def sglang_trace_local_rank(filename: str) -> int | None:
    """The rank inside its replica written in an SGLang trace or memory snapshot name, or ``None``.

    The TP rank, for names without ``-DP-`` / ``-PP-`` (EP ranks live on the TP ranks' GPUs).
    With ``-DP-`` or ``-PP-`` the GPU depends on the engine's mode and sizes (DP attention
    numbers TP ranks across DP ranks, plain DP does not), so ``None``: relocation keeps such a
    file, labelled ``rank-unknown``, rather than risk dropping the wrong one.
    """
    match = _SGLANG.search(os.path.basename(filename))
    if match is None or match["dp"] is not None or match["pp"] is not None:
        return None
    return int(match["tp"])


def engine_trace_local_rank(filename: str, *, ranks_per_dp_rank: int | None = None) -> int | None:
    """The rank inside its replica written in a vLLM or SGLang worker trace name, or ``None``.

    vLLM names count ranks within one data-parallel rank (``dp{d}_..._rank{R}``); for
    ``d > 0`` the replica-local rank is ``d * ranks_per_dp_rank + R``, so without
    ``ranks_per_dp_rank`` (tp x pp) such names give ``None``.  ``None`` also for frontend
    (``.async_llm.``) traces, SGLang names with ``-DP-`` or ``-PP-`` (their layout depends
    on the engine's mode and sizes) and names this function does not know.
    """
    base = os.path.basename(filename)
    if ".async_llm." in base:
        return None
    match = _VLLM.search(base) or _VLLM_SUMMARY.search(base)
    if match and match.groupdict().get("legacy"):
        return int(match["legacy"])
    if match:
        dp = int(match["dp"] or 0)
        if dp == 0:
            return int(match["rank"])
        if ranks_per_dp_rank is None:
            return None
        check_int("ranks_per_dp_rank", ranks_per_dp_rank, 1)
        return dp * ranks_per_dp_rank + int(match["rank"])
    match = _VLLM_LEGACY.search(base)
    if match:
        return int(match["rank"])
    return sglang_trace_local_rank(base)
