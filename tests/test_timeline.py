"""Tests for ``instrument.timeline``: the timeline file format, written and read back byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.timeline import (
    KINDS,
    MAGIC,
    SPAN_BYTES,
    TimelineError,
    encode_clock,
    encode_header,
    encode_name,
    encode_span,
    encode_thread,
    read_timeline,
)

HEADER = encode_header(role="actor", rank=3, world_size=8, host="node1", pid=42, mono_ns=1_000, wall_ns=2_000)

labels = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
spans = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        labels,
        labels,
        st.integers(0, 2**32 - 1),  # step
        st.integers(-(2**40), 2**40),  # start
        st.integers(0, 2**40),  # duration
        st.integers(0, 2**64 - 1),  # thread ident
    ),
    max_size=30,
)


def _file(records: list[tuple[str, str, str, int, int, int, int]], ends: list[int] | None = None) -> bytes:
    """Encode spans as the writer does: each name and thread defined before its first span.

    ``ends`` gets the offset where each record ends.
    """
    data = bytearray(HEADER)
    ends = [] if ends is None else ends
    names: dict[tuple[str, str, str], int] = {}
    threads: dict[int, int] = {}
    for kind, role, stage, step, start, duration, ident in records:
        if (kind, role, stage) not in names:
            names[kind, role, stage] = len(names)
            data += encode_name(names[kind, role, stage], kind, role, stage)
            ends.append(len(data))
        if ident not in threads:
            threads[ident] = len(threads)
            data += encode_thread(threads[ident], ident)
            ends.append(len(data))
        data += encode_span(names[kind, role, stage], threads[ident], step, start, start + duration)
        ends.append(len(data))
    return bytes(data)


@settings(max_examples=60, deadline=None)
@given(spans)
def test_spans_read_back_as_written(tmp_path_factory: pytest.TempPathFactory, records: list) -> None:  # type: ignore[type-arg]
    path = tmp_path_factory.mktemp("t") / "a.timeline.bin"
    path.write_bytes(_file(records))
    timeline = read_timeline(path)
    assert not timeline.torn
    who = (timeline.role, timeline.rank, timeline.world_size, timeline.host, timeline.pid)
    assert who == ("actor", 3, 8, "node1", 42)
    assert (timeline.mono_origin_ns, timeline.wall_origin_ns) == (1_000, 2_000)
    got = [
        (s.kind, s.role, s.stage, s.step, s.start_ns, s.duration_ns, timeline.threads[s.thread]) for s in timeline.spans
    ]
    assert got == records
    assert all(s.rank == 3 for s in timeline.spans)


@settings(max_examples=30, deadline=None)
@given(spans.filter(bool), st.data())
def test_a_torn_tail_is_read_up_to_the_last_complete_record(
    tmp_path_factory: pytest.TempPathFactory,
    records: list,  # type: ignore[type-arg]
    data: st.DataObject,
) -> None:
    ends: list[int] = []
    whole = _file(records, ends)
    cut = data.draw(st.integers(len(HEADER), len(whole) - 1))
    path = tmp_path_factory.mktemp("t") / "a.timeline.bin"
    path.write_bytes(whole[:cut])
    timeline = read_timeline(path)
    whole_path = path.with_name("whole.timeline.bin")
    whole_path.write_bytes(whole)
    complete = read_timeline(whole_path).spans
    assert timeline.spans == complete[: len(timeline.spans)]
    assert timeline.torn == (cut not in ends and cut != len(HEADER))


def test_a_span_is_at_most_32_bytes_on_disk() -> None:
    assert len(encode_span(65535, 65535, 2**32 - 1, -(2**62), 2**62 - 1)) == SPAN_BYTES <= 32


def test_clock_estimates_are_kept_and_the_tightest_is_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "c.timeline.bin"
    path.write_bytes(HEADER + encode_clock(-5_000, 900, "store round trip") + encode_clock(-4_800, 300, "barrier"))
    timeline = read_timeline(path)
    assert [c.offset_ns for c in timeline.clocks] == [-5_000, -4_800]
    assert timeline.clock is not None and timeline.clock.source == "barrier"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "not a timeline file"),
        (b'{"traceEvents": []}', "not a timeline file"),
        (MAGIC + b'{"role": "actor"', "header line is missing"),
        (MAGIC + b'{"role": "actor"}\n', "not a timeline header"),
        (HEADER + b"X123", "unknown record b'X' at byte"),
        (HEADER + encode_span(7, 0, 1, 0, 5), "never defined"),
    ],
)
def test_a_foreign_or_broken_file_is_named(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.timeline.bin"
    path.write_bytes(content)
    with pytest.raises(TimelineError, match=words) as caught:
        read_timeline(path)
    assert str(path) in str(caught.value)
