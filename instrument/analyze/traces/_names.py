"""Who wrote a trace file, read from its name: every name form ``instrument analyze`` knows.

Forms, tried in this order (:func:`from_name`):

- this SDK's names (:func:`instrument.naming.parse_trace_name`) and its relocated vLLM engine and
  frontend traces (:data:`instrument.naming.ENGINE_TRACE` / ``FRONTEND_TRACE``);
- verl's ``{role}[_{stage}]_step{S}_rank{r}-of-{W}_pid{p}_{ts}.json[.gz]``: without a stage the file
  holds a whole step, and its stages are found inside (:attr:`TraceFile.inside`);
- plain vLLM worker names (``[dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_]rank{R}.{ns}.pt.trace.json.gz``,
  ``{id}-rank-{R}.{ns}…``) and SGLang's (``{ts}-TP-{t}….trace.json.gz``): engine traces;
- HTA-style ``rank-{r}….json[.gz]``;
- anything else (torch's default ``{worker}.{ns}.pt.trace.json[.gz]`` included) is a whole trace
  whose rank comes from ``distributedInfo``, or, without one, from no one: it is analysed as a
  worker named after the file, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from instrument import naming
from instrument.analyze._model import TraceFile
from instrument.ranks import engine_trace_local_rank

__all__ = [
    "TRACE_SUFFIXES",
    "WHOLE_TRACE",
    "complete_dp_ranks",
    "from_name",
    "is_trace_name",
    "vllm_dp_rank",
    "worker_label",
]

TRACE_SUFFIXES = (".json.gz", ".json")
WHOLE_TRACE = "trace"
"""Stage label of a file analysed whole (no step or stage range inside)."""

_PREFIX_STEP = re.compile(r"(?:^|_)step(\d+)(?:_|$)")
# verl: no host field (the SDK's names have one), role in dashes, a stage that may hold "_"
_VERL = re.compile(
    r"(?P<role>[A-Za-z0-9.=+-]+)(?:_(?P<stage>[A-Za-z0-9._=+-]+?))?_step(?P<step>\d+)"
    r"_rank(?P<rank>\d+)-of-(?P<world>[1-9]\d*)_pid\d+_\d+(?:\.pt\.trace)?\.json(?:\.gz)?\Z"
)
_HTA = re.compile(r"rank-(?P<rank>\d+)(?:[._-][^/]*)?\.json(?:\.gz)?\Z")
# vLLM with data parallelism: the rank counts within one dp rank, so the global place needs the sizes
_VLLM_DP = re.compile(
    r"(?:^|_)dp(?P<dp>\d+)_pp\d+_tp\d+_dcp\d+_ep\d+_rank(?P<rank>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?\Z"
)
# vLLM's API-server trace before relocation: "[{prefix}_]{host}_{pid}.async_llm.{ns}.pt.trace.json[.gz]"
_VLLM_FRONTEND = re.compile(r"(?P<who>.*_(?P<pid>\d+))\.async_llm\.\d+\.pt\.trace\.json(?:\.gz)?\Z")
_TORCH_DEFAULT = re.compile(r"(?P<worker>.+)\.\d+\.pt\.trace\.json(?:\.gz)?\Z")


def is_trace_name(name: str) -> bool:
    """A file ``instrument analyze`` reads: ``.json`` / ``.json.gz``, not hidden (the SDK's temporaries)."""
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES)


def worker_label(path: str) -> str:
    """What a rank-less file is called in the report: torch's ``{worker}`` part, else the name."""
    name = Path(path).name
    match = _TORCH_DEFAULT.match(name)
    if match is not None:
        return match["worker"]
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", *TRACE_SUFFIXES):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def vllm_dp_rank(name: str) -> tuple[int, int] | None:
    """``(dp, R)`` of a vLLM worker name with data parallelism, else ``None``."""
    match = _VLLM_DP.search(name)
    return None if match is None else (int(match["dp"]), int(match["rank"]))


def from_name(path: Path) -> TraceFile | None:
    """Who wrote ``path``, read from its name alone; ``None`` when the name says nothing."""
    name = path.name
    found = _sdk(path) or _verl(path) or _engine(path)
    if found is not None:
        return found
    match = _VLLM_FRONTEND.match(name)
    if match is not None:  # a frontend belongs to a replica, not a rank: named by its process
        step = _PREFIX_STEP.search(match["who"])
        return TraceFile(
            str(path), "rollout", "frontend", int(step[1]) if step else None, None, None, tool="vllm",
            source="engine", worker=f"frontend-pid{match['pid']}",
        )  # fmt: skip
    match = _HTA.match(name)
    if match is not None:
        rank = int(match["rank"])
        return TraceFile(str(path), "unknown", WHOLE_TRACE, None, rank, None, source="name", inside=True)
    return None


def _sdk(path: Path) -> TraceFile | None:
    name = path.name
    parsed = naming.parse_trace_name(name)
    if parsed is not None:
        return TraceFile(
            path=str(path),
            role=parsed.role,
            stage=parsed.stage,
            step=parsed.step,
            rank=parsed.rank,
            world_size=parsed.world_size,
            window=parsed.window,
            partial=parsed.partial,
            source="name",
        )
    match = naming.ENGINE_TRACE.match(name)
    if match is not None:
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="engine",
            step=int(match["step"]),
            rank=None if match["rank"] is None else int(match["rank"]),
            world_size=int(match["world"]),
            tool="vllm",
            replica=int(match["replica"]),
            source="engine",
        )
    match = naming.FRONTEND_TRACE.match(name)
    if match is not None:
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="frontend",
            step=int(match["step"]),
            rank=None,
            world_size=None,
            tool="vllm",
            replica=int(match["replica"]),
            source="engine",
        )
    return None


def _verl(path: Path) -> TraceFile | None:
    match = _VERL.match(path.name)
    if match is None or int(match["rank"]) >= int(match["world"]):
        return None
    stage = match["stage"]
    return TraceFile(
        path=str(path),
        role=match["role"],
        stage=stage or WHOLE_TRACE,
        step=int(match["step"]),
        rank=int(match["rank"]),
        world_size=int(match["world"]),
        source="name",
        inside=stage is None,  # a whole step: its stages are the annotations inside
    )


def _engine(path: Path) -> TraceFile | None:
    name = path.name
    local = engine_trace_local_rank(name)
    dp = vllm_dp_rank(name) if local is None else None
    if local is None and dp is None:
        return None
    step = _PREFIX_STEP.search(name)
    return TraceFile(
        path=str(path),
        role="rollout",
        stage="engine",
        step=int(step[1]) if step else None,
        rank=local,
        world_size=None,
        tool="sglang" if "-TP-" in name else "vllm",
        source="engine",
        # dp > 0: the place in the replica needs the ranks per dp rank, counted over the directory
        worker=None if dp is None else f"dp{dp[0]}-rank{dp[1]}",
    )


def complete_dp_ranks(files: list[TraceFile]) -> list[TraceFile]:
    """vLLM workers of data-parallel rank ``d > 0`` get their place in the replica, ``d * n + R``, where
    ``n`` (tp x pp) is counted from the directory's own names (the largest ``R`` + 1)."""
    places = {f.path: vllm_dp_rank(Path(f.path).name) for f in files if f.worker is not None and f.rank is None}
    known = [place for place in places.values() if place is not None]
    if not known:
        return files
    per_dp = 1 + max(rank for _, rank in known)
    out = []
    for trace in files:
        place = places.get(trace.path)
        if place is not None:
            trace = replace(trace, rank=place[0] * per_dp + place[1], worker=None)  # noqa: PLW2901
        out.append(trace)
    return out
