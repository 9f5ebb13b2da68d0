"""Self-describing trace file names (pure; standard library only).

A trace name is::

    {role}_{stage}_step{S}_rank{r}-of-{W}[_mb{a}[-{b}]][_partial][_trig]_{host}_pid{pid}_{timestamp}

followed by :data:`TRACE_SUFFIX`.  ``_`` separates fields, so labels (role,
stage, host) are sanitised to ``[A-Za-z0-9.=+-]``: every other character
becomes ``-``, runs of dots collapse to one and edge dots are stripped, so no
label can hold a separator, a ``/``, ``..`` or a shell metacharacter.
:func:`parse_trace_name` inverts :func:`trace_basename` exactly.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from instrument._checks import check_int

__all__ = [
    "CONTINUOUS_STAGE",
    "ENGINE_TRACE",
    "FRONTEND_TRACE",
    "LABEL_MAX_LEN",
    "MEMORY_TIMELINE_SUFFIX",
    "OOM_STAGE_PREFIX",
    "SCRATCH_PREFIX",
    "SNAPSHOT_SUFFIX",
    "SDK_STAGE_PREFIX",
    "TIMELINE_STAGE",
    "TIMELINE_SUFFIX",
    "TRACE_SUFFIX",
    "TraceIdentity",
    "TraceName",
    "check_label",
    "engine_trace_prefix",
    "next_timestamp_ns",
    "parse_trace_name",
    "sanitize_label",
    "short_hostname",
    "trace_basename",
    "trace_prefix",
]

TRACE_SUFFIX = ".pt.trace.json.gz"
"""Suffix of torch traces; TensorBoard and HTA look for it."""
SNAPSHOT_SUFFIX = ".pickle"
"""Suffix of CUDA memory snapshots (PyTorch's memory_viz opens them)."""
MEMORY_TIMELINE_SUFFIX = ".memory-timeline.html"
"""Suffix of torch's memory timeline pages, saved beside their trace."""
OOM_STAGE_PREFIX = "oom-"
"""A snapshot saved at an out-of-memory error names its stage ``oom-{stage}``."""
TIMELINE_SUFFIX = ".timeline.bin"
"""Suffix of step timeline files (:mod:`instrument.timeline`)."""
TIMELINE_STAGE = "timeline"
"""The stage label in a timeline file's name (its step is 0: the file holds every step)."""
SCRATCH_PREFIX = ".instrument-tmp-"
"""Each process's private folder in ``save_path`` for files not yet complete (never a trace)."""

SDK_STAGE_PREFIX = "instrument:"
"""The step timeline names the SDK's own work on the training thread ``instrument:<what>`` (profiler start and
stop, a trace's export); the analysis keeps that time apart from the user's stages and idle, so no user label
may start with it (:func:`check_label`)."""

CONTINUOUS_STAGE = "continuous"
"""Stage label of the one trace per step that continuous mode writes."""

LABEL_MAX_LEN = 40
"""Labels are cut to this many characters: three of them and the numbers stay below the 255-byte name limit."""

# Suffixes parse_trace_name strips, longest first (".pickle": memory snapshots; the HTML: memory timelines).
_KNOWN_SUFFIXES = (
    ".pt.trace.json.gz",
    ".pt.trace.json",
    ".json.gz",
    ".json",
    ".nsys-rep",
    SNAPSHOT_SUFFIX,
    MEMORY_TIMELINE_SUFFIX,
    TIMELINE_SUFFIX,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9.=+-]")
_DOTS = re.compile(r"\.{2,}")
# A sanitised label: no "_", no edge dots, no runs of dots.
_LABEL = r"[A-Za-z0-9=+-]+(?:\.[A-Za-z0-9=+-]+)*"
_NAME = re.compile(
    rf"(?P<role>{_LABEL})_(?P<stage>{_LABEL})"
    r"_step(?P<step>0|[1-9][0-9]*)_rank(?P<rank>0|[1-9][0-9]*)-of-(?P<world_size>[1-9][0-9]*)"
    r"(?:_mb(?P<first>0|[1-9][0-9]*)(?:-(?P<last>0|[1-9][0-9]*))?(?P<partial>_partial)?)?(?P<triggered>_trig)?"
    rf"_(?P<host>{_LABEL})_pid(?P<pid>0|[1-9][0-9]*)_(?P<timestamp_ns>0|[1-9][0-9]*)"
)

_clock_lock = threading.Lock()
_last_timestamp_ns = 0


def sanitize_label(label: str) -> str:
    """Return ``label`` made safe for a file name field; raise ``ValueError`` if nothing is left."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a str: {label!r}")
    safe = _DOTS.sub(".", _UNSAFE.sub("-", label))[:LABEL_MAX_LEN].strip(".")
    if not safe:
        raise ValueError(f"label has no character usable in a file name: {label!r}")
    return safe


_NOT_IN_LABELS = re.compile(r'["\\\x00-\x1f\x7f]')


def check_label(field: str, label: str) -> str:
    """Validate a role or stage label given by the user; return its file-name form.

    Labels also go verbatim into each trace's JSON metadata, which torch writes without
    escaping (it even turns backslashes into slashes): quotes, backslashes and control
    characters are refused here rather than corrupting every trace later.
    """
    if not isinstance(label, str):
        raise TypeError(f"{field!r} must be a str such as 'actor' (got {label!r})")
    if label.startswith(SDK_STAGE_PREFIX):
        raise ValueError(
            f"{field!r} must not start with {SDK_STAGE_PREFIX!r}: the step timeline names instrument's own work so "
            f"(got {label!r})"
        )
    bad = _NOT_IN_LABELS.search(label)
    if bad is not None:
        raise ValueError(
            f"{field!r} must not contain quotes, backslashes or control characters "
            f"(got {label!r}, with {bad.group()!r} at position {bad.start()})"
        )
    try:
        return sanitize_label(label)
    except ValueError:
        raise ValueError(f"{field!r} needs a letter or digit to name files with (got {label!r})") from None


def short_hostname() -> str:
    """This host's name, sanitised for use in trace names."""
    return sanitize_label(socket.gethostname() or "host")


def next_timestamp_ns() -> int:
    """Wall-clock nanoseconds, strictly increasing within this process (names never repeat)."""
    global _last_timestamp_ns
    with _clock_lock:
        _last_timestamp_ns = max(time.time_ns(), _last_timestamp_ns + 1)
        return _last_timestamp_ns


@dataclass(frozen=True, kw_only=True)
class TraceIdentity:
    """What one trace is of: who wrote it (role, rank of world_size), which stage of which step, which mini-batches.

    The one value behind a trace everywhere it appears: a recorder's spec, the trace's name
    (:meth:`prefix`), its manifest line and its parsed name all are (subclasses of) this value,
    so each field is spelled the same way in every one of them.
    """

    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    window: tuple[int, int] | None = None
    partial: bool = False
    triggered: bool = False

    def identity_fields(self) -> dict[str, Any]:
        """The identity's fields alone (a subclass's extra fields left out), as keywords."""
        return {f.name: getattr(self, f.name) for f in fields(TraceIdentity)}

    def prefix(self) -> str:
        """The part of the trace's file name these fields make (see :func:`trace_prefix`)."""
        return trace_prefix(**self.identity_fields())


@dataclass(frozen=True, kw_only=True)
class TraceName(TraceIdentity):
    """The fields of a trace name, as :func:`parse_trace_name` reads them: the identity, and where and when."""

    host: str
    pid: int
    timestamp_ns: int

    def basename(self) -> str:
        """The name these fields stand for (without suffix)."""
        return trace_basename(**asdict(self))


def trace_prefix(
    *,
    role: str,
    stage: str,
    step: int,
    rank: int,
    world_size: int,
    window: tuple[int, int] | None = None,
    partial: bool = False,
    triggered: bool = False,
) -> str:
    """The part of a trace name before ``_{host}_pid{pid}_{timestamp}``; ``triggered`` adds ``_trig``."""
    check_int("step", step, 0)
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"'rank' must be < world_size ({world_size}): {rank}")
    name = f"{sanitize_label(role)}_{sanitize_label(stage)}_step{step}_rank{rank}-of-{world_size}"
    if window is not None:
        first, last = window
        check_int("window first", first, 0)
        check_int("window last", last, first)
        name += f"_mb{first}" if first == last else f"_mb{first}-{last}"
    elif partial:
        raise ValueError("'partial' needs a 'window': only a mini-batch window can be partial")
    if partial:
        name += "_partial"
    if triggered:
        name += "_trig"
    return name


def trace_basename(
    *,
    role: str,
    stage: str,
    step: int,
    rank: int,
    world_size: int,
    host: str | None = None,
    pid: int | None = None,
    timestamp_ns: int | None = None,
    window: tuple[int, int] | None = None,
    partial: bool = False,
    triggered: bool = False,
) -> str:
    """Build a trace name without suffix; host, pid and timestamp default to this process and now."""
    prefix = trace_prefix(
        role=role,
        stage=stage,
        step=step,
        rank=rank,
        world_size=world_size,
        window=window,
        partial=partial,
        triggered=triggered,
    )
    host = short_hostname() if host is None else sanitize_label(host)
    pid = os.getpid() if pid is None else pid
    timestamp_ns = next_timestamp_ns() if timestamp_ns is None else timestamp_ns
    check_int("pid", pid, 0)
    check_int("timestamp_ns", timestamp_ns, 0)
    return f"{prefix}_{host}_pid{pid}_{timestamp_ns}"


def engine_trace_prefix(
    *, role: str, step: int, replica: int, rank: int | None, world_size: int, frontend: bool = False
) -> str:
    """The prefix a relocated engine trace gets in front of its original name.

    ``{role}_engine_step{S}_rank{g}-of-{W}_replica{r}_`` (``rank-unknown`` when the engine's name
    carries no readable rank), or ``{role}_frontend_step{S}_replica{r}_`` for frontend traces.
    :data:`ENGINE_TRACE` and :data:`FRONTEND_TRACE` read them back.
    """
    role = sanitize_label(role)
    if frontend:
        return f"{role}_frontend_step{step}_replica{replica}_"
    who = f"rank{rank}" if rank is not None else "rank-unknown"
    return f"{role}_engine_step{step}_{who}-of-{world_size}_replica{replica}_"


ENGINE_TRACE = re.compile(
    rf"(?P<role>{_LABEL})_engine_step(?P<step>\d+)_rank(?:(?P<rank>\d+)|-unknown)-of-(?P<world>\d+)"
    r"_replica(?P<replica>\d+)_(?P<orig>.+)\Z"
)
"""A relocated engine trace name: groups role, step, rank (``None`` if unknown), world, replica, orig."""

FRONTEND_TRACE = re.compile(rf"(?P<role>{_LABEL})_frontend_step(?P<step>\d+)_replica(?P<replica>\d+)_(?P<orig>.+)\Z")
"""A relocated frontend trace name: groups role, step, replica, orig."""


def parse_trace_name(name: str) -> TraceName | None:
    """Read the fields back from a trace name or path (suffix optional); ``None`` if it is not one."""
    base = os.path.basename(name)
    for suffix in _KNOWN_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    match = _NAME.fullmatch(base)
    if match is None:
        return None
    fields = match.groupdict()
    window: tuple[int, int] | None = None
    if fields["first"] is not None:
        first = int(fields["first"])
        last = first if fields["last"] is None else int(fields["last"])
        if last <= first and fields["last"] is not None:
            return None  # "_mb3-3" and "_mb4-3" are never written
        window = (first, last)
    if int(fields["rank"]) >= int(fields["world_size"]):
        return None
    if max(len(fields["role"]), len(fields["stage"]), len(fields["host"])) > LABEL_MAX_LEN:
        return None
    return TraceName(
        role=fields["role"],
        stage=fields["stage"],
        step=int(fields["step"]),
        rank=int(fields["rank"]),
        world_size=int(fields["world_size"]),
        host=fields["host"],
        pid=int(fields["pid"]),
        timestamp_ns=int(fields["timestamp_ns"]),
        window=window,
        partial=fields["partial"] is not None,
        triggered=fields["triggered"] is not None,
    )
