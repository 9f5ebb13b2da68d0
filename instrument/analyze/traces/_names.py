"""Who wrote a trace file, read from its name: every name form ``instrument analyze`` knows.

Forms, tried in this order (:func:`from_name`):

- this SDK's names (:func:`instrument.naming.parse_trace_name`) and its relocated vLLM engine and
  frontend traces (:data:`instrument.naming.ENGINE_TRACE` / ``FRONTEND_TRACE``);
- verl's ``{role}[_{stage}]_step{S}_rank{r}-of-{W}_pid{p}_{ts}.json[.gz]``: without a stage the file
  holds a whole step, and its stages are found inside (:attr:`TraceFile.inside`);
- a registered engine's own names (:func:`instrument.ranks.parse_engine_trace_name`: vLLM's
  ``[dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_]rank{R}.{ns}.pt.trace.json.gz`` and frontends, SGLang's
  ``{ts}-TP-{t}….trace.json.gz``, any engine added with :func:`instrument.rollout.register_engine`):
  engine traces, read through the one grammar each engine has;
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
from instrument.analyze.model import TraceFile
from instrument.ranks import EngineTraceName, parse_engine_trace_name

__all__ = [
    "TRACE_SUFFIXES",
    "WHOLE_TRACE",
    "complete_dp_ranks",
    "from_name",
    "is_trace_name",
    "worker_label",
]

TRACE_SUFFIXES = (".json.gz", ".json")
WHOLE_TRACE = "trace"
"""Stage label of a file analysed whole (no step or stage range inside)."""

# verl: no host field (the SDK's names have one), role in dashes, a stage that may hold "_"
_VERL = re.compile(
    r"(?P<role>[A-Za-z0-9.=+-]+)(?:_(?P<stage>[A-Za-z0-9._=+-]+?))?_step(?P<step>\d+)"
    r"_rank(?P<rank>\d+)-of-(?P<world>[1-9]\d*)_pid\d+_\d+(?:\.pt\.trace)?\.json(?:\.gz)?\Z"
)
_HTA = re.compile(r"rank-(?P<rank>\d+)(?:[._-][^/]*)?\.json(?:\.gz)?\Z")
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


def _dp_place(parsed: EngineTraceName | None) -> tuple[int, int] | None:
    """``(dp, R)`` of a worker whose rank counts within DP rank ``dp > 0`` (its place needs tp x pp), else ``None``."""
    if parsed is None or parsed.frontend or not parsed.dp or parsed.rank is None:
        return None
    return parsed.dp, parsed.rank


def from_name(path: Path) -> TraceFile | None:
    """Who wrote ``path``, read from its name alone; ``None`` when the name says nothing."""
    name = path.name
    found = _sdk(path) or _verl(path) or _engine(path)
    if found is not None:
        return found
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
        original = parse_engine_trace_name(match["orig"])  # the engine's own name, behind our prefix
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="engine",
            step=int(match["step"]),
            rank=None if match["rank"] is None else int(match["rank"]),
            world_size=int(match["world"]),
            tool="vllm" if original is None else original.engine,
            replica=int(match["replica"]),
            source="engine",
        )
    match = naming.FRONTEND_TRACE.match(name)
    if match is not None:
        original = parse_engine_trace_name(match["orig"])
        return TraceFile(
            path=str(path),
            role=match["role"],
            stage="frontend",
            step=int(match["step"]),
            rank=None,
            world_size=None,
            tool="vllm" if original is None else original.engine,
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
    """A registered engine's own trace name: a worker (its rank in the replica, when the name tells) or a
    frontend (it belongs to a replica, not a rank: named by its process)."""
    parsed = parse_engine_trace_name(path.name)
    if parsed is None:
        return None
    if parsed.frontend:
        return TraceFile(
            str(path), "rollout", "frontend", parsed.step, None, None, tool=parsed.engine, source="engine",
            worker=f"frontend-pid{parsed.pid}" if parsed.pid is not None else "frontend",
        )  # fmt: skip
    local = parsed.local_rank()
    dp = _dp_place(parsed) if local is None else None
    if local is None and dp is None:
        return None  # a worker whose name does not tell its rank: read as a whole trace below
    return TraceFile(
        path=str(path),
        role="rollout",
        stage="engine",
        step=parsed.step,
        rank=local,
        world_size=None,
        tool=parsed.engine,
        source="engine",
        # dp > 0: the place in the replica needs the ranks per dp rank, counted over the directory
        worker=None if dp is None else f"dp{dp[0]}-rank{dp[1]}",
    )


def complete_dp_ranks(files: list[TraceFile]) -> list[TraceFile]:
    """Engine workers of data-parallel rank ``d > 0`` get their place in the replica, ``d * n + R``, where
    ``n`` (tp x pp) is counted from the directory's own names (the largest ``R`` + 1)."""
    places = {
        f.path: _dp_place(parse_engine_trace_name(Path(f.path).name))
        for f in files
        if f.worker is not None and f.rank is None
    }
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
