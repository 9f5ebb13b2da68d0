"""What an export layout reads (:mod:`instrument.analyze._layout` writes): the traces of a run the filters keep,
each with its rank (from its header where neither a manifest nor its name gives one), and a trace's bytes as
they are, or decoded with the rank HTA reads set to the one it has here.

HTA maps a file to the first ``"rank": N`` in it, line by line, and a vLLM engine trace numbers ranks inside its
engine: such a file is exported as a copy whose first rank is its global one (:func:`text_with_rank`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from instrument.analyze.model import Filters, Skipped, TraceFile
from instrument.analyze.traces import _safe_io
from instrument.analyze.traces._discover import ALL_RUNS, Run, discover, find_runs, select_run
from instrument.analyze.traces._reader import TraceError, read_header, with_rank_from_header
from instrument.analyze.traces._selection import Selection

__all__ = ["hta_rank", "is_gzip", "raw_chunks", "ranked_traces", "text_with_rank"]

_HTA_RANK = re.compile(rb'"rank":\s+(\d+)')  # what HTA's rank-to-file map searches for, first match wins
_TRACE_EVENTS = b'"traceEvents"'
_HEAD_BYTES = 1 << 20  # the header (distributedInfo …) comes before traceEvents, well within this
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def ranked_traces(
    directory: str | os.PathLike[str], filters: Filters, run: str | Run | None
) -> tuple[list[TraceFile], list[Skipped]]:
    """The traces of ``run`` (the newest by default, ``"all"``, an id) that ``filters`` keep, each with a rank or
    a replica, by path; and the files left out, with why.

    They are exactly the files the analysis with the same filters reads: a file whose steps or stages lie inside
    it (a continuous trace, a plain torch trace) stays whatever the steps and stages asked, as the analysis
    reads it and keeps those."""
    picked = (
        run if isinstance(run, Run) else None if run == ALL_RUNS else select_run(find_runs(directory), run, directory)
    )
    found, skipped = discover(directory)
    kept: list[TraceFile] = []
    for trace in found:
        if not Selection(picked).keeps(trace.path):  # one run's files never collide
            continue
        if trace.rank is None and trace.source == "trace":
            try:
                completed = with_rank_from_header(trace, read_header(trace.path))
            except TraceError as exc:
                skipped.append(Skipped(trace.path, str(exc)))
                continue
            if completed is None:
                skipped.append(Skipped(trace.path, "no rank: neither a manifest, the file name nor distributedInfo"))
                continue
            trace = completed  # noqa: PLW2901
        elif trace.rank is None and trace.replica is None:
            skipped.append(Skipped(trace.path, "no rank: relocated as rank-unknown"))
            continue
        if filters.keeps(trace):
            kept.append(trace)
    return kept, skipped


def is_gzip(path: str) -> bool:
    """Whether ``path`` is gzip-compressed (by its first bytes, not its name)."""
    with _safe_io.open_regular(path) as raw:
        return raw.read(2) == _GZIP_MAGIC


def hta_rank(path: str) -> int | None:
    """The rank HTA reads from ``path``: the first ``"rank": N`` before ``traceEvents`` (in its first MiB)."""
    with _safe_io.open_json(path) as stream:
        head = stream.read(_HEAD_BYTES)
    end = head.find(_TRACE_EVENTS)
    match = _HTA_RANK.search(head if end < 0 else head[:end])
    return None if match is None else int(match[1])


def _with_rank(region: bytes, rank: int) -> bytes:
    """``region`` (a trace's text before ``traceEvents``) with the first rank HTA reads set to ``rank``."""
    match = _HTA_RANK.search(region)
    if match is not None:
        return region[: match.start(1)] + str(rank).encode() + region[match.end(1) :]
    brace = region.find(b"{")
    if brace < 0 or region[:brace].strip():
        # the array form has no header to hold distributedInfo
        raise TraceError("no rank HTA can read: a trace in the array form has no distributedInfo")
    # A line of its own ahead of everything: HTA reads the first match line by line
    line = b'\n"distributedInfo": {"rank": %d},\n' % rank
    return region[: brace + 1] + line + region[brace + 1 :]


def text_with_rank(path: str, rank: int) -> Iterator[bytes]:
    """``path``'s decoded text in chunks, the first rank HTA reads set to ``rank``; :class:`TraceError` (before
    the first chunk) for a trace that cannot hold one."""
    with _safe_io.open_json(path) as stream:
        head = stream.read(_HEAD_BYTES)
        end = head.find(_TRACE_EVENTS)
        cut = len(head) if end < 0 else end
        yield _with_rank(head[:cut], rank)
        yield head[cut:]
        while chunk := stream.read(_CHUNK):
            yield chunk


def raw_chunks(path: str) -> Iterator[bytes]:
    """``path``'s bytes as they are, in chunks (a regular file only, as every trace is opened)."""
    with _safe_io.open_regular(path) as raw:
        while chunk := raw.read(_CHUNK):
            yield chunk
