"""Every rank's timeline spans in one Chrome trace (:func:`write_merged_trace`), for Perfetto and ``chrome://tracing``.

One process per timeline file, named ``{role} rank {r}`` and numbered in (role, rank) order (``pid`` and
``sort_index`` alike, so both viewers list roles, then ranks); its first track, ``steps``, holds its step
spans and one track per thread of its stages and mini-batch windows. A thread whose spans overlap without
nesting (coroutines sharing it) gets more tracks, so that each track nests, as the viewers require. Times
are µs on the report's axis (``ts`` from the first span); the OS pid and host are in the process's labels.

Written gzip-compressed when the name ends in ``.gz``, else as plain JSON; whole, through a temporary file,
never through a symlink (:func:`~._destination.write_new_file`).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from instrument.analyze.model import Report, TimelineLane
from instrument.analyze.render._destination import write_new_file
from instrument.analyze.render._lanes import lane_labels

__all__ = ["write_merged_trace"]

_STEPS_TID = 0
_PIECE = 1 << 20  # characters joined before each compression call


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
    return json.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}, ensure_ascii=True)


def _tracks(lane: TimelineLane) -> tuple[list[int], list[str]]:
    """A tid per span (steps on tid 0) such that every tid's spans nest, and the name of each tid from 1 on."""
    tids = [_STEPS_TID] * len(lane)
    names: list[str] = []
    step = {i for i, (kind, _, _) in enumerate(lane.names) if kind == "step"}
    order = sorted(
        (i for i in range(len(lane)) if lane.name[i] not in step),
        key=lambda i: (lane.thread[i], lane.start_ns[i], -lane.end_ns[i]),
    )
    thread: int | None = None
    stacks: list[tuple[int, list[int]]] = []  # (tid, ends of its open spans) for the current thread
    for i in order:
        start, end = lane.start_ns[i], lane.end_ns[i]
        if lane.thread[i] != thread:
            thread, stacks = lane.thread[i], []
        for tid, stack in stacks:
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:  # nests in (or follows) what is open on this track
                stack.append(end)
                tids[i] = tid
                break
        else:
            names.append(f"thread {thread}" + (f" ({len(stacks) + 1})" if stacks else ""))
            stacks.append((len(names), [end]))
            tids[i] = len(names)
    return tids, names


def _events(report: Report) -> Iterator[str]:
    """The trace's events as JSON texts: each process's metadata, then its spans."""
    spans = report.timeline_spans
    assert spans is not None
    labels = lane_labels(spans.lanes)
    names: dict[str, str] = {}  # a span's name as JSON text, made once

    def text(value: str) -> str:
        held = names.get(value)
        if held is None:
            held = names[value] = json.dumps(value, ensure_ascii=True)
        return held

    for index, lane in enumerate(spans.lanes):  # lanes are in (role, rank, pid) order
        pid = index + 1
        yield _meta("process_name", pid, 0, {"name": labels[id(lane)]})
        yield _meta("process_sort_index", pid, 0, {"sort_index": index})
        yield _meta("process_labels", pid, 0, {"labels": f"host {lane.host}, pid {lane.pid}"})
        tids, threads = _tracks(lane)
        for tid, name in enumerate(["steps", *threads]):
            yield _meta("thread_name", pid, tid, {"name": name})
            yield _meta("thread_sort_index", pid, tid, {"sort_index": tid})
        for (kind, role, stage, step, start, end, _), tid in zip(lane.rows(), tids, strict=True):
            name = f"step {step}" if kind == "step" else stage if role == lane.role else f"{role}: {stage}"
            yield (
                f'{{"ph":"X","cat":"{kind}","name":{text(name)},"pid":{pid},"tid":{tid},'
                f'"ts":{start / 1000!r},"dur":{(end - start) / 1000!r},"args":{{"step":{step},"rank":{lane.rank},'
                f'"role":{text(role)}}}}}'
            )


def _document(report: Report) -> Iterator[str]:
    spans = report.timeline_spans
    assert spans is not None
    other = {
        "source": "instrument analyze --merged-trace",
        "directory": report.directory,
        "aligned": spans.aligned,
        "note": spans.note,
        "ts": "µs since the first span",
    }
    yield '{"displayTimeUnit":"ms","otherData":' + json.dumps(other, ensure_ascii=True) + ',"traceEvents":[\n'
    first = True
    for event in _events(report):
        yield event if first else ",\n" + event
        first = False
    yield "\n]}\n"


def merged_trace_bytes(report: Report, compress: bool = True) -> bytes:
    """The merged trace as bytes (gzip with ``compress``); raises ``ValueError`` when the report has no timeline."""
    if report.timeline_spans is None or not report.timeline_spans.lanes:
        raise ValueError(report.timeline_note or "no step timeline to merge")
    # Compressed a piece at a time: at 4,096 ranks the text is hundreds of MB, its gzip a tenth of that.
    packer = zlib.compressobj(6, zlib.DEFLATED, 31) if compress else None  # wbits 31: a gzip member
    out: list[bytes] = []
    held: list[str] = []
    size = 0
    for piece in _document(report):
        held.append(piece)
        size += len(piece)
        if size >= _PIECE:
            data = "".join(held).encode("ascii")
            out.append(packer.compress(data) if packer is not None else data)
            held, size = [], 0
    data = "".join(held).encode("ascii")
    out.append(packer.compress(data) + packer.flush() if packer is not None else data)
    return b"".join(out)


def write_merged_trace(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write every rank's timeline spans as one Chrome trace at ``path`` (gzip when it ends in ``.gz``);
    ``ValueError`` when the report has no step timeline."""
    return write_new_file(path, merged_trace_bytes(report, compress=str(path).endswith(".gz")))
