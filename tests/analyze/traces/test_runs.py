"""Several runs into one save_path: ``instrument analyze`` shows the newest, ``--run`` picks (issue 27, item 6).

Each run is a real ``configure`` / ``profile_step`` / ``finish`` in a fresh process (torch.profiler traces,
a step timeline, a manifest), run one after the other into the same directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument import naming
from instrument.analyze import analyze
from instrument.analyze.traces._discover import NO_RUN_ID, Run, _joined, find_runs, runs_line, select_run
from instrument.cli import main
from instrument.manifest import RunStamp, TraceRecord, read_manifests

pytest.importorskip("torch")

_RUN = """
import sys
import torch
import instrument as ins

save, steps, ops = sys.argv[1], tuple(int(s) for s in sys.argv[2].split(",")), int(sys.argv[3])
run = ins.configure(ins.ProfilerConfig(steps=steps, save_path=save), role="actor", rank=0, world_size=1)

@ins.profiled_stage("update_actor")
def update_actor():
    x = torch.ones(8, 8)
    for _ in range(ops):
        x = x @ x

for step in range(1, max(steps) + 1):
    with ins.profile_step(step):
        update_actor()
ins.finish()
print(run.run_id)
"""

_LAUNCHERS = ("INSTRUMENT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID")


def real_run(save: Path, steps: str = "1,2", ops: int = 1, **env: str) -> tuple[str, str]:
    """One real run of a fresh process into ``save``: its run id and what it logged on stderr."""
    environ = {k: v for k, v in os.environ.items() if k not in _LAUNCHERS} | env
    environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(save), steps, str(ops)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1], done.stderr


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """Three runs into one directory: steps 1-2, 1-3, then 1-2 with more ops; their ids and stderr."""
    save = tmp_path_factory.mktemp("runs") / "profile"
    ids, logs = [], []
    for steps, ops in (("1,2", 1), ("1,2,3", 2), ("1,2", 3)):
        run_id, log = real_run(save, steps, ops)
        ids.append(run_id)
        logs.append(log)
    return save, ids, logs


def _analysis(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    status = main(["analyze", *args, "--json", "--no-png", "--quiet"])
    out, err = capsys.readouterr()
    return status, json.loads(out) if out.strip() else {}, err


def _steps(data: dict[str, Any]) -> set[int]:
    return {row["step"] for row in data["stages"]}


def test_every_line_of_a_run_names_the_run_and_runs_differ(three_runs: tuple[Path, list[str], list[str]]) -> None:
    save, ids, _ = three_runs
    assert len(set(ids)) == 3
    stamped = {record.run.id for record in read_manifests(save) if record.run is not None}
    assert stamped == set(ids)
    assert all(record.run is not None for record in read_manifests(save))


def test_a_run_into_a_used_save_path_says_so_once(three_runs: tuple[Path, list[str], list[str]]) -> None:
    _, _, logs = three_runs
    assert "older runs" not in logs[0]
    for log in logs[1:]:
        assert log.count("already holds files of older runs") == 1
        assert "instrument analyze" in log


def test_analyze_shows_the_newest_run_and_names_the_others(
    three_runs: tuple[Path, list[str], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    save, ids, _ = three_runs
    status, data, err = _analysis(capsys, str(save))
    assert status == 0, err
    assert "duplicate" not in err
    assert _steps(data) == {1, 2}
    assert data["files"] == 2  # the newest run's two traces, none of the older ones'
    runs = data["runs"]
    assert [r["id"] for r in runs] == ids[::-1]
    assert [r["selected"] for r in runs] == [True, False, False]
    assert all(r["files"] >= 3 and r["started"].endswith("Z") for r in runs)  # traces and a timeline each
    line = next(line for line in err.splitlines() if "runs here" in line)
    assert ids[2] in line and ids[1] in line and ids[0] in line and "--run" in line


def test_a_step_only_an_older_run_holds_matches_nothing_and_the_runs_line_says_where_to_look(
    three_runs: tuple[Path, list[str], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    save, ids, _ = three_runs
    status = main(["analyze", str(save), "--steps", "3", "--no-png", "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    lines = err.splitlines()
    assert "runs here" in lines[0] and ids[1] in lines[0] and "--run" in lines[0]
    assert lines[1] == f"instrument analyze: error: nothing in {save} (run {ids[2]}) matches --steps 3"
    assert main(["analyze", str(save), "--steps", "3", "--run", ids[1], "--no-png", "--quiet", "--json"]) == 0
    capsys.readouterr()


def test_run_picks_an_older_run_or_every_run(
    three_runs: tuple[Path, list[str], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    save, ids, _ = three_runs
    status, data, err = _analysis(capsys, str(save), "--run", ids[1])
    assert status == 0, err
    assert _steps(data) == {1, 2, 3} and data["files"] == 3
    assert [r["selected"] for r in data["runs"]] == [False, True, False]

    status, data, err = _analysis(capsys, str(save), "--run", "all")
    assert status == 1  # today's behaviour: duplicates across runs are skipped, the first by path kept
    assert "duplicate" in err
    assert _steps(data) == {1, 2, 3} and data["files"] == 3
    assert all(r["selected"] for r in data["runs"])


def test_a_layout_exports_the_newest_run_or_the_run_asked_for(
    three_runs: tuple[Path, list[str], list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save, ids, _ = three_runs
    newest = {p.name for p in save.glob("*.pt.trace.json*") if ids[2] in _manifest_runs(save).get(p.name, "")}
    assert main(["analyze", str(save), "--layout", "hta", str(tmp_path / "newest"), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert len(newest) == 2 and {Path(f["source"]).name for f in exported["files"]} == newest  # no duplicate
    assert main(["analyze", str(save), "--layout", "hta", str(tmp_path / "older"), "--run", ids[1]]) == 0
    assert len(list((tmp_path / "older").rglob("*.json*"))) == 3  # that run's steps 1-3
    capsys.readouterr()


def _manifest_runs(save: Path) -> dict[str, str]:
    """Each listed file's run id, from the manifests."""
    return {Path(r.path).name: r.run.id for r in read_manifests(save) if r.run is not None}


def test_an_unknown_run_exits_2_naming_the_runs_there(
    three_runs: tuple[Path, list[str], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    save, ids, _ = three_runs
    status = main(["analyze", str(save), "--run", "nosuchrun", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert "no run 'nosuchrun'" in err and all(run_id in err for run_id in ids) and "--run all" in err
    assert not (save / "instrument-analysis.png").exists()


def test_the_library_analyses_the_newest_run_too(three_runs: tuple[Path, list[str], list[str]]) -> None:
    save, ids, _ = three_runs
    assert analyze(save).files == 2
    assert analyze(save, run=ids[1]).files == 3
    assert analyze(save, run="all").files == 3


def test_compare_reads_the_newest_run_of_a_directory(
    three_runs: tuple[Path, list[str], list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save, _, _ = three_runs
    base = tmp_path / "base"
    real_run(base, "1,2", 3)
    status = main(["compare", str(base), str(save), "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err  # no duplicate from the older runs: each side is one run
    assert "duplicate" not in err
    assert json.loads(out)["overlap"]["common_ranks"] == ["0"]


def test_an_id_given_in_the_environment_is_the_run_id(tmp_path: Path) -> None:
    first, _ = real_run(tmp_path, "1", INSTRUMENT_RUN_ID="job 42/a")
    second, _ = real_run(tmp_path, "1", TORCHELASTIC_RUN_ID="none", SLURM_JOB_ID="77", SLURM_STEP_ID="3")
    assert first == "job-42-a"  # made safe for a command line and a file name
    assert second == "slurm-77.3"  # torchrun's default "none" names no run
    assert [run.id for run in find_runs(tmp_path)] == [second, first]


def test_files_of_no_run_join_the_newest_run_if_written_since_it_started_else_form_their_own(
    tmp_path: Path,
) -> None:
    old = tmp_path / "foreign.json"
    old.write_text('{"traceEvents": []}')
    os.utime(old, (1_000_000_000, 1_000_000_000))  # written long before any run here
    run_id, _ = real_run(tmp_path, "1")
    (tmp_path / "engine.json").write_text('{"traceEvents": []}')  # written after the run started: its own
    runs = find_runs(tmp_path)
    assert [run.id for run in runs] == [run_id, NO_RUN_ID]
    assert "engine.json" in runs[0].names and runs[1].names == {"foreign.json"}
    assert select_run(runs, None, tmp_path) is runs[0]
    assert select_run(runs, NO_RUN_ID, tmp_path) is runs[1]
    assert select_run(runs, run_id[:-3], tmp_path) is runs[0]  # a unique start of an id will do


def test_an_old_manifest_without_run_ids_is_one_run(tmp_path: Path) -> None:
    real_run(tmp_path, "1")
    for manifest in tmp_path.glob("instrument-manifest-*.jsonl"):  # as versions before run ids wrote them
        lines = [json.loads(line) for line in manifest.read_text().splitlines()]
        for line in lines:
            for key in ("run", "run_from", "run_started"):
                line.pop(key)
        manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    runs = find_runs(tmp_path)
    assert [run.id for run in runs] == [NO_RUN_ID] and runs[0].files == 2
    assert analyze(tmp_path).files == 1


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1000, allow_nan=False), st.sampled_from(["time", "process", "store"]), st.integers(1, 3)
        ),
        max_size=12,
    )
)
def test_time_runs_join_only_within_a_minute_and_one_world_size(
    stamps: list[tuple[float, str, int]],
) -> None:
    seen: dict[str, list[Any]] = {f"run{i}": list(stamp) for i, stamp in enumerate(stamps)}
    alias = _joined(seen)
    for run_id, head in alias.items():
        started, source, world = seen[run_id]
        assert source == "time" and seen[head][1] in ("time", "store") and seen[head][2] == world
        if seen[head][1] == "store":  # a rank that gave up on rank 0's id: the nearest store run, either side
            gap = abs(started - seen[head][0])
            assert gap < 60
            assert all(
                abs(started - begun) >= gap for begun, src, size in seen.values() if (src, size) == ("store", world)
            )
        else:
            assert 0 <= started - seen[head][0] < 60
            assert not any(abs(started - b) < 60 for b, src, size in seen.values() if (src, size) == ("store", world))
        assert head not in alias  # one step: a run joins a head, never a chain


def test_a_rank_that_gave_up_on_rank_0s_id_joins_rank_0s_run(tmp_path: Path) -> None:
    """Rank 1 configured first and waited in vain; rank 0 configured 5 s later: one run, rank 0's id."""
    for rank, (run_id, source, started) in enumerate([("host-pid7-x", "store", 1005.0), ("t1-w2", "time", 1000.0)]):
        base = naming.trace_basename(role="actor", stage="update_actor", step=1, rank=rank, world_size=2)
        (tmp_path / f"{base}.pt.trace.json.gz").write_bytes(b"")
        stamp = RunStamp(run_id, source, started)
        record = TraceRecord(
            path=f"{base}.pt.trace.json.gz",
            role="actor",
            stage="update_actor",
            step=1,
            rank=rank,
            world_size=2,
            bytes=0,
            tool="torch",
            run=stamp,
        )
        (tmp_path / f"instrument-manifest-h-pid{rank}.jsonl").write_text(record.to_json() + "\n")
    (run,) = find_runs(tmp_path)
    assert run.id == "host-pid7-x" and run.files == 2


def test_the_runs_line_names_five_older_runs_and_counts_the_rest() -> None:
    runs = [Run(f"r{i}", float(100 - i), frozenset({str(i)})) for i in range(9)]
    line = runs_line(runs, runs[0])
    assert line is not None and line.startswith("9 runs here; analysed the newest, r0 (")
    assert (
        "r5 (" in line
        and "r6 (" not in line
        and line.endswith("and 3 more (--json lists every one); pick one with --run ID, or --run all")
    )
    assert runs_line(runs[:1], runs[0]) is None
    assert (runs_line(runs[:2], None) or "").startswith("2 runs analysed together (--run all): r0 (")


def test_select_run_takes_all_and_refuses_an_ambiguous_start(tmp_path: Path) -> None:
    runs = [Run("ab1", 2.0, frozenset({"x"})), Run("ab2", 1.0, frozenset({"y"}))]
    assert select_run(runs, "all", tmp_path) is None
    assert select_run(runs, None, tmp_path) is runs[0]
    with pytest.raises(ValueError, match="several runs start with 'ab'"):
        select_run(runs, "ab", tmp_path)
    with pytest.raises(ValueError, match="holds no run"):
        select_run([], "ab", tmp_path)
