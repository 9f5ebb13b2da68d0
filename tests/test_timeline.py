"""Tests for ``instrument.timeline``: the timeline file format, written and read back byte for byte."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.timeline import (
    KINDS,
    MAGIC,
    NO_STAGE,
    REQUEST_BYTES,
    SPAN_BYTES,
    Span,
    SpanColumns,
    SpanTable,
    Timeline,
    TimelineError,
    encode_clock,
    encode_extension,
    encode_header,
    encode_name,
    encode_request,
    encode_span,
    encode_thread,
    read_timeline,
)

HEADER = encode_header(role="actor", rank=3, world_size=8, host="node1", pid=42, mono_ns=1_000, wall_ns=2_000)

labels = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
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
        (HEADER + b"Z123", "unknown record b'Z' at byte"),
        (HEADER + encode_span(7, 0, 1, 0, 5), "never defined"),
    ],
)
def test_a_foreign_or_broken_file_is_named(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.timeline.bin"
    path.write_bytes(content)
    with pytest.raises(TimelineError, match=words) as caught:
        read_timeline(path)
    assert str(path) in str(caught.value)


# --------------------------------------------------------------------------- spans as columns

span_values = st.builds(
    Span,
    st.sampled_from([*KINDS, "mystery"]),
    st.sampled_from(["actor", "rollout"]),
    st.sampled_from(["", "generate", "update_actor"]),
    st.integers(0, 2**32 - 1),
    st.integers(0, 3),  # rank
    st.integers(-(2**40), 2**40),
    st.integers(-(2**40), 2**40),
    st.integers(0, 3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(span_values, max_size=30), st.lists(st.integers(-(2**40), 2**40), min_size=4, max_size=4))
def test_a_span_table_gives_back_its_spans_shifted_in_order(values: list[Span], shifts: list[int]) -> None:
    table = SpanTable.of(values)
    assert len(table) == len(values)
    for rank in range(4):  # one part per rank, a rank's spans in their order
        assert [s for s in table if s.rank == rank] == [s for s in values if s.rank == rank]
    assert sorted(table) == sorted(values) and tuple(table) == table[:] and table == list(table)
    moved = SpanTable((columns, shifts[columns.rank]) for columns, _ in table.parts)
    expected = [replace(s, start_ns=s.start_ns - shifts[s.rank], end_ns=s.end_ns - shifts[s.rank]) for s in table]
    assert list(moved) == expected
    assert [moved[i] for i in range(-len(moved), len(moved))] == expected + expected
    with pytest.raises(IndexError):
        moved[len(moved)]


def test_span_columns_hold_one_rank_and_take_any_int() -> None:
    huge = Span("stage", "actor", "x", 2**70, 5, -(2**80), 2**80)  # not a machine word: kept in lists
    columns = SpanColumns.of([huge, Span("step", "actor", "", 1, 5, 0, 9)])
    assert list(columns) == [huge, Span("step", "actor", "", 1, 5, 0, 9)] and columns.rank == 5
    with pytest.raises(ValueError, match="one rank"):
        SpanColumns.of([huge, replace(huge, rank=6)])
    assert SpanColumns.of([]).rank == 0 and list(SpanColumns.of([])) == []


def test_a_timeline_given_span_values_holds_them_as_columns(tmp_path: Path) -> None:
    spans = (Span("step", "actor", "", 1, 3, 10, 20), Span("stage", "actor", "update", 1, 3, 11, 19, 1))
    made = Timeline(path="p", role="actor", rank=3, world_size=8, host="h", pid=1, mono_origin_ns=0,
                    wall_origin_ns=0, spans=spans)  # fmt: skip
    assert isinstance(made.spans, SpanColumns) and made.spans == spans


def test_a_redefined_or_sparse_name_id_names_the_spans_after_it(tmp_path: Path) -> None:
    path = tmp_path / "r.timeline.bin"
    data = HEADER + encode_name(7, "stage", "actor", "a") + encode_thread(0, 99)
    data += encode_span(7, 0, 1, 0, 5) + encode_span(7, 0, 1, 5, 6)
    data += encode_name(7, "stage", "actor", "b") + encode_span(7, 0, 2, 6, 9)
    path.write_bytes(data)
    timeline = read_timeline(path)
    assert [(s.stage, s.step, s.start_ns, s.end_ns) for s in timeline.spans] == [
        ("a", 1, 0, 5),
        ("a", 1, 5, 6),
        ("b", 2, 6, 9),
    ]
    assert isinstance(timeline.spans, SpanColumns) and not timeline.torn


def test_thousands_of_spans_are_read_in_runs(tmp_path: Path) -> None:
    records = [("stage", "actor", f"s{i % 3}", i // 7, 1000 * i, i % 50, 1 + i % 2) for i in range(5000)]
    path = tmp_path / "many.timeline.bin"
    whole = _file(records)
    path.write_bytes(whole[:-3])  # the last span torn
    timeline = read_timeline(path)
    got = [
        (s.kind, s.role, s.stage, s.step, s.start_ns, s.duration_ns, timeline.threads[s.thread]) for s in timeline.spans
    ]
    assert got == records[:-1] and timeline.torn


@settings(max_examples=60, deadline=None)
@given(
    st.lists(span_values.map(lambda s: replace(s, step=s.step % 4)), max_size=30),
    st.none() | st.sets(st.integers(0, 3)),
    st.none() | st.sets(st.integers(0, 3)),
    st.none() | st.sets(st.sampled_from(["", "generate", "update_actor"])),
)
def test_a_table_keeps_the_spans_asked_for_part_by_part(
    values: list[Span], ranks: set[int] | None, steps: set[int] | None, stages: set[str] | None
) -> None:
    table = SpanTable((columns, columns.rank * 10) for columns, _ in SpanTable.of(values).parts)

    def named(kind: str, role: str, stage: str) -> bool:
        return stages is None or kind == "step" or stage in stages

    kept = table.where(ranks=ranks, steps=steps, names=None if stages is None else named)
    assert list(kept) == [
        s
        for s in table
        if (ranks is None or s.rank in ranks) and (steps is None or s.step in steps) and named(s.kind, s.role, s.stage)
    ]
    assert [columns.rank for columns, _ in kept.parts] == [columns.rank for columns, _ in table.parts]
    assert [shift for _, shift in kept.parts] == [shift for _, shift in table.parts]
    assert table.steps("step") == {s.step for s in values if s.kind == "step"}
    assert table.steps() == {s.step for s in values}
    whole = table.where()
    assert all(a is b for (a, _), (b, _) in zip(whole.parts, table.parts, strict=True))  # nothing copied


@pytest.mark.slow
def test_more_names_than_an_id_holds_are_each_read(tmp_path: Path) -> None:
    count = 0x10000 + 5  # redefinitions of one id: more entries than 16 bits number
    data = bytearray(HEADER + encode_thread(0, 1))
    for i in range(count):
        data += encode_name(0, "stage", "actor", f"s{i}") + encode_span(0, 0, 1, i, i + 1)
    path = tmp_path / "names.timeline.bin"
    path.write_bytes(bytes(data))
    spans = read_timeline(path).spans
    assert len(spans) == count and [spans[i].stage for i in (0, 1, -1)] == ["s0", "s1", f"s{count - 1}"]
    assert [s.stage for s in spans] == [f"s{i}" for i in range(count)]


# ---------------------------------------------------------------------- requests (extension records)

counts = st.one_of(st.just(-1), st.integers(0, 10**15))
records_with_requests = st.lists(
    st.one_of(
        st.tuples(st.just("span"), st.sampled_from(KINDS), labels, labels, st.integers(0, 2**32 - 1),
                  st.integers(-(2**40), 2**40), st.integers(0, 2**40), st.integers(0, 2**64 - 1)),
        st.tuples(st.just("request"), st.one_of(st.none(), labels), st.integers(0, 2**32 - 1),
                  st.integers(-(2**40), 2**40), st.integers(0, 2**40), st.integers(0, 2**64 - 1), counts, counts),
        st.tuples(st.just("unknown"), st.integers(2, 255), st.binary(max_size=40)),
    ),
    max_size=30,
)  # fmt: skip


def _mixed_file(records: list[tuple[Any, ...]], ends: list[int], kept: list[int] | None = None) -> bytes:
    """Spans, requests and extensions of later versions, encoded as the writer does; ``ends``: where each record
    ends; ``kept``: where each span or request record ends."""
    data = bytearray(HEADER)
    names: dict[tuple[str, str, str], int] = {}
    threads: dict[int, int] = {}

    def name(key: tuple[str, str, str]) -> int:
        if key not in names:
            names[key] = len(names)
            data.extend(encode_name(names[key], *key))
            ends.append(len(data))
        return names[key]

    def thread(ident: int) -> int:
        if ident not in threads:
            threads[ident] = len(threads)
            data.extend(encode_thread(threads[ident], ident))
            ends.append(len(data))
        return threads[ident]

    for record in records:
        if record[0] == "span":
            _, kind, role, stage, step, start, duration, ident = record
            data += encode_span(name((kind, role, stage)), thread(ident), step, start, start + duration)
        elif record[0] == "request":
            _, stage, step, start, duration, ident, prompt, output = record
            stage_id = NO_STAGE if stage is None else name(("stage", "rollout", stage))
            data += encode_request(stage_id, thread(ident), step, start, start + duration, prompt, output)
        else:
            data += encode_extension(record[1], record[2])
        ends.append(len(data))
        if kept is not None and record[0] != "unknown":
            kept.append(len(data))
    return bytes(data)


def _requests_of(records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(r[1], r[2], r[3], r[3] + r[4], r[5], r[6], r[7]) for r in records if r[0] == "request"]


def _read_requests(timeline: Timeline) -> list[tuple[Any, ...]]:
    return [(s, step, a, b, timeline.threads[t], p, o) for s, step, a, b, t, p, o in timeline.requests.rows()]


@settings(max_examples=60, deadline=None)
@given(records_with_requests)
def test_requests_and_spans_read_back_as_written_and_unknown_extensions_are_skipped(
    tmp_path_factory: pytest.TempPathFactory, records: list[tuple[Any, ...]]
) -> None:
    path = tmp_path_factory.mktemp("t") / "r.timeline.bin"
    path.write_bytes(_mixed_file(records, []))
    timeline = read_timeline(path)
    assert not timeline.torn
    assert _read_requests(timeline) == _requests_of(records)
    spans_written = [(r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in records if r[0] == "span"]
    got = [
        (s.kind, s.role, s.stage, s.step, s.start_ns, s.duration_ns, timeline.threads[s.thread]) for s in timeline.spans
    ]
    assert got == spans_written


@settings(max_examples=40, deadline=None)
@given(records_with_requests.filter(bool), st.data())
def test_a_torn_tail_after_requests_keeps_every_complete_record(
    tmp_path_factory: pytest.TempPathFactory, records: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    ends: list[int] = []
    kept: list[int] = []
    whole = _mixed_file(records, ends, kept)
    cut = data.draw(st.integers(len(HEADER), len(whole) - 1))
    folder = tmp_path_factory.mktemp("t")
    (folder / "cut.timeline.bin").write_bytes(whole[:cut])
    (folder / "whole.timeline.bin").write_bytes(whole)
    torn, complete = read_timeline(folder / "cut.timeline.bin"), read_timeline(folder / "whole.timeline.bin")
    requests = _read_requests(torn)
    assert requests == _read_requests(complete)[: len(requests)]
    assert torn.spans == complete.spans[: len(torn.spans)]
    assert len(requests) + len(torn.spans) == sum(1 for end in kept if end <= cut)  # every whole record is read
    assert torn.torn == (cut not in ends and cut != len(HEADER))


def test_a_request_is_46_bytes_on_disk_and_a_longer_payload_keeps_its_known_fields(tmp_path: Path) -> None:
    record = encode_request(NO_STAGE, 0, 7, 100, 250, 12, 34)
    assert len(record) == REQUEST_BYTES == 46
    later = encode_extension(1, record[6:] + b"a field of a later version")  # ext 1, payload grown
    path = tmp_path / "r.timeline.bin"
    path.write_bytes(HEADER + encode_thread(0, 99) + later)
    assert list(read_timeline(path).requests.rows()) == [(None, 7, 100, 250, 0, 12, 34)]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (encode_extension(1, b"short"), "a request record of 5 bytes"),
        (encode_request(3, 0, 1, 0, 5, 1, 1), "a request refers to name 3, never defined"),
    ],
)
def test_a_broken_request_is_named(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.timeline.bin"
    path.write_bytes(HEADER + content)
    with pytest.raises(TimelineError, match=words):
        read_timeline(path)
