"""``instrument analyze DIR --ray [ADDRESS]`` (issue 17 item 3): files read as Ray tasks, the same report.

On a real local Ray cluster with 2 CPUs (two worker processes reading at once): the SDK's own traces
(real ``torch.profiler`` runs, continuous mode), discrete traces with known durations and a damaged
file. The report from Ray equals the local one number for number (``elapsed_s`` and ``jobs`` aside),
from Python and from the command line connecting to the cluster by its address. Without Ray, or
with contradicting options, the command says so (exit 2). The batching is a pure function: a
hypothesis property.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import cli
from instrument.analyze import TraceFile, analyze, render_text
from instrument.analyze.traces._ray import _batches, _scan_batch

ROOT = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 600  # a stuck cluster fails the test instead of hanging CI; never a speed check
VARYING = ("elapsed_s", "jobs", "png", "html")  # how long and by how many: the only fields that may differ


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in VARYING}


@pytest.fixture(scope="module")
def trace_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real SDK continuous traces (2 ranks x 2 steps), 3 ranks x 2 steps x 3 stages of known durations, and a
    damaged file (the SDK's discrete traces are read by the same code as the known ones, and would duplicate them)."""
    from tests.analyze.test_analyze import _run_ranks, known_run

    directory = tmp_path_factory.mktemp("ray") / "profile"
    known_run(directory)
    _run_ranks(directory / "sdk", discrete=False, world=2, steps=2)
    for path in (directory / "sdk").iterdir():  # flat, as in a save_path; the manifest keeps a name of its own
        path.rename(directory / (f"sdk-{path.name}" if path.name.startswith("instrument-manifest-") else path.name))
    (directory / "sdk").rmdir()
    (directory / "critic_update-critic_step1_rank0-of-3_node-a_pid9_1.pt.trace.json.gz").write_bytes(b"\x1f\x8b broken")
    return directory


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.slow
def test_the_report_from_ray_tasks_equals_the_local_one(trace_set: Path, ray_cluster: Any) -> None:
    local = analyze(trace_set, jobs=1)
    assert ray_cluster.cluster_resources()["CPU"] >= 2  # two worker processes read at once
    on_ray = analyze(trace_set, ray=True)
    assert on_ray.jobs == int(ray_cluster.cluster_resources()["CPU"])
    assert _comparable(on_ray.to_dict()) == _comparable(local.to_dict())
    assert local.files == 3 * 2 * 3 + 2 * 2 and len(local.skipped) == 1  # every kind was read
    timed_alike = dataclasses.replace(on_ray, elapsed_s=local.elapsed_s, jobs=local.jobs)
    assert render_text(timed_alike) == render_text(local)  # the table too


@pytest.mark.slow
def test_the_command_line_connects_by_address_and_prints_the_same_json(
    trace_set: Path, ray_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["analyze", str(trace_set), "--json", "--no-png"]) == 1  # the damaged file
    local_out, local_err = capsys.readouterr()
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        [sys.executable, "-m", "instrument", "analyze", str(trace_set), "--json", "--no-png", "--ray", address],
        capture_output=True,
        text=True,
        check=False,
        timeout=HANG_GUARD_S,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert _comparable(json.loads(done.stdout)) == _comparable(json.loads(local_out))
    assert done.stderr == local_err  # the same skipped file, the same words
    assert json.loads(done.stdout)["jobs"] >= 2


def test_a_file_the_worker_cannot_see_asks_for_a_shared_filesystem(tmp_path: Path) -> None:
    missing = TraceFile(str(tmp_path / "not-here.pt.trace.json.gz"), "actor", "update", 1, 0, 1)
    ((reason, _),) = _scan_batch([missing], None)
    assert isinstance(reason, str)
    assert "not found on Ray node" in reason and "shared filesystem" in reason


def test_without_ray_the_command_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as where it is not installed
    assert cli.main(["analyze", str(tmp_path), "--ray"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "instrument analyze: error: --ray needs Ray: pip install 'instrument-rl[ray]'\n"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--ray", "--jobs", "2"], "--ray and --jobs contradict each other"),
        (["--ray=auto", "--layout", "hta", "out"], "--layout links files and reads none: drop --ray"),
    ],
)
def test_ray_with_contradicting_options_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    assert cli.main(["analyze", str(tmp_path), *extra]) == 2
    assert words in capsys.readouterr().err


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 10**9), max_size=60), count=st.integers(1, 20))
def test_batches_hold_every_file_once_and_are_balanced_by_bytes(sizes: list[int], count: int) -> None:
    batches = _batches(sizes, count)
    assert sorted(i for batch in batches for i in batch) == list(range(len(sizes)))
    assert len(batches) <= count and all(batches)
    loads = [sum(max(sizes[i], 1) for i in batch) for batch in batches]
    if len(batches) == count and sizes:  # largest first onto the lightest: no batch exceeds another by more than a file
        assert max(loads) - min(loads) <= max(max(s, 1) for s in sizes)
