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
  clock minus the reference clock (rank 0's), as a round trip measured it;
* ``X`` an extension: ``ext:u8 length:u32 payload`` (``length`` bytes). A reader skips an
  extension whose ``ext`` it does not know, and reads the fields it knows of a longer payload than
  it expects (later versions append fields), so new record kinds need no new magic. Known:

  * ext ``1``, a request (:func:`encode_request`): ``stage:u16 thread:u16 step:u32 start_ns:i64
    duration_ns:i64 prompt_tokens:i64 output_tokens:i64`` — 40 bytes, 46 with the tag and the
    extension's head; ``stage`` is a name id (a stage's ``N`` record) or :data:`NO_STAGE`, a token
    count -1 when none was given.

  A reader of this format from before extensions existed raises :class:`TimelineError` ("unknown
  record b'X'") for a file that holds one: it refuses the whole file, never reads part of it.

Times are ``time.perf_counter_ns()`` values (``CLOCK_MONOTONIC`` on Linux: every process of a
host reads the same clock); the header's ``clock`` pairs one such value with ``time.time_ns()``.

Read back, a file's spans are columns (:class:`SpanColumns`: ~24 bytes a span against ~150 as
:class:`Span` objects, filled from runs of span records by strided copies, no Python step per
record), and the spans of many files a :class:`SpanTable` (each file's columns with the shift that
puts them on a common clock); both are sequences of :class:`Span`, made one at a time when read. Its
requests are columns too (:class:`RequestColumns`).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Container, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from instrument.naming import TIMELINE_STAGE, TIMELINE_SUFFIX

__all__ = [
    "KINDS",
    "MAGIC",
    "MAX_TOKENS",
    "NO_STAGE",
    "REQUEST_BYTES",
    "SPAN_BYTES",
    "TIMELINE_STAGE",
    "TIMELINE_SUFFIX",
    "ClockEstimate",
    "RequestColumns",
    "Span",
    "SpanColumns",
    "SpanTable",
    "Timeline",
    "TimelineError",
    "encode_clock",
    "encode_header",
    "encode_extension",
    "encode_name",
    "encode_request",
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
_S = ord("S")
_EXT = struct.Struct("<BI")  # extension: ext, payload length
_REQUEST = struct.Struct("<HHIqqqq")  # stage, thread, step, start, duration, prompt tokens, output tokens
_EXT_REQUEST = 1
REQUEST_BYTES = 1 + _EXT.size + _REQUEST.size
"""Bytes one request takes on disk, its tag and extension head included."""
NO_STAGE = 0xFFFF
"""A request's stage id when no stage held it."""
MAX_TOKENS = 10**15
"""The largest token count a request records (more is no count a generation gives)."""


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


_U32 = "I"  # unsigned 32 bits on every platform CPython runs on (step numbers are u32)
_SWAP = sys.byteorder != "little"  # the format is little-endian


class SpanColumns(Sequence[Span]):
    """One process's spans as columns: a :class:`Span` is made only when one is asked for.

    At 4,096 ranks an analysis holds millions of spans: ~20 bytes each here, ~150 as objects. Span ``i`` is
    ``names[name[i]]`` (kind, role, stage), ``step[i]``, ``start_ns[i]``, ``start_ns[i] + duration_ns[i]``
    and ``thread[i]``, all at ``rank``. Compares equal to any sequence of the same spans."""

    __slots__ = ("duration_ns", "name", "names", "rank", "start_ns", "step", "thread")

    def __init__(
        self,
        rank: int,
        names: Sequence[tuple[str, str, str]],
        name: MutableSequence[int],
        step: MutableSequence[int],
        start_ns: MutableSequence[int],
        duration_ns: MutableSequence[int],
        thread: MutableSequence[int],
    ) -> None:
        if not len(name) == len(step) == len(start_ns) == len(duration_ns) == len(thread):
            raise ValueError("span columns of different lengths")
        self.rank = rank
        self.names = names
        self.name = name
        self.step = step
        self.start_ns = start_ns
        self.duration_ns = duration_ns
        self.thread = thread

    @classmethod
    def of(cls, spans: Iterable[Span], rank: int | None = None) -> SpanColumns:
        """Spans of one rank packed as columns (``rank``: theirs, or the first one's; 0 for none)."""
        listed = spans if isinstance(spans, (list, tuple)) else list(spans)
        if rank is None:
            rank = listed[0].rank if listed else 0
        if any(s.rank != rank for s in listed):
            raise ValueError(f"SpanColumns holds the spans of one rank ({rank})")
        index: dict[tuple[str, str, str], int] = {}
        values = (
            [index.setdefault((s.kind, s.role, s.stage), len(index)) for s in listed],
            [s.step for s in listed],
            [s.start_ns for s in listed],
            [s.end_ns - s.start_ns for s in listed],
            [s.thread for s in listed],
        )
        try:  # compact when the values fit a machine word (they always do when read from a file)
            columns: tuple[MutableSequence[int], ...] = tuple(array("q", v) for v in values)
        except (OverflowError, TypeError):
            columns = values
        return cls(rank, tuple(index), *columns)

    def __len__(self) -> int:
        return len(self.name)

    def take(self, indices: Sequence[int]) -> SpanColumns:
        """The spans at ``indices``, in that order, as new columns (the same name table)."""
        columns = [
            array(c.typecode, map(c.__getitem__, indices)) if isinstance(c, array) else [c[i] for i in indices]
            for c in (self.name, self.step, self.start_ns, self.duration_ns, self.thread)
        ]
        return SpanColumns(self.rank, self.names, *columns)

    @overload
    def __getitem__(self, index: int) -> Span: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Span, ...]: ...
    def __getitem__(self, index: int | slice) -> Span | tuple[Span, ...]:
        if isinstance(index, slice):
            return tuple(self.span(i) for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("span index out of range")
        return self.span(index)

    def span(self, i: int, shift_ns: int = 0) -> Span:
        """Span ``i``, moved by ``-shift_ns``."""
        kind, role, stage = self.names[self.name[i]]
        start = self.start_ns[i] - shift_ns
        return Span(kind, role, stage, self.step[i], self.rank, start, start + self.duration_ns[i], self.thread[i])

    def __iter__(self) -> Iterator[Span]:
        return self.shifted(0)

    def shifted(self, shift_ns: int) -> Iterator[Span]:
        """Every span in order, moved by ``-shift_ns`` (one at a time: nothing is copied)."""
        names, rank = self.names, self.rank
        columns = (self.name, self.step, self.start_ns, self.duration_ns, self.thread)
        for n, step, written, duration, thread in zip(*columns, strict=True):
            kind, role, stage = names[n]
            start = written - shift_ns
            yield Span(kind, role, stage, step, rank, start, start + duration, thread)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable columns

    def __repr__(self) -> str:
        return f"SpanColumns(rank={self.rank}, {len(self)} spans)"


class SpanTable(Sequence[Span]):
    """Spans of many processes as columns, each part moved by its own shift (ns) when a span is made.

    ``parts`` is ``(columns, shift_ns)`` per process, in order; iterating gives every part's spans in turn,
    each at ``start - shift``. Putting a process on another clock is a shift here, never a copy."""

    __slots__ = ("_ends", "parts")

    def __init__(self, parts: Iterable[tuple[SpanColumns, int]] = ()) -> None:
        self.parts: tuple[tuple[SpanColumns, int], ...] = tuple(parts)
        ends, total = [], 0
        for columns, _ in self.parts:
            total += len(columns)
            ends.append(total)
        self._ends = ends

    @classmethod
    def of(cls, spans: Iterable[Span]) -> SpanTable:
        """Any spans, packed as one part per rank (a rank's spans keep their order)."""
        if isinstance(spans, SpanTable):
            return spans
        if isinstance(spans, SpanColumns):
            return cls([(spans, 0)])
        by_rank: dict[int, list[Span]] = {}
        for span in spans:
            group = by_rank.get(span.rank)
            if group is None:
                by_rank[span.rank] = group = []
            group.append(span)
        return cls((SpanColumns.of(group, rank), 0) for rank, group in by_rank.items())

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def steps(self, kind: str | None = None) -> set[int]:
        """The step numbers the spans (those of ``kind``) are in."""
        found: set[int] = set()
        for columns, _ in self.parts:
            if kind is None:
                found.update(columns.step)
                continue
            ids = {i for i, (k, _, _) in enumerate(columns.names) if k == kind}
            if ids:
                found.update(step for n, step in zip(columns.name, columns.step, strict=True) if n in ids)
        return found

    def where(
        self,
        *,
        ranks: Container[int] | None = None,
        steps: Container[int] | None = None,
        names: Callable[[str, str, str], bool] | None = None,
    ) -> SpanTable:
        """The spans at ``ranks``, in ``steps`` and whose (kind, role, stage) ``names`` keeps (``None``: all).

        One part for each of this table's, in order and with its shift (an empty one where nothing is kept),
        so that ``parts`` still pair with the timelines; a part kept whole is the same columns, not a copy."""
        parts = []
        for columns, shift in self.parts:
            if ranks is not None and columns.rank not in ranks:
                parts.append((columns.take(()), shift))
                continue
            named = [True] * len(columns.names) if names is None else [bool(names(*n)) for n in columns.names]
            wanted = steps is None or all(step in steps for step in set(columns.step))
            if wanted and all(named[n] for n in set(columns.name)):
                parts.append((columns, shift))
                continue
            pairs = zip(columns.name, columns.step, strict=True)
            if steps is None:
                keep = [i for i, (n, _) in enumerate(pairs) if named[n]]
            else:
                keep = [i for i, (n, step) in enumerate(pairs) if named[n] and step in steps]
            parts.append((columns.take(keep), shift))
        return SpanTable(parts)

    @overload
    def __getitem__(self, index: int) -> Span: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Span, ...]: ...
    def __getitem__(self, index: int | slice) -> Span | tuple[Span, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("span index out of range")
        part = bisect_right(self._ends, index)
        columns, shift = self.parts[part]
        return columns.span(index - (self._ends[part - 1] if part else 0), shift)

    def __iter__(self) -> Iterator[Span]:
        for columns, shift in self.parts:
            yield from columns.shifted(shift)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SpanTable({len(self.parts)} parts, {len(self)} spans)"


class RequestColumns:
    """One process's requests (generation calls) as columns: no object per request.

    Request ``i`` ran from ``start_ns[i]`` for ``duration_ns[i]`` on thread ``thread[i]`` in step ``step[i]``, inside
    the stage ``names[stage[i]]`` (``(kind, role, stage)``; ``stage[i]`` -1: none), with ``prompt_tokens[i]`` and
    ``output_tokens[i]`` tokens (-1: not given). ``names`` is the file's name table, the spans' own."""

    __slots__ = ("duration_ns", "names", "output_tokens", "prompt_tokens", "stage", "start_ns", "step", "thread")

    def __init__(
        self,
        names: Sequence[tuple[str, str, str]] = (),
        stage: MutableSequence[int] | None = None,
        step: MutableSequence[int] | None = None,
        start_ns: MutableSequence[int] | None = None,
        duration_ns: MutableSequence[int] | None = None,
        thread: MutableSequence[int] | None = None,
        prompt_tokens: MutableSequence[int] | None = None,
        output_tokens: MutableSequence[int] | None = None,
    ) -> None:
        columns = [array("q") if c is None else c for c in (stage, step, start_ns, duration_ns, thread)]
        tokens = [array("q") if c is None else c for c in (prompt_tokens, output_tokens)]
        if len({len(c) for c in (*columns, *tokens)}) > 1:
            raise ValueError("request columns of different lengths")
        self.names = names
        self.stage, self.step, self.start_ns, self.duration_ns, self.thread = columns
        self.prompt_tokens, self.output_tokens = tokens

    def __len__(self) -> int:
        return len(self.step)

    def stage_name(self, i: int) -> str | None:
        """The stage request ``i`` ran in, or ``None``."""
        entry = self.stage[i]
        return None if entry < 0 else self.names[entry][2]

    def rows(self) -> Iterator[tuple[str | None, int, int, int, int, int, int]]:
        """``(stage, step, start_ns, end_ns, thread, prompt_tokens, output_tokens)`` per request, one at a time."""
        for i in range(len(self)):
            start = self.start_ns[i]
            yield (
                self.stage_name(i),
                self.step[i],
                start,
                start + self.duration_ns[i],
                self.thread[i],
                self.prompt_tokens[i],
                self.output_tokens[i],
            )

    def __repr__(self) -> str:
        return f"RequestColumns({len(self)} requests)"


@dataclass(frozen=True)
class ClockEstimate:
    """This process's clock minus the reference clock, and how far off that may be (both ns)."""

    offset_ns: int
    uncertainty_ns: int
    source: str


@dataclass(frozen=True)
class Timeline:
    """A timeline file read back: its header, its spans, its requests, its clock estimates, and whether its tail
    was torn."""

    path: str
    role: str
    rank: int
    world_size: int
    host: str
    pid: int
    mono_origin_ns: int
    wall_origin_ns: int
    spans: Sequence[Span]  # read from a file: SpanColumns; Span values of its rank given are packed as them
    clocks: tuple[ClockEstimate, ...] = ()
    torn: bool = False
    threads: dict[int, int] = field(default_factory=dict)
    requests: RequestColumns = field(default_factory=RequestColumns)

    def __post_init__(self) -> None:
        spans = self.spans
        if not isinstance(spans, SpanColumns) and all(s.rank == self.rank for s in spans):
            object.__setattr__(self, "spans", SpanColumns.of(spans, self.rank))

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


def encode_extension(ext: int, payload: bytes) -> bytes:
    """An extension record: kind ``ext`` (0-255) and its payload, which a reader that does not know ``ext`` skips."""
    return b"X" + _EXT.pack(ext, len(payload)) + payload


def encode_request(
    stage_id: int, thread: int, step: int, start_ns: int, end_ns: int, prompt_tokens: int, output_tokens: int
) -> bytes:
    """One request record (:data:`REQUEST_BYTES` bytes): ``stage_id`` a stage's name id or :data:`NO_STAGE`,
    token counts -1 when not given."""
    payload = _REQUEST.pack(stage_id, thread, step, start_ns, end_ns - start_ns, prompt_tokens, output_tokens)
    return b"X" + _EXT.pack(_EXT_REQUEST, len(payload)) + payload


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


def _record(data: bytes, offset: int, size: int, path: str) -> tuple[bytes, tuple[Any, ...], int]:
    """The record at ``offset`` that is not a span: its tag, its values and where the next one starts."""

    def take(fmt: struct.Struct, at: int) -> tuple[Any, ...]:
        if at + fmt.size > size:
            raise _TornError
        return fmt.unpack_from(data, at)

    def text(at: int, length: int) -> str:
        if at + length > size:
            raise _TornError
        return data[at : at + length].decode("utf-8", errors="replace")

    tag = data[offset : offset + 1]
    at = offset + 1
    if tag == b"N":
        name_id, kind, role_len = take(_NAME, at)
        at += _NAME.size
        role = text(at, role_len)
        (stage_len,) = take(_LEN, at + role_len)
        stage = text(at + role_len + _LEN.size, stage_len)
        if kind >= len(KINDS):
            raise TimelineError(f"{path}: unknown span kind {kind} at byte {offset}")
        return tag, (name_id, KINDS[kind], role, stage), at + role_len + _LEN.size + stage_len
    if tag == b"T":
        return tag, take(_THREAD, at), at + _THREAD.size
    if tag == b"C":
        offset_ns, uncertainty_ns, length = take(_CLOCK, at)
        return tag, (offset_ns, uncertainty_ns, text(at + _CLOCK.size, length)), at + _CLOCK.size + length
    if tag == b"X":
        ext, length = take(_EXT, at)
        at += _EXT.size
        if at + length > size:
            raise _TornError
        if ext != _EXT_REQUEST:
            return b"", (), at + length  # an extension of a later version: skipped
        if length < _REQUEST.size:
            need = _REQUEST.size
            raise TimelineError(f"{path}: a request record of {length} bytes at byte {offset} (at least {need})")
        return b"R", _REQUEST.unpack_from(data, at), at + length
    raise TimelineError(f"{path}: unknown record {tag!r} at byte {offset}: not written by this format")


# Offsets into a span record, tag first; they follow _SPAN ("<HHIqq"): name, step, start, duration, thread.
_FIELDS = ((1, 2, "H"), (5, 4, _U32), (9, 8, "q"), (17, 8, "q"), (3, 2, "H"))
_SHORT_RUN = 16


def _span_run(data: bytes, at: int, size: int) -> int:
    """How many whole span records follow one another from byte ``at`` (its tag is ``S``)."""
    whole = (size - at) // SPAN_BYTES
    tags = data[at : at + whole * SPAN_BYTES : SPAN_BYTES]
    return whole - len(tags.lstrip(b"S"))


def _columns(data: bytes, at: int, count: int) -> list[array[int]]:
    """The columns of ``count`` span records from byte ``at``: each field's bytes gathered by strided copies
    (no Python loop per record: the reader's cost is a few copies per run of records)."""
    if count <= _SHORT_RUN:  # a copy per field costs more than unpacking a few records
        records = [_SPAN.unpack_from(data, at + 1 + k * SPAN_BYTES) for k in range(count)]
        name, thread, step, start, duration = zip(*records, strict=True)
        fields = (name, step, start, duration, thread)
        return [array(code, values) for (_, _, code), values in zip(_FIELDS, fields, strict=True)]
    chunk = data[at : at + count * SPAN_BYTES]
    out = []
    for offset, width, code in _FIELDS:
        gathered = bytearray(count * width)
        for byte in range(width):
            gathered[byte::width] = chunk[offset + byte :: SPAN_BYTES]
        column = array(code)
        column.frombytes(gathered)
        if _SWAP:
            column.byteswap()
        out.append(column)
    return out


def _name_entries(ids: array[int], slot: dict[int, int], path: str) -> array[int]:
    """A run's name ids as entries of the name table (the same numbers unless an id was redefined)."""
    if all(slot.get(i) == i for i in set(ids)):
        return ids
    for i in ids:
        if i not in slot:
            raise TimelineError(f"{path}: a span refers to name {i}, never defined")
    entries = [slot[i] for i in ids]
    return array("H" if max(entries) <= 0xFFFF else _U32, entries)  # past 65,536 definitions: wider


def _joined(runs: list[array[int]], code: str) -> array[int]:
    """One column from its runs, allocated once at its size (appending run by run leaves up to 1/8 unused)."""
    if any(run.typecode != code for run in runs):  # a name column that grew past 65,536 entries
        code = _U32
        runs = [run if run.typecode == code else array(code, run) for run in runs]
    column = array(code)
    column.frombytes(b"".join(run.tobytes() for run in runs))
    return column


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a timeline file; a torn tail is read up to its last complete record (``torn`` is then true).

    Spans and requests are read as columns (:class:`SpanColumns`, :class:`RequestColumns`), never one object
    per record; an extension record of a kind this reader does not know is skipped.
    Raises :class:`TimelineError` for a file that is not a timeline or holds a record of no known kind,
    ``OSError`` when it cannot be read.
    """
    shown = os.fspath(path)
    with open(path, "rb") as handle:
        data = handle.read()
    header, offset = _header(data, shown)
    names: list[tuple[str, str, str]] = []  # the table the name column indexes
    slot: dict[int, int] = {}  # the file's name id -> its entry in names (the id itself, as the writer numbers)
    threads: dict[int, int] = {}
    runs: list[list[array[int]]] = [[] for _ in _FIELDS]  # each column's runs of records
    clocks: list[ClockEstimate] = []
    requests: list[array[int]] = [array("q") for _ in range(7)]  # stage, thread, step, start, duration, tokens
    torn = False
    size = len(data)
    try:
        while offset < size:
            if data[offset] == _S:
                count = _span_run(data, offset, size)
                if not count:
                    raise _TornError
                run = _columns(data, offset, count)
                run[0] = _name_entries(run[0], slot, shown)
                for column, part in zip(runs, run, strict=True):
                    column.append(part)
                offset += count * SPAN_BYTES
                continue
            tag, values, offset = _record(data, offset, size, shown)
            if tag == b"N":
                known = slot.get(values[0])
                if known is None or names[known] != values[1:]:
                    slot[values[0]] = len(names)
                    names.append(values[1:])
            elif tag == b"T":
                threads[values[0]] = values[1]
            elif tag == b"R":
                if values[0] != NO_STAGE and values[0] not in slot:
                    raise TimelineError(f"{shown}: a request refers to name {values[0]}, never defined")
                values = (slot.get(values[0], -1), *values[1:])
                for field_of, value in zip(requests, values, strict=True):
                    field_of.append(value)
            elif tag == b"C":
                clocks.append(ClockEstimate(*values))
    except _TornError:
        torn = True
    del data
    name, step, start, duration, thread = (_joined(r, code) for r, (_, _, code) in zip(runs, _FIELDS, strict=True))
    table = tuple(names)
    spans = SpanColumns(header["rank"], table, name, step, start, duration, thread)
    r_stage, r_thread, r_step, r_start, r_duration, r_prompt, r_output = requests
    read = RequestColumns(table, r_stage, r_step, r_start, r_duration, r_thread, r_prompt, r_output)
    return Timeline(path=shown, spans=spans, clocks=tuple(clocks), torn=torn, threads=threads, requests=read, **header)
