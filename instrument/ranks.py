"""Which ranks and engine replicas are profiled (pure; standard library only).

Ranks are global ranks of the job.  A rollout replica spans
``gpus_per_replica`` (tp x pp x dp) consecutive global ranks: global rank
``g`` is local rank ``g % gpus_per_replica`` of replica ``g // gpus_per_replica``.
Engine trace files carry only the local rank.  How each engine names its files is a
:class:`TraceNames` grammar in one registry, filled by ``instrument.rollout``'s engine registry:
the built-in engines' grammars live in their modules (:data:`instrument.rollout.vllm.TRACES`,
:data:`instrument.rollout.sglang.TRACES`) and are loaded on the registry's first read; any other
engine's is added by ``instrument.rollout.register_engine``. :func:`engine_trace_local_rank` reads
the local rank with whichever grammar knows the name, :func:`engine_trace_rank` turns it into a
global rank.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from instrument._checks import check_int

__all__ = [
    "EngineTraceName",
    "LocalRankParser",
    "TraceNames",
    "engine_trace_local_rank",
    "engine_trace_rank",
    "is_profiled_rank",
    "keep_engine_trace",
    "local_rank_of",
    "parse_engine_trace_name",
    "profiled_ranks",
    "ranks_to_keep",
    "register_trace_names",
    "registered_trace_names",
    "replica_of",
    "replicas_to_drive",
    "trace_names",
    "unregister_trace_names",
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
    replica: int,
    ranks: Iterable[int],
    all_ranks: bool,
    world_size: int,
    gpus_per_replica: int,
    *,
    peers: bool = False,
) -> frozenset[int]:
    """The selected global ranks of ``replica``: traces of its other workers (TP peers) are dropped.

    With ``peers``, a replica holding a selected rank keeps every rank's traces (its peers included).
    """
    _check_world(world_size, gpus_per_replica)
    _check_rank(replica, world_size // gpus_per_replica, "replica")
    first = replica * gpus_per_replica
    members = range(first, first + gpus_per_replica)
    selected = set(profiled_ranks(ranks, all_ranks, world_size))
    kept = frozenset(rank for rank in members if rank in selected)
    return frozenset(members) if peers and kept else kept


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

    ``parse`` reads the local rank (default :func:`engine_trace_local_rank`: every registered engine's names).
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


# --------------------------------------------------------------------------- engine trace names

_WORKER_GROUPS = frozenset({"rank", "dp"})
_FRONTEND_GROUPS = frozenset({"pid"})
_ENGINE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class EngineTraceName:
    """What an engine's own trace file name tells: which engine, frontend or worker, and the ranks it carries."""

    engine: str
    frontend: bool = False
    rank: int | None = None  # the worker's rank, counted within DP rank ``dp`` when the name has one
    dp: int | None = None  # the data-parallel rank, where the name carries one
    pid: int | None = None  # a frontend's process id, where the name carries one
    step: int | None = None  # the step of a ``step{S}`` prefix

    def local_rank(self, *, ranks_per_dp_rank: int | None = None) -> int | None:
        """The rank inside the replica, or ``None`` when the name alone does not tell.

        A rank counted within DP rank ``d > 0`` is ``d * ranks_per_dp_rank + rank``: ``None``
        without ``ranks_per_dp_rank`` (tp x pp). Frontends have none.
        """
        if self.frontend or self.rank is None:
            return None
        if not self.dp:
            return self.rank
        if ranks_per_dp_rank is None:
            return None
        check_int("ranks_per_dp_rank", ranks_per_dp_rank, 1)
        return self.dp * ranks_per_dp_rank + self.rank


def _patterns(field: str, value: object, groups: frozenset[str]) -> tuple[re.Pattern[str], ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise TypeError(f"'{field}' must be a tuple of regular expressions (str): {value!r}")
    compiled = []
    for i, source in enumerate(value):
        if not isinstance(source, str):
            raise TypeError(f"'{field}' pattern {i} must be a str: {source!r}")
        try:
            pattern = re.compile(source)
        except re.error as exc:
            raise ValueError(f"'{field}' pattern {i} is not a regular expression ({exc}): {source!r}") from None
        unknown = sorted(set(pattern.groupindex) - groups)
        if unknown:
            raise ValueError(
                f"'{field}' pattern {i} has groups {unknown}: only {sorted(groups)} mean something: {source!r}"
            )
        if "dp" in pattern.groupindex and "rank" not in pattern.groupindex:
            raise ValueError(f"'{field}' pattern {i} has a 'dp' group without a 'rank' group: {source!r}")
        compiled.append(pattern)
    return tuple(compiled)


@dataclass(frozen=True)
class TraceNames:
    """How one engine names its trace files: its grammar, for relocation, ``ranks`` and ``instrument analyze``.

    ``workers`` are regular expressions searched in a file's base name, tried in order; the first
    that matches makes it a worker trace of this engine. Their named groups: ``rank`` (the rank
    inside the replica) and ``dp`` (a data-parallel rank, ``rank`` then counting within it); a
    pattern without ``rank`` recognises names whose rank the name does not tell. ``frontend``
    (searched first; optional group ``pid``) recognises the traces of an API server, which has no
    GPU rank. ``prefix_joint`` is what the engine puts between the ``step{S}`` prefix our drivers
    send and its own name. ``engine`` is the engine's name, also the manifest's ``tool``.
    Invalid values raise ``TypeError`` / ``ValueError`` naming the field.
    """

    engine: str
    workers: tuple[str, ...]
    frontend: str | None = None
    prefix_joint: str = "_"
    _compiled: tuple[tuple[re.Pattern[str], ...], re.Pattern[str] | None, re.Pattern[str]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.engine, str) or not _ENGINE_NAME.match(self.engine):
            raise ValueError(f"'engine' must be 1-32 of [a-z0-9_-], starting with a letter: {self.engine!r}")
        workers = _patterns("workers", self.workers, _WORKER_GROUPS)
        if not workers:
            raise ValueError("'workers' must hold at least one pattern")
        frontend = None if self.frontend is None else _patterns("frontend", (self.frontend,), _FRONTEND_GROUPS)[0]
        joint = self.prefix_joint
        if not isinstance(joint, str) or len(joint) != 1 or joint.isalnum():
            raise ValueError(f"'prefix_joint' must be one character that is not a letter or digit: {joint!r}")
        step = re.compile(rf"^step(\d+){re.escape(joint)}")
        object.__setattr__(self, "workers", tuple(self.workers))  # a list given is kept as the tuple it means
        object.__setattr__(self, "_compiled", (workers, frontend, step))

    def parse(self, filename: str) -> EngineTraceName | None:
        """What ``filename`` (its base name) tells, if it is one of this engine's traces; else ``None``."""
        base = os.path.basename(filename)
        workers, frontend, step_prefix = self._compiled
        step = step_prefix.match(base)
        at = None if step is None else int(step[1])
        if frontend is not None and (match := frontend.search(base)) is not None:
            pid = match.groupdict().get("pid")
            return EngineTraceName(self.engine, frontend=True, pid=None if pid is None else int(pid), step=at)
        for pattern in workers:
            match = pattern.search(base)
            if match is not None:
                found = match.groupdict()
                rank, dp = found.get("rank"), found.get("dp")
                return EngineTraceName(
                    self.engine, rank=None if rank is None else int(rank), dp=None if dp is None else int(dp), step=at
                )
        return None

    def local_rank(self, filename: str, *, ranks_per_dp_rank: int | None = None) -> int | None:
        """The rank inside its replica that ``filename`` carries, or ``None`` (a :class:`LocalRankParser`)."""
        parsed = self.parse(filename)
        return None if parsed is None else parsed.local_rank(ranks_per_dp_rank=ranks_per_dp_rank)

    def is_frontend(self, filename: str) -> bool:
        """Whether ``filename`` is one of this engine's frontend (API server) traces."""
        frontend = self._compiled[1]
        return frontend is not None and frontend.search(os.path.basename(filename)) is not None

    def step(self, filename: str) -> int | None:
        """The step of a ``step{S}{prefix_joint}`` prefix, else ``None``."""
        match = self._compiled[2].match(os.path.basename(filename))
        return None if match is None else int(match[1])


# The built-in engines' grammars live in their engine modules (instrument.rollout.vllm, .sglang) and
# reach this registry when instrument.rollout resolves those engines. This module imports only the
# standard library, so it cannot import them itself: the package hands it a loader
# (_set_engine_loader, in instrument/__init__.py), called once before the registry is first read.
_load_engines: Callable[[], object] | None = None
_engines_loaded = False
_loading = threading.local()  # the loader registers through this module: its own reads must not load again

_REGISTRY_LOCK = threading.Lock()
_REGISTERED: tuple[TraceNames, ...] = ()  # replaced whole, so readers never lock


def _set_engine_loader(load: Callable[[], object]) -> None:
    """Have the registry call ``load()`` once, before it is first read (it registers the built-in engines)."""
    global _load_engines, _engines_loaded
    _load_engines, _engines_loaded = load, False


def _with_engines() -> tuple[TraceNames, ...]:
    """The registry, once the built-in engines are in it (the loader runs unlocked: it takes the engines' lock)."""
    global _engines_loaded
    load = _load_engines
    if not _engines_loaded and load is not None and not getattr(_loading, "active", False):
        _loading.active = True
        try:
            load()
        finally:
            _loading.active = False
        _engines_loaded = True
    return _REGISTERED


def register_trace_names(names: TraceNames) -> TraceNames:
    """Add an engine's grammar (``instrument.rollout.register_engine`` does it for you); returns it.

    Registering the same grammar again does nothing; another grammar under a registered engine's
    name raises ``ValueError``. Grammars are tried in registration order, the built-ins first.
    """
    global _REGISTERED
    if not isinstance(names, TraceNames):
        raise TypeError(f"'names' must be a TraceNames: {type(names).__name__}")
    _with_engines()  # the built-ins first, and a clash with one of their names is seen
    with _REGISTRY_LOCK:
        for known in _REGISTERED:
            if known.engine == names.engine:
                if known == names:
                    return known
                raise ValueError(f"an engine named {names.engine!r} is registered already, with other trace names")
        _REGISTERED = (*_REGISTERED, names)
    return names


def unregister_trace_names(engine: str) -> None:
    """Forget the grammar of ``engine`` (nothing if there is none)."""
    global _REGISTERED
    _with_engines()  # else a built-in forgotten now would come back at the first read
    with _REGISTRY_LOCK:
        _REGISTERED = tuple(names for names in _REGISTERED if names.engine != engine)


def registered_trace_names() -> tuple[TraceNames, ...]:
    """Every registered engine's grammar, in the order they are tried."""
    return _with_engines()


def trace_names(engine: str) -> TraceNames:
    """The registered grammar of ``engine``; ``ValueError`` naming the registered ones otherwise."""
    registered = _with_engines()
    for names in registered:
        if names.engine == engine:
            return names
    raise ValueError(f"no engine named {engine!r}; registered: {', '.join(n.engine for n in registered)}")


def parse_engine_trace_name(filename: str) -> EngineTraceName | None:
    """What ``filename`` tells, read by the first registered engine whose grammar knows it; else ``None``."""
    for names in _with_engines():
        parsed = names.parse(filename)
        if parsed is not None:
            return parsed
    return None


def engine_trace_local_rank(filename: str, *, ranks_per_dp_rank: int | None = None) -> int | None:
    """The rank inside its replica written in a registered engine's worker trace name, or ``None``.

    A name that counts its rank within a data-parallel rank ``d > 0`` (vLLM's ``dp{d}_..._rank{R}``)
    is at ``d * ranks_per_dp_rank + R``, so without ``ranks_per_dp_rank`` (tp x pp) it gives
    ``None``.  ``None`` also for frontend traces, names whose grammar says the rank is not
    readable from them (SGLang's ``-DP-`` / ``-PP-``) and names no registered engine knows.
    """
    parsed = parse_engine_trace_name(filename)
    return None if parsed is None else parsed.local_rank(ranks_per_dp_rank=ranks_per_dp_rank)
