"""The standard-library event reader (``instrument.analyze.traces._stream``) and its fallback to ijson."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from instrument.analyze import TraceFile
from instrument.analyze.traces import _reader, _stream


def _trace(events: int = 40) -> dict[str, Any]:
    evs: list[Any] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    for i in range(events):
        evs.append(
            {
                "ph": "X",
                "cat": "cpu_op" if i % 3 else "user_annotation",
                "name": f"aten::op{i % 5}" if i % 3 else "generate_sequences",
                "pid": 1,
                "tid": 2,
                "ts": 1_000_000_000_000 + 10 * i + 0.125,
                "dur": 7 + i,
                "args": {"Input Dims": [[8, 64], [64]], "Concrete Inputs": ["", 'é \\" ] } ,'], "n": -1.5e-3},
            }
        )
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0, "world_size": 2},
        "traceEvents": evs,
        "traceName": "x",
        "displayTimeUnit": "ms",
    }


def _read(text: bytes, piece: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(_stream, "PIECE", piece)
    return list(_stream.events(io.BytesIO(text)))


@pytest.mark.parametrize("piece", [1, 3, 7, 64, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_same_events_as_json_wherever_the_pieces_are_cut(
    monkeypatch: pytest.MonkeyPatch, piece: int, indent: int | None
) -> None:
    # pieces cut inside numbers, strings, escapes and two-byte UTF-8 characters
    data = _trace()
    text = json.dumps(data, indent=indent, ensure_ascii=False).encode()
    assert _read(text, piece, monkeypatch) == data["traceEvents"]


def test_empty_event_array_and_members_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _read(b' { "a" : [1, {"b": 2}] , "traceEvents" : [ ] , "z": null } \n', 2, monkeypatch) == []
    assert _read(b'{"traceEvents":[1,2.5,"x",{}]}', 1, monkeypatch) == [1, 2.5, "x", {}]


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": [{"ts": NaN}]}',  # not JSON; ijson refuses it
        b'{"traceEvents": [{"ts": 1}], "traceEvents": [{"ts": 2}]}',  # ijson reads both arrays
        b'{"traceEvents": [{"ts": 1}]} x',  # text after the object
        b'{"traceEvents": [{"ts": 1}',  # cut off
        b'{"traceEvents": [{"ts": 1},]}',  # a trailing comma
        b'{"traceEvents": [{"name": "\xff"}]}',  # not UTF-8
        b'{"other": []}',
        b"",
        b'{"traceEvents": [{"ts": 1} {"ts": 2}]}',
        b'{"traceEvents" [1]}',
    ],
)
def test_what_it_does_not_follow_is_left_to_ijson(monkeypatch: pytest.MonkeyPatch, text: bytes) -> None:
    with pytest.raises(_stream.UnfollowedError):
        _read(text, 4, monkeypatch)


def test_a_value_larger_than_it_holds_is_left_to_ijson(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stream, "MAX_PENDING", 100)
    text = b'{"traceEvents": [{"name": "' + b"a" * 1000 + b'"}]}'
    with pytest.raises(_stream.UnfollowedError):
        _read(text, 16, monkeypatch)


def test_nesting_deeper_than_the_scanner_goes_is_left_to_ijson(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    text = b'{"traceEvents": [{"args": ' + b"[" * 400 + b"]" * 400 + b"}]}"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # the C scanner's depth follows the recursion limit
    try:
        with pytest.raises(_stream.UnfollowedError):
            _read(text, 1 << 20, monkeypatch)
    finally:
        sys.setrecursionlimit(limit)


def _file(tmp_path: Path, text: bytes, name: str = "rank0.pt.trace.json") -> TraceFile:
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return TraceFile(str(path), "unknown", "trace", 0, None, None, source="trace", inside=True)


def _ijson_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def unfollowed(stream: Any) -> Any:
        raise _stream.UnfollowedError("forced")
        yield  # pragma: no cover - a generator, as the real one

    monkeypatch.setattr(_stream, "events", unfollowed)


@pytest.mark.parametrize("name", ["rank0.pt.trace.json", "rank0.pt.trace.json.gz"])
def test_scan_file_gives_what_the_ijson_path_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(_reader, "SMALL_FILE_BYTES", 0)  # streamed, not decoded whole
    monkeypatch.setattr(_stream, "PIECE", 5)
    trace = _file(tmp_path, json.dumps(_trace(200), indent=1).encode(), name)
    fast = _reader.scan_file(trace)
    _ijson_only(monkeypatch)
    slow = _reader.scan_file(trace)
    assert fast.segments == slow.segments and fast.events == slow.events == 200 and fast.gpu == slow.gpu


def test_twice_traceevents_read_as_ijson_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reader, "SMALL_FILE_BYTES", 0)
    one = '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
    trace = _file(tmp_path, f'{{"traceEvents": [{one}], "traceEvents": [{one}, {one}]}}'.encode())
    assert _reader.scan_file(trace).events == 3  # the fallback, as before: every item of both arrays


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b'{"traceEvents": [{"ph": "X", "ts": NaN, "dur": 1}]}', "not JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}', "not JSON"),
    ],
)
def test_a_damaged_file_is_still_named_by_the_ijson_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, reason: str
) -> None:
    monkeypatch.setattr(_reader, "SMALL_FILE_BYTES", 0)
    trace = _file(tmp_path, text)
    with pytest.raises(_reader.TraceError) as fast:
        _reader.scan_file(trace)
    _ijson_only(monkeypatch)
    with pytest.raises(_reader.TraceError) as slow:
        _reader.scan_file(trace)
    assert str(fast.value) == str(slow.value) and reason in str(fast.value)
