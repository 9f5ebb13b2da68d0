"""The step timeline's file format: every step, stage and mini-batch span of one process (pure; stdlib only).

A timeline file is written by the run (``instrument.run._timeline``) into ``save_path`` as
``{role}_timeline_step0_rank{r}-of-{W}_{host}_pid{pid}_{ns}`` + :data:`TIMELINE_SUFFIX`, and read
by :func:`read_timeline`. It is a log, appended while training runs, so that a crash keeps what
was written: a torn tail is read up to the last complete record.

Layout: the line :data:`MAGIC`, one JSON line (the header: role, rank, world size, host, pid and
the clock origin), then records, each starting with a one-byte tag:

* ``N`` a name: ``id:u16 kind:u8 role_len:u16 role stage_len:u16 stage`` (each span kind, role
  and stage is written once; spans refer to it by id);
* ``T`` a thread: ``index:u16 ident:u64``;
* ``S`` a span: ``name:u16 thread:u16 step:u32 start_ns:i64 duration_ns:i64`` — 25 bytes;
* ``C`` a clock estimate: ``offset_ns:i64 uncertainty_ns:i64 len:u16 source`` — this process's
  clock minus the reference clock (rank 0's), as a round trip measured it.

Times are ``time.perf_counter_ns()`` values (``CLOCK_MONOTONIC`` on Linux: every process of a
host reads the same clock); the header's ``clock`` pairs one such value with ``time.time_ns()``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from instrument.naming import TIMELINE_STAGE, TIMELINE_SUFFIX

__all__ = [
    "KINDS",
    "MAGIC",
    "SPAN_BYTES",
    "TIMELINE_STAGE",
    "TIMELINE_SUFFIX",
    "ClockEstimate",
    "Span",
    "Timeline",
    "TimelineError",
    "encode_clock",
    "encode_header",
    "encode_name",
    "encode_span",
    "encode_thread",
    "read_timeline",
]

MAGIC = b"INSTRUMENT-TIMELINE 1\n"
"""The first line of every timeline file (the format's version is its last word)."""
KINDS = ("step", "stage", "window")
"""What a span is: a ``profile_step``, a ``profiled_stage`` call, or a ``profile_window``."""

_MAX_HEADER = 1 << 16  # a header longer than this is not ours
_NAME = struct.Struct("<HBH")  # id, kind, role length (then role, stage length, stage)
_LEN = struct.Struct("<H")
_THREAD = struct.Struct("<HQ")
_SPAN = struct.Struct("<HHIqq")
_CLOCK = struct.Struct("<qqH")
SPAN_BYTES = 1 + _SPAN.size
"""Bytes one span takes on disk, its tag included."""


class TimelineError(ValueError):
    """A file that is not a timeline, or one whose records make no sense; the message says where."""


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """One span of a process: a step, a stage call or a mini-batch, on that process's clock (ns).

    Slots: an analysis of thousands of ranks holds millions of them."""

    kind: str
    role: str
    stage: str
    step: int
    rank: int
    start_ns: int
    end_ns: int
    thread: int = 0

    @property
    def duration_ns(self) -> int:
        """How long the span lasted."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class ClockEstimate:
    """This process's clock minus the reference clock, and how far off that may be (both ns)."""

    offset_ns: int
    uncertainty_ns: int
    source: str


@dataclass(frozen=True)
class Timeline:
    """A timeline file read back: its header, its spans, its clock estimates, and whether its tail was torn."""

    path: str
    role: str
    rank: int
    world_size: int
    host: str
    pid: int
    mono_origin_ns: int
    wall_origin_ns: int
    spans: tuple[Span, ...]
    clocks: tuple[ClockEstimate, ...] = ()
    torn: bool = False
    threads: dict[int, int] = field(default_factory=dict)

    @property
    def clock(self) -> ClockEstimate | None:
        """The estimate with the smallest uncertainty, if any was measured."""
        return min(self.clocks, key=lambda c: c.uncertainty_ns, default=None)


def encode_header(*, role: str, rank: int, world_size: int, host: str, pid: int, mono_ns: int, wall_ns: int) -> bytes:
    """The magic line and the header line of a new timeline file."""
    header = {
        "role": role,
        "rank": rank,
        "world_size": world_size,
        "host": host,
        "pid": pid,
        "clock": {"mono_origin_ns": mono_ns, "wall_origin_ns": wall_ns},
    }
    return MAGIC + json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def encode_name(name_id: int, kind: str, role: str, stage: str) -> bytes:
    """Define ``name_id`` as (kind, role, stage) for the spans that follow."""
    role_bytes, stage_bytes = role.encode("utf-8"), stage.encode("utf-8")
    return (
        b"N"
        + _NAME.pack(name_id, KINDS.index(kind), len(role_bytes))
        + role_bytes
        + _LEN.pack(len(stage_bytes))
        + stage_bytes
    )


def encode_thread(index: int, ident: int) -> bytes:
    """Define thread ``index`` as the thread whose ``threading.get_ident()`` is ``ident``."""
    return b"T" + _THREAD.pack(index, ident & 0xFFFF_FFFF_FFFF_FFFF)


def encode_span(name_id: int, thread: int, step: int, start_ns: int, end_ns: int) -> bytes:
    """One span record (:data:`SPAN_BYTES` bytes)."""
    return b"S" + _SPAN.pack(name_id, thread, step, start_ns, end_ns - start_ns)


def encode_clock(offset_ns: int, uncertainty_ns: int, source: str) -> bytes:
    """A clock estimate: this process's clock minus the reference's, within ``uncertainty_ns``."""
    text = source.encode("utf-8")[:200]
    return b"C" + _CLOCK.pack(offset_ns, uncertainty_ns, len(text)) + text


def _header(data: bytes, path: str) -> tuple[dict[str, Any], int]:
    if not data.startswith(MAGIC):
        raise TimelineError(f"{path}: not a timeline file (it does not start with {MAGIC[:-1].decode()!r})")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        raise TimelineError(f"{path}: the header line is missing or cut short")
    try:
        header = json.loads(data[len(MAGIC) : end])
        clock = header["clock"]
        values = {
            "role": str(header["role"]),
            "rank": int(header["rank"]),
            "world_size": int(header["world_size"]),
            "host": str(header["host"]),
            "pid": int(header["pid"]),
            "mono_origin_ns": int(clock["mono_origin_ns"]),
            "wall_origin_ns": int(clock["wall_origin_ns"]),
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise TimelineError(f"{path}: the header is not a timeline header ({type(exc).__name__}: {exc})") from None
    return values, end + 1


class _TornError(Exception):
    """The data ends inside a record: a writer stopped mid-write."""


def _records(data: bytes, offset: int, path: str) -> Iterator[tuple[bytes, tuple[Any, ...]]]:
    size = len(data)

    def take(fmt: struct.Struct, at: int) -> tuple[Any, ...]:
        if at + fmt.size > size:
            raise _TornError
        return fmt.unpack_from(data, at)

    def text(at: int, length: int) -> str:
        if at + length > size:
            raise _TornError
        return data[at : at + length].decode("utf-8", errors="replace")

    while offset < size:
        tag = data[offset : offset + 1]
        at = offset + 1
        if tag == b"S":
            yield tag, take(_SPAN, at)
            offset = at + _SPAN.size
        elif tag == b"N":
            name_id, kind, role_len = take(_NAME, at)
            at += _NAME.size
            role = text(at, role_len)
            (stage_len,) = take(_LEN, at + role_len)
            stage = text(at + role_len + _LEN.size, stage_len)
            if kind >= len(KINDS):
                raise TimelineError(f"{path}: unknown span kind {kind} at byte {offset}")
            yield tag, (name_id, KINDS[kind], role, stage)
            offset = at + role_len + _LEN.size + stage_len
        elif tag == b"T":
            yield tag, take(_THREAD, at)
            offset = at + _THREAD.size
        elif tag == b"C":
            offset_ns, uncertainty_ns, length = take(_CLOCK, at)
            yield tag, (offset_ns, uncertainty_ns, text(at + _CLOCK.size, length))
            offset = at + _CLOCK.size + length
        else:
            raise TimelineError(f"{path}: unknown record {tag!r} at byte {offset}: not written by this format")


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a timeline file; a torn tail is read up to its last complete record (``torn`` is then true).

    Raises :class:`TimelineError` for a file that is not a timeline or holds a record of no known kind,
    ``OSError`` when it cannot be read.
    """
    shown = os.fspath(path)
    with open(path, "rb") as handle:
        data = handle.read()
    header, offset = _header(data, shown)
    rank = header["rank"]
    names: dict[int, tuple[str, str, str]] = {}
    threads: dict[int, int] = {}
    spans: list[Span] = []
    clocks: list[ClockEstimate] = []
    torn = False
    try:
        for tag, values in _records(data, offset, shown):
            if tag == b"S":
                name_id, thread, step, start_ns, duration_ns = values
                name = names.get(name_id)
                if name is None:
                    raise TimelineError(f"{shown}: a span refers to name {name_id}, never defined")
                spans.append(Span(*name, step=step, rank=rank, start_ns=start_ns, end_ns=start_ns + duration_ns,
                                  thread=thread))  # fmt: skip
            elif tag == b"N":
                names[values[0]] = values[1:]
            elif tag == b"T":
                threads[values[0]] = values[1]
            else:
                clocks.append(ClockEstimate(*values))
    except _TornError:
        torn = True
    return Timeline(path=shown, spans=tuple(spans), clocks=tuple(clocks), torn=torn, threads=threads, **header)
