"""``instrument analyze`` on hostile directories: every bad entry is named and skipped, the rest analysed.

Each case builds the directory from real files, FIFOs and symlinks next to real SDK traces, then runs
the real command (in-process through ``instrument.cli.main``, and as a subprocess where a regression
would hang or eat the machine: those run with a timeout that only guards against the hang and, for
the bombs, under ``RLIMIT_AS`` so a regression fails fast instead of being OOM-killed).
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import cli, naming
from instrument.analyze import Report, analyze
from instrument.analyze.traces import _reader as reader
from instrument.analyze.traces import _safe_io as safe_io
from instrument.analyze.traces._discover import discover
from instrument.analyze.traces._steps import Ranges
from instrument.manifest import MAX_LINE_BYTES, read_manifests
from tests.analyze.test_analyze import _run_ranks

WORLD = 2
GOOD = WORLD * 3  # one step, three stages per rank


def _traces(records: list[Any]) -> list[Any]:
    """The trace records (the run's step timeline files are listed in the manifest too)."""
    return [r for r in records if not r.path.endswith(naming.TIMELINE_SUFFIX)]


HANG_GUARD_S = 120  # only stops a hung run; no assertion is about time
ADDRESS_SPACE = 1536 << 20  # RLIMIT_AS for the bomb runs: far below what the unbounded reader reached (24 GB)
EXIT_SKIPPED = 1
TRACE = "actor_update-actor_step1_rank{rank}-of-9_h_pid1_1.pt.trace.json.gz"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real SDK traces and their manifest: two ranks, one step."""
    path = tmp_path_factory.mktemp("hostile") / "good"
    _run_ranks(path, world=WORLD, steps=1)
    return path


@pytest.fixture
def save(good: Path, tmp_path: Path) -> Path:
    """A fresh copy of the good traces, to be made hostile."""
    copy = tmp_path / "profile"
    shutil.copytree(good, copy)
    return copy


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _run(
    save: Path, *, env: dict[str, str] | None = None, limit_memory: bool = False
) -> subprocess.CompletedProcess[str]:
    """``instrument analyze SAVE --json --no-png`` in a fresh process (under RLIMIT_AS when asked)."""
    argv = ["analyze", str(save), "--json", "--no-png", "--jobs", "1"]
    code = (
        "import resource, sys\n"
        f"if {limit_memory!r}: resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))\n"
        "from instrument.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _skips(err: str) -> dict[str, str]:
    """``{file name: reason}`` from the stderr lines; every line must be one of ours."""
    out: dict[str, str] = {}
    for line in err.strip().splitlines():
        assert line.startswith("instrument analyze: skipped "), err
        path, _, reason = line.removeprefix("instrument analyze: skipped ").partition(": ")
        out[Path(path).name] = reason
    return out


def _reasons(report: Report) -> dict[str, str]:
    return {Path(s.path).name: s.reason for s in report.skipped}


def _assert_good_analysed(data: dict[str, Any]) -> None:
    assert data["files"] == GOOD
    assert data["ranks"] == list(range(WORLD))
    assert {s["stage"] for s in data["stages"]} == {"compute_log_prob", "generate_sequences", "update_actor"}


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Error" not in result.stderr.replace("error:", ""), result.stderr


@contextlib.contextmanager
def _unblocked(*fifos: Path) -> Iterator[None]:
    """Hang guard for in-process reads: a regression that opens a FIFO blocks in ``open``; this opens
    the other end after a while, so the test fails on its assertion instead of hanging forever."""
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(HANG_GUARD_S / 4):
            for fifo in fifos:
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# --------------------------------------------------------------------------- symlinks (Z8)


def test_dangling_symlinks_and_loops_are_named_and_skipped(save: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (save / "dangling.pt.trace.json.gz").symlink_to(save / "missing.pt.trace.json.gz")
    (save / "loop-a.pt.trace.json").symlink_to(save / "loop-b.pt.trace.json")
    (save / "loop-b.pt.trace.json").symlink_to(save / "loop-a.pt.trace.json")
    (save / "self.json").symlink_to("self.json")
    (save / "instrument-manifest-x-pid2.jsonl").symlink_to(save / "nowhere.jsonl")
    (save / "notes.txt").symlink_to(save / "nowhere.txt")  # not a trace name: not ours, not mentioned

    rc, out, err = _cli([str(save), "--json", "--no-png"], capsys)
    assert rc == EXIT_SKIPPED
    skips = _skips(err)
    assert set(skips) == {
        "dangling.pt.trace.json.gz",
        "loop-a.pt.trace.json",
        "loop-b.pt.trace.json",
        "self.json",
        "instrument-manifest-x-pid2.jsonl",
    }
    assert "dangling symlink" in skips["dangling.pt.trace.json.gz"]
    assert "dangling symlink" in skips["instrument-manifest-x-pid2.jsonl"]
    assert all("symlink loop" in skips[n] for n in ("loop-a.pt.trace.json", "loop-b.pt.trace.json", "self.json"))
    _assert_good_analysed(json.loads(out))

    report = analyze(save, jobs=1)
    assert _reasons(report) == skips
    assert report.files == GOOD


def test_a_symlink_to_a_regular_trace_is_read(good: Path, save: Path, tmp_path: Path) -> None:
    """Following a link to read is harmless and lets users gather traces from several runs in one folder."""
    rank0 = next(save.glob("actor_compute-log-prob_step1_rank0-*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / rank0.name.replace("step1", "step2")
    rank0.rename(moved)
    (save / moved.name).symlink_to(moved)
    report = analyze(save, jobs=1)
    assert [Path(s.path).name for s in report.skipped] == [rank0.name]  # still in the manifest, gone from DIR
    assert report.files == GOOD
    assert 2 in report.steps


# --------------------------------------------------------------------------- FIFOs (Z9)


def test_fifos_named_like_a_manifest_or_a_trace_never_block(save: Path) -> None:
    os.mkfifo(save / "instrument-manifest-x-pid1.jsonl")
    os.mkfifo(save / TRACE.format(rank=7))
    os.mkfifo(save / "plain.json")  # no rank in its name: the header would be read
    result = _run(save)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    skips = _skips(result.stderr)
    assert set(skips) == {"instrument-manifest-x-pid1.jsonl", TRACE.format(rank=7), "plain.json"}
    assert all("not a regular file" in r and "FIFO" in r for r in skips.values()), skips
    _assert_good_analysed(json.loads(result.stdout))

    with _unblocked(*save.iterdir()):
        report = analyze(save, jobs=1)
    assert _reasons(report) == skips


def test_a_trace_swapped_for_a_fifo_after_listing_does_not_block(save: Path) -> None:
    found, skipped = discover(save)
    assert not skipped
    victim = found[0]
    Path(victim.path).unlink()
    os.mkfifo(victim.path)
    with _unblocked(Path(victim.path)):
        with pytest.raises(reader.TraceError, match="not a regular file"):
            reader.scan_file(victim)
        with pytest.raises(reader.TraceError, match="not a regular file"):
            reader.read_header(victim.path)
        with pytest.raises(safe_io.NotRegularFileError, match="FIFO"):
            safe_io.open_regular(victim.path)


# --------------------------------------------------------------------------- manifest lines (Z10)


def _records(save: Path) -> list[dict[str, Any]]:
    """The trace records of every manifest (the step timeline's lines left out: they list no trace)."""
    lines = []
    for manifest in sorted(save.glob("instrument-manifest-*.jsonl")):
        lines += [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if not line["path"].endswith(naming.TIMELINE_SUFFIX)]


def test_bad_manifest_lines_are_named_and_the_rest_is_analysed(save: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _records(save)[0]
    bad = [
        {**good, "rank": "0"},
        {**good, "path": None},
        {k: v for k, v in good.items() if k != "step"},
        {**good, "window": [1]},
        {**good, "step": True},
        {**good, "role": "\ud800"},  # a lone surrogate: no text can print it
        [1, 2],
    ]
    lines = [json.dumps(b) for b in bad] + ["not json {", "", json.dumps({**good, "future_field": 1})]
    manifest = save / "instrument-manifest-evil-pid1.jsonl"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")

    rc, out, err = _cli([str(save), "--json", "--no-png"], capsys)
    assert rc == EXIT_SKIPPED
    lines_named = [line for line in err.splitlines() if manifest.name in line]
    assert len(lines_named) == len(bad) + 1, err  # the empty line is no record; the unknown field is ignored
    assert """line 1: 'rank' must be an int (got "0")""" in err
    assert "line 2: 'path' must be a string (got null)" in err
    assert "line 3: 'step' is missing" in err
    assert "line 4: 'window'" in err
    assert "line 5: 'step' must be an int (got true)" in err
    assert "line 6: 'role'" in err
    assert "line 7: not a JSON object" in err
    assert "line 8: not JSON" in err
    _assert_good_analysed(json.loads(out))

    report = analyze(save, jobs=1)
    assert len(report.skipped) == len(bad) + 1
    assert report.files == GOOD


def test_read_manifests_reports_bad_lines_to_a_callback_and_keeps_old_callers_working(save: Path) -> None:
    manifest = save / "instrument-manifest-evil-pid1.jsonl"
    manifest.write_text('{"path": null}\n', encoding="utf-8")
    os.mkfifo(save / "instrument-manifest-fifo-pid1.jsonl")
    (save / "instrument-manifest-dir-pid1.jsonl").mkdir()
    with _unblocked(*save.glob("instrument-manifest-*")):
        quiet = list(read_manifests(save))
        told: list[tuple[str, str]] = []
        loud = list(read_manifests(save, on_skip=lambda path, reason: told.append((Path(path).name, reason))))
    assert quiet == loud and len(_traces(quiet)) == GOOD
    assert sorted(name for name, _ in told) == [
        "instrument-manifest-dir-pid1.jsonl",
        "instrument-manifest-evil-pid1.jsonl",
        "instrument-manifest-fifo-pid1.jsonl",
    ]


def test_a_very_long_manifest_line_is_skipped_without_reading_it_whole(save: Path) -> None:
    manifest = save / "instrument-manifest-long-pid1.jsonl"
    good = json.dumps(_records(save)[0])
    manifest.write_text('{"path": "' + "x" * (MAX_LINE_BYTES + 10) + '"}\n' + good + "\n", encoding="utf-8")
    told: list[str] = []
    records = list(read_manifests(save, on_skip=lambda _path, reason: told.append(reason)))
    assert len(_traces(records)) == GOOD + 1  # the good line after the long one is still read
    assert len(told) == 1 and "longer than" in told[0]


# --------------------------------------------------------------------------- directories (Z12)


def test_directories_named_like_a_manifest_or_a_trace_are_named_and_skipped(
    save: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (save / "instrument-manifest-x-pid3.jsonl").mkdir()
    (save / TRACE.format(rank=8)).mkdir()
    (save / "dir-link.json").symlink_to(save / TRACE.format(rank=8))
    rc, out, err = _cli([str(save), "--json", "--no-png"], capsys)
    assert rc == EXIT_SKIPPED
    skips = _skips(err)
    assert set(skips) == {"instrument-manifest-x-pid3.jsonl", TRACE.format(rank=8), "dir-link.json"}
    assert all("a directory" in r for r in skips.values()), skips
    _assert_good_analysed(json.loads(out))
    assert _reasons(analyze(save, jobs=1)) == skips


# --------------------------------------------------------------------------- bombs (Z13)


def _gzip_stream(parts: Iterator[bytes], *, isize: int | None = None) -> bytes:
    """A gzip member made chunk by chunk (a bomb never exists uncompressed); ``isize`` forges the trailer."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = b"".join(packer.compress(part) for part in parts) + packer.flush()
    if isize is not None:
        body = body[:-4] + (isize & 0xFFFFFFFF).to_bytes(4, "little")
    return body


def _repeat(head: bytes, filler: bytes, count: int, tail: bytes = b"") -> Iterator[bytes]:
    """``head``, ``filler`` ``count`` times, ``tail``: in pieces of about 1 MiB."""
    yield head
    per_block = max(1, (1 << 20) // len(filler))
    blocks, rest = divmod(count, per_block)
    block = filler * per_block
    for _ in range(blocks):
        yield block
    yield filler * rest + tail


def test_deeply_nested_json_is_skipped_naming_the_limit(save: Path) -> None:
    deep = 1_000_000
    bombs = {
        TRACE.format(rank=2): _gzip_stream(_repeat(b'{"traceEvents":[', b"[", deep)),  # events: the streaming reader
        TRACE.format(rank=3): _gzip_stream(_repeat(b"", b"[", deep)),  # a top-level array
        "nested-header.json.gz": _gzip_stream(_repeat(b'{"distributedInfo":{"rank":', b"[", deep)),  # the header
        TRACE.format(rank=4): _gzip_stream(_repeat(b'{"traceEvents":[', b'{"a":', deep)),
    }
    for name, data in bombs.items():
        assert len(data) < 16384  # a few kB on disk
        (save / name).write_bytes(data)
    result = _run(save, limit_memory=True)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    skips = _skips(result.stderr)
    assert set(skips) == set(bombs)
    limit = f"over the nesting limit: JSON nested deeper than {safe_io.MAX_DEPTH} levels"
    assert all(limit in reason for reason in skips.values()), skips
    _assert_good_analysed(json.loads(result.stdout))


def test_the_whole_file_reader_has_the_same_bounds(save: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files are decoded whole (orjson when installed; here the standard library stands in for it)."""
    monkeypatch.setattr(reader, "_loads", lambda: json.loads)
    (save / TRACE.format(rank=2)).write_bytes(_gzip_stream(_repeat(b'{"traceEvents":[', b"[", 100_000)))
    report = analyze(save, jobs=1)
    deep = f"over the nesting limit: JSON nested deeper than {safe_io.MAX_DEPTH} levels"
    assert _reasons(report) == {TRACE.format(rank=2): deep}
    assert report.files == GOOD


def test_a_gzip_bomb_is_skipped_naming_the_size_limit(save: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is lowered through its environment variable so that the bomb stays small and quick."""
    limit = 8 << 20
    spaces = _repeat(b'{"traceEvents":[', b" ", 32 << 20, b"]}")
    (save / TRACE.format(rank=2)).write_bytes(_gzip_stream(spaces))
    # a forged trailer claims 100 bytes: the whole-file reader must not trust it
    (save / TRACE.format(rank=3)).write_bytes(_gzip_stream(_repeat(b'{"traceEvents":[', b" ", 32 << 20), isize=100))
    env = {safe_io.MAX_BYTES_ENV: str(limit)}
    result = _run(save, env=env, limit_memory=True)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    skips = _skips(result.stderr)
    assert set(skips) == {TRACE.format(rank=2), TRACE.format(rank=3)}
    assert all(
        f"more than {limit:,} bytes when decompressed" in r and safe_io.MAX_BYTES_ENV in r for r in skips.values()
    )
    _assert_good_analysed(json.loads(result.stdout))

    monkeypatch.setenv(safe_io.MAX_BYTES_ENV, str(limit))
    monkeypatch.setattr(reader, "_loads", lambda: json.loads)
    assert _reasons(analyze(save, jobs=1)) == skips


def test_a_bad_size_limit_is_one_clear_error(
    save: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(safe_io.MAX_BYTES_ENV, "lots")
    rc, _, err = _cli([str(save), "--no-png"], capsys)
    assert rc == 2
    assert (
        err.strip()
        == f"instrument analyze: error: {safe_io.MAX_BYTES_ENV} must be a whole number of bytes > 0 (got 'lots')"
    )


def test_an_endless_string_is_skipped_naming_the_token_limit(save: Path) -> None:
    size = safe_io.MAX_TOKEN_BYTES + (1 << 20)
    (save / TRACE.format(rank=2)).write_bytes(
        _gzip_stream(_repeat(b'{"otherData":"', b"a", size, b'","traceEvents":[]}'))  # outside any event
    )
    (save / TRACE.format(rank=3)).write_bytes(
        _gzip_stream(_repeat(b'{"traceEvents":[{"ph":"X","ts":', b"1", size, b"}]}"))
    )
    result = _run(save, limit_memory=True)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    skips = _skips(result.stderr)
    assert set(skips) == {TRACE.format(rank=2), TRACE.format(rank=3)}
    assert "over the token limit: a string longer than" in skips[TRACE.format(rank=2)]
    assert "over the token limit: a number or literal longer than" in skips[TRACE.format(rank=3)]


def test_one_huge_event_or_header_is_skipped_naming_the_limit(save: Path) -> None:
    """One event of 6 M floats (24 MB of text, ~200 MB as Python objects: the reader builds an event
    whole, so ten times as many would exhaust RLIMIT_AS), among the events and in the header."""
    count = 6_000_000
    bombs = {
        TRACE.format(rank=2): _repeat(b'{"traceEvents":[{"ph":"X","args":{"a":[', b"1.5,", count, b"1]}}]}"),
        "header.json.gz": _repeat(b'{"distributedInfo":{"rank":1,"a":[', b"1.5,", count, b'1]},"traceEvents":[]}'),
    }
    for name, parts in bombs.items():
        (save / name).write_bytes(_gzip_stream(parts))
    result = _run(save, limit_memory=True)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    skips = _skips(result.stderr)
    assert set(skips) == set(bombs)
    assert "over the event limit: one event larger than" in skips[TRACE.format(rank=2)]
    assert "over the header limit: distributedInfo over" in skips["header.json.gz"]
    _assert_good_analysed(json.loads(result.stdout))


@pytest.mark.slow
def test_a_gzip_bomb_past_the_default_limit_is_skipped_in_bounded_memory(save: Path) -> None:
    """The default limit itself (1 GiB decompressed from a 1 MB file), under RLIMIT_AS."""
    count = safe_io.MAX_DECODED_BYTES + (1 << 20)
    (save / TRACE.format(rank=2)).write_bytes(_gzip_stream(_repeat(b'{"traceEvents":[', b" ", count, b"]}")))
    result = _run(save, limit_memory=True)
    _no_traceback(result)
    assert result.returncode == EXIT_SKIPPED, result.stderr
    assert f"more than {safe_io.MAX_DECODED_BYTES:,} bytes" in _skips(result.stderr)[TRACE.format(rank=2)]


def test_real_traces_are_far_inside_the_limits(good: Path) -> None:
    """The guard must never reject what the SDK writes: each real trace is scanned through it."""
    for path in good.glob("*.pt.trace.json.gz"):
        guard = safe_io.JsonGuard(max_bytes=safe_io.MAX_DECODED_BYTES)
        guard.feed(gzip.decompress(path.read_bytes()))
        assert guard.depth == 0 and not guard.in_string


# --------------------------------------------------------------------------- manifest paths


def test_manifest_paths_may_be_relative_or_absolute(save: Path, tmp_path: Path) -> None:
    """New manifests name files relative to save_path; older ones wrote absolute paths, maybe of another machine."""
    records = _records(save)
    for manifest in save.glob("instrument-manifest-*.jsonl"):
        manifest.unlink()
    forms = [
        lambda name: name,  # relative to save_path (the manifest's directory)
        lambda name: str(save / name),  # absolute, here
        lambda name: f"/another/machine/profile/{name}",  # absolute, copied from elsewhere
    ]
    lines = []
    for i, record in enumerate(records):
        name = Path(record["path"]).name
        lines.append(json.dumps({**record, "path": forms[i % len(forms)](name), "step": 7}))
    outside = tmp_path / TRACE.format(rank=5)
    shutil.copy(next(save.glob("*.pt.trace.json.gz")), outside)
    lines.append(json.dumps({**records[0], "path": f"../{outside.name}"}))  # never read outside DIR
    (save / "instrument-manifest-h-pid1.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    report = analyze(save, jobs=1)
    assert report.steps == (7,)  # every record matched its file (the names say step 1)
    assert report.files == GOOD
    assert _reasons(report) == {outside.name: "listed in a manifest but not in the directory"}


# --------------------------------------------------------------------------- output


def test_odd_names_and_labels_print_one_line_each_without_traceback(save: Path) -> None:
    """Names and labels of a directory we do not trust: no line breaks, no terminal escapes, no encoding error."""
    (save / "evil\nname\x1b[31m.pt.trace.json").write_text("not json", encoding="utf-8")
    (save / os.fsdecode(b"bad-\xff.pt.trace.json")).write_text("not json", encoding="utf-8")
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]
    labels = {"role": "\ud800role\x1b[2J", "stage": "s\ud800\n"}
    meta = {"distributedInfo": {"rank": 1}, "instrument": labels}
    (save / "surrogate.json").write_text(json.dumps({**meta, "traceEvents": events}), encoding="utf-8")
    named = save / "actor_odd_step3_rank0-of-2_h_pid1_1.pt.trace.json"  # the name gives the rank, the header labels
    named.write_text(json.dumps({"instrument": labels, "traceEvents": events}), encoding="utf-8")
    table = [sys.executable, "-m", "instrument", "analyze", str(save), "--no-png"]
    for result in (_run(save), subprocess.run(table, capture_output=True, timeout=HANG_GUARD_S, check=False)):
        out, err = (
            (result.stdout, result.stderr)
            if isinstance(result.stdout, str)
            else (result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))
        )
        assert "Traceback" not in err, err
        assert result.returncode == EXIT_SKIPPED, err
        lines = err.strip().splitlines()
        assert len([line for line in lines if "skipped" in line]) == 2, err  # one line per bad file
        assert len(lines) == 4, err  # and a note for each file read whole (one event, no stage in it)
        assert "\\n" in err
        assert "\x1b" not in err + out
    assert analyze(save, steps=[3], jobs=1).roles == ("actor",)  # the name's role: the header's cannot print


def test_the_default_picture_never_follows_a_planted_symlink_or_blocks_on_a_fifo(
    save: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    (save / "instrument-analysis.png").symlink_to(victim)
    rc, _, err = _cli([str(save)], capsys)
    assert rc == 0
    assert victim.read_text(encoding="utf-8") == "precious"
    assert "no picture" in err and "not a regular file" in err
    (save / "instrument-analysis.png").unlink()
    os.mkfifo(save / "instrument-analysis.png")
    with _unblocked(save / "instrument-analysis.png"):
        rc, _, err = _cli([str(save)], capsys)
    assert rc == 0 and "no picture" in err


# --------------------------------------------------------------------------- the guard itself

_TEXT = st.text(alphabet=st.sampled_from('ab[]{}"\\\n\t\u00e9\u2603'), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=_JSON, ascii_only=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_the_guard_measures_depth_exactly_wherever_the_text_is_cut(
    value: Any, ascii_only: bool, cuts: list[int]
) -> None:
    """Strings full of brackets, quotes and backslashes, cut at any byte: the guard agrees with the parser."""
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    depth = _depth(value)
    exact = safe_io.JsonGuard(max_bytes=len(text), max_depth=depth)
    for piece in pieces:
        exact.feed(piece)
    assert (exact.depth, exact.in_string, exact.total) == (0, False, len(text))
    if depth:
        shallow = safe_io.JsonGuard(max_bytes=len(text), max_depth=depth - 1)
        with pytest.raises(safe_io.OverLimitError, match="nesting limit"):
            for piece in pieces:
                shallow.feed(piece)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 20)), min_size=1, max_size=40))
def test_unsorted_ranges_merge_to_the_same_union(ranges: list[tuple[int, int]]) -> None:
    """Hostile files can list cpu ops in any order: merged apart (bounded memory), the union is the same."""
    kept = Ranges()
    for start, length in ranges:
        kept.add(float(start), float(start + length))
    union: list[list[float]] = []
    for start, end in sorted((float(s), float(s + n)) for s, n in ranges):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    starts, ends = kept.merged()
    assert [[s, e] for s, e in zip(starts, ends, strict=True)] == union
