"""Start markers and the stop's relocation of every replica (:mod:`instrument.rollout._markers`), on real files."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import instrument as ins
from instrument.manifest import Manifest, read_manifests
from instrument.rollout import relocate_engine_traces
from instrument.rollout._markers import MarkerStore, StartMarker, default_state_dir, relocate_replicas, summary
from instrument.rollout.sglang import TRACES as SGLANG
from instrument.rollout.vllm import TRACES as VLLM


def test_markers_round_trip_and_are_replaced_whole(tmp_path: Path) -> None:
    store = MarkerStore(tmp_path / "state")
    url = "http://10.0.0.5:8000"
    assert store.read(url) is None
    store.write(StartMarker(url, "step3", 123))
    store.write(StartMarker(url, "step4", 456))
    assert store.read(url) == StartMarker(url, "step4", 456)
    assert store.read("http://10.0.0.5:8001") is None  # another port, another marker
    assert [p.name for p in (tmp_path / "state").iterdir()] == [store.path(url).name]  # no temp left behind
    store.remove(url)
    store.remove(url)  # twice: nothing to do
    assert store.read(url) is None


@pytest.mark.parametrize("content", ["", "{", "[]", '{"url": "http://other:1", "started_ns": 1}', '{"url": 3}'])
def test_a_marker_that_cannot_be_read_counts_as_none(tmp_path: Path, content: str) -> None:
    store = MarkerStore(tmp_path)
    store.path("http://a:1").write_text(content)
    assert store.read("http://a:1") is None


def test_an_unwritable_state_dir_raises_os_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        MarkerStore(blocker / "state").write(StartMarker("http://a:1", None, 1))


def test_the_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / "instrument" / "rollout"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path.home() / ".local" / "state" / "instrument" / "rollout"


@given(
    st.integers(min_value=0, max_value=10**9), st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._", max_size=30)
)
def test_the_step_prefix_is_read_back(step: int, rest: str) -> None:
    assert VLLM.step(f"step{step}_{rest}") == step
    assert VLLM.step(f"rank0.{step}.pt.trace.json.gz") is None
    assert SGLANG.step(f"step{step}-{rest}") == step  # each engine joins the prefix its own way


# --------------------------------------------------------------------------- relocation of every replica


def _write(directory: Path, names: list[str], mtime_ns: int | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"t" * 10)
        if mtime_ns is not None:
            os.utime(directory / name, ns=(mtime_ns, mtime_ns))


def test_each_replica_by_its_directory_this_step_only_tp_peers_left(tmp_path: Path) -> None:
    base, save = tmp_path / "prof", tmp_path / "save"
    earlier = time.time_ns() - 10**10
    _write(base / "replica0", ["rank0.1.pt.trace.json.gz"], mtime_ns=earlier)  # an earlier session, unprefixed
    _write(base / "replica0", ["step3_rank0.2.pt.trace.json.gz", "step3_rank1.2.pt.trace.json.gz"])
    _write(base / "replica1", ["step3_rank0.3.pt.trace.json.gz", "step3_rank1.3.pt.trace.json.gz"])
    _write(base / "replica1", ["step2_rank1.4.pt.trace.json.gz"])  # another step, written since: never relabelled
    (base / "replica9-notes").mkdir()
    since = time.time_ns() - 10**9
    cfg = ins.ProfilerConfig(ranks=(1, 2))  # replica 0 keeps its local rank 1, replica 1 its local rank 0
    moves = relocate_replicas(
        base, save_path=save, step=3, config=cfg, gpus_per_replica=2, world_size=4, since_ns=since, quiet_s=0.05,
        traces=VLLM, publish=Manifest(save).append,
    )  # fmt: skip
    assert [(m.replica, m.moved, m.dropped, m.skipped, m.failed) for m in moves] == [
        (0, ["rollout_engine_step3_rank1-of-4_replica0_step3_rank1.2.pt.trace.json.gz"], 1, 1, []),
        (1, ["rollout_engine_step3_rank2-of-4_replica1_step3_rank0.3.pt.trace.json.gz"], 1, 1, []),
    ]
    assert (base / "replica1" / "step2_rank1.4.pt.trace.json.gz").exists()
    assert (base / "replica0" / "rank0.1.pt.trace.json.gz").exists()
    assert sorted(r.path for r in read_manifests(save)) == sorted(m.moved[0] for m in moves)
    lines = summary(moves, save)
    assert lines[0] == f"relocated 2 files into {save} (replica0: 1, replica1: 1)"
    assert lines[1] == "left in place: 2 of ranks not profiled (TP peers), 2 of another step or an earlier start"


def test_a_replica_past_the_world_is_reported_and_left(tmp_path: Path) -> None:
    base = tmp_path / "prof"
    _write(base / "replica2", ["step1_rank0.1.pt.trace.json.gz"])
    [move] = relocate_replicas(
        base, save_path=tmp_path / "save", step=1, config=ins.ProfilerConfig(all_ranks=True), gpus_per_replica=1,
        world_size=2, since_ns=None, quiet_s=0.05, traces=VLLM, publish=None,
    )  # fmt: skip
    assert move.moved == [] and "replica 2 is past the 2 replicas of --world-size 2" in move.failed[0]
    assert (base / "replica2" / "step1_rank0.1.pt.trace.json.gz").exists()


@pytest.mark.parametrize(
    ("gpus", "world", "message"), [(0, 2, "'gpus_per_replica' must be an int >= 1"), (2, 3, "not a multiple")]
)
def test_bad_numbers_are_refused_before_anything_moves(tmp_path: Path, gpus: int, world: int, message: str) -> None:
    _write(tmp_path / "prof" / "replica0", ["step1_rank0.1.pt.trace.json.gz"])
    with pytest.raises(ValueError, match=message):
        relocate_replicas(
            tmp_path / "prof", save_path=tmp_path / "save", step=1, config=ins.ProfilerConfig(),
            gpus_per_replica=gpus, world_size=world, since_ns=None, traces=VLLM, publish=None,
        )  # fmt: skip
    assert (tmp_path / "prof" / "replica0" / "step1_rank0.1.pt.trace.json.gz").exists()


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than ``tmp_path`` (``/dev/shm``), or skip."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine: cannot test a move across filesystems")
    directory = Path(tempfile.mkdtemp(prefix="instrument-test-", dir="/dev/shm"))
    try:
        if os.stat(directory).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm and the test's tmp_path are on the same filesystem here")
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_relocation_across_filesystems_is_complete_and_never_overwrites(tmp_path: Path, other_filesystem: Path) -> None:
    source = other_filesystem / "replica0"
    _write(source, ["step1_rank0.1.pt.trace.json.gz"])
    (source / "step1_rank0.1.pt.trace.json.gz").write_bytes(b"x" * 100_000)
    save = tmp_path / "save"
    save.mkdir()
    taken = save / "rollout_engine_step1_rank0-of-1_replica0_step1_rank0.1.pt.trace.json.gz"
    kw = {"save_path": save, "step": 1, "replica": 0, "gpus_per_replica": 1, "world_size": 1, "keep_ranks": {0}}
    kw["traces"] = VLLM
    taken.write_bytes(b"mine")  # already there: never overwritten, the source stays
    result = relocate_engine_traces(source, quiet_s=0.05, report=lambda what, exc: None, **kw)  # type: ignore[arg-type]
    assert result.failed and taken.read_bytes() == b"mine" and (source / "step1_rank0.1.pt.trace.json.gz").exists()
    taken.unlink()
    result = relocate_engine_traces(source, quiet_s=0.05, **kw)  # type: ignore[arg-type]
    assert [r.bytes for r in result.moved] == [100_000] and taken.read_bytes() == b"x" * 100_000
    assert not list(source.iterdir()) and [p.name for p in save.iterdir()] == [taken.name]  # no temp file left
