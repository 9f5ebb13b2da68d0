"""Tests for ``instrument.run._timeline``: the writer thread, real files, the manifest record, failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from instrument.manifest import TraceRecord
from instrument.naming import TIMELINE_SUFFIX, parse_trace_name
from instrument.run._timeline import TimelineWriter
from instrument.timeline import read_timeline

STAGE = ("stage", None, "update_actor")
CRITIC = ("stage", "critic", "compute_values")
STEP = ("step", None, "step")


def _writer(save: Path, published: list[TraceRecord], failures: list[str]) -> TimelineWriter:
    return TimelineWriter(
        str(save),
        role="actor",
        rank=1,
        world_size=2,
        publish=published.append,
        report=lambda what, exc: failures.append(f"{what}: {exc}"),
    )


def test_spans_are_written_read_back_and_listed_in_the_manifest(tmp_path: Path) -> None:
    published: list[TraceRecord] = []
    failures: list[str] = []
    writer = _writer(tmp_path, published, failures)
    ident = threading.get_ident()
    writer.pending.append((STEP, 1, 100, 900, ident))
    writer.pending.append((STAGE, 1, 200, 500, ident))
    writer.pending.append((CRITIC, 1, 500, 800, ident + 1))
    writer.wake()
    writer.pending.append((STAGE, 2, 1_000, 1_300, ident))
    writer.add_clock(-70, 12, "test")
    writer.close()
    assert failures == []
    [record] = published
    path = tmp_path / record.path
    assert (record.role, record.stage, record.step, record.rank, record.world_size, record.tool) == (
        "actor", "timeline", 0, 1, 2, "timeline",
    )  # fmt: skip
    assert record.bytes == path.stat().st_size and path.name.endswith(TIMELINE_SUFFIX)
    name = parse_trace_name(path.name)
    assert name is not None and (name.role, name.stage, name.rank, name.world_size) == ("actor", "timeline", 1, 2)
    timeline = read_timeline(path)
    got = [(s.kind, s.role, s.stage, s.step, s.start_ns, s.end_ns) for s in timeline.spans]
    assert got == [
        ("step", "actor", "step", 1, 100, 900),
        ("stage", "actor", "update_actor", 1, 200, 500),
        ("stage", "critic", "compute_values", 1, 500, 800),
        ("stage", "actor", "update_actor", 2, 1_000, 1_300),
    ]
    assert sorted(timeline.threads.values()) == [ident, ident + 1]
    assert [(c.offset_ns, c.uncertainty_ns) for c in timeline.clocks] == [(-70, 12)]
    assert not timeline.torn


def test_close_twice_and_wake_after_close_write_nothing_more(tmp_path: Path) -> None:
    published: list[TraceRecord] = []
    writer = _writer(tmp_path, published, [])
    writer.pending.append((STAGE, 1, 0, 1, 0))
    writer.close()
    writer.close()
    writer.pending.append((STAGE, 2, 0, 1, 0))
    writer.wake()
    assert len(published) == 1 and not writer.pending
    assert len(read_timeline(tmp_path / published[0].path).spans) == 1


def test_a_run_without_spans_writes_no_file(tmp_path: Path) -> None:
    published: list[TraceRecord] = []
    writer = _writer(tmp_path / "never", published, [])
    writer.close()
    assert published == [] and not (tmp_path / "never").exists()


def test_a_save_path_that_cannot_be_made_is_reported_once_and_stops_the_timeline(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    failures: list[str] = []
    writer = _writer(blocker / "sub", [], failures)
    for step in range(1, 4):
        writer.pending.append((STAGE, step, 0, 1, 0))
        writer.wake()
    writer.close()
    assert len(failures) == 1 and "cannot write the step timeline" in failures[0]
    assert not writer.active


def test_a_taken_name_never_overwrites_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from instrument import naming

    taken = naming.trace_basename(
        role="actor", stage="timeline", step=0, rank=1, world_size=2, timestamp_ns=5
    ) + TIMELINE_SUFFIX  # fmt: skip
    (tmp_path / taken).write_bytes(b"someone else's")
    stamps = iter([5, 6])
    monkeypatch.setattr(naming, "next_timestamp_ns", lambda: next(stamps))
    published: list[TraceRecord] = []
    writer = _writer(tmp_path, published, [])
    writer.pending.append((STAGE, 1, 0, 1, 0))
    writer.close()
    assert (tmp_path / taken).read_bytes() == b"someone else's"
    assert published[0].path != taken and published[0].path.endswith(f"_6{TIMELINE_SUFFIX}")


def test_a_forked_child_never_writes_to_the_parents_file(tmp_path: Path) -> None:
    published: list[TraceRecord] = []
    writer = _writer(tmp_path, published, [])
    writer.pending.append((STAGE, 1, 0, 1, 0))
    writer.wake()
    pid = os.fork()
    if pid == 0:  # the child: forget, then try to write
        try:
            writer.forget()
            writer.pending.append((STAGE, 9, 0, 1, 0))
            writer.wake()
            writer.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    writer.close()
    assert [s.step for s in read_timeline(tmp_path / published[0].path).spans] == [1]
