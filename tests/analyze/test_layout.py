"""``instrument analyze DIR --layout hta|tensorboard OUT``: the export that HTA and TensorBoard read right.

Inputs are real: traces written through the public API by torch.profiler (every rank a
configure/finish cycle in this process) and two real GPU traces with NCCL from HTA's test data
(``tests/data/hta``).  The TensorBoard check runs the profiler plugin's own ``RunLoader`` (as its
tests do) in a subprocess on the exported folders.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import instrument as ins
import instrument.analyze
import instrument.testing
from instrument import cli
from instrument._safe_files import FolderTree
from instrument.analyze import TraceFile
from instrument.analyze import _layout as layout
from instrument.analyze.traces._reader import TraceError

WORLD = 3
STEPS = 2
HTA_DATA = Path(__file__).parents[1] / "data" / "hta" / "trace_filter"
HTA_RANK = re.compile(r'"rank":\s+(\d+)')  # the pattern HTA's rank-to-file map looks for (first match)
TB_WORKER = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")  # torch-tb-profiler 0.4.3 consts.WORKER_PATTERN


def _matmul() -> None:
    torch.randn(16, 16) @ torch.randn(16, 16)


class Worker:
    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self) -> None:
        _matmul()

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, n: int) -> None:
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                _matmul()


def _run_ranks(save_path: Path) -> None:
    """One process plays every rank in turn: configure(rank=r) is what a real rank would call."""
    for rank in range(WORLD):
        instrument.testing.reset()
        cfg = ins.ProfilerConfig(
            save_path=str(save_path), all_ranks=True, contents=("cpu",), schedule=ins.Schedule(wait=1, active=2)
        )
        ins.configure(cfg, role="actor", rank=rank, world_size=WORLD)
        worker = Worker()
        for step in range(1, STEPS + 1):
            with ins.profile_step(step, last=(step == STEPS)):
                worker.generate_sequences()
                worker.update_actor(3)
        ins.finish()
    instrument.testing.reset()


@pytest.fixture(scope="module")
def save_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("save")
    _run_ranks(path)
    return path


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if not p.is_dir()}


_EXPECTED_FOLDERS = [
    folder
    for step in range(1, STEPS + 1)
    for folder in (f"actor/generate-sequences/step{step}", f"actor/update-actor/step{step}_mb1-2")
]

# --------------------------------------------------------------------------- the TensorBoard plugin's loader

_LOADER = """
import json, sys
from torch_tb_profiler import io
from torch_tb_profiler.profiler import RunLoader

result = {}
for run_dir in sys.argv[1:]:
    run = RunLoader(run_dir, run_dir, io.Cache()).load()
    result[run_dir] = {
        "profiles": sorted([w, s, type(p).__name__] for (w, s), p in run.profiles.items()),
        "views": [v.name for v in run.views],
    }
print("RESULT " + json.dumps(result))
"""


def _tb_load(run_dirs: list[Path]) -> dict[str, Any]:
    """torch-tb-profiler's ``RunLoader(...).load()`` on each folder, as the plugin and its tests call it.

    In a fresh interpreter (the plugin starts worker processes: forked there, as nothing else runs).
    """
    env = {**os.environ, "TORCH_PROFILER_START_METHOD": "fork"}
    done = subprocess.run(
        [sys.executable, "-c", _LOADER, *map(str, run_dirs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def _tb_run_dirs(logdir: Path) -> list[Path]:
    """The folders the plugin takes as runs (its ``_get_run_dirs``: any folder holding a trace file)."""
    from torch_tb_profiler.plugin import TorchProfilerPlugin

    class _Plugin:  # _get_run_dirs reads only self.logdir
        def __init__(self) -> None:
            self.logdir = str(logdir)

    return sorted(Path(d) for d in TorchProfilerPlugin._get_run_dirs(_Plugin()))  # type: ignore[arg-type]


def test_tensorboard_loads_one_worker_per_rank_in_every_folder(
    save_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tb"
    rc, stdout, err = _cli([str(save_path), "--layout", "tensorboard", str(out)], capsys)
    assert (rc, err) == (0, "")
    assert f"{WORLD * STEPS * 2} files in {STEPS * 2} folders ({WORLD * STEPS * 2} hard links)" in stdout
    files = _files(out)
    assert sorted({str(Path(f).parent) for f in files}) == sorted(_EXPECTED_FOLDERS)
    for relative, path in files.items():
        match = TB_WORKER.match(path.name)
        assert match is not None and match[2] is not None, relative  # {worker}.{timestamp}.pt.trace.json.gz
        assert path.name.endswith(".pt.trace.json.gz") and not path.is_symlink()
    runs = _tb_run_dirs(out)
    assert runs == sorted(out / f for f in _EXPECTED_FOLDERS)
    loaded = _tb_load(runs)
    for run in runs:
        profiles = loaded[str(run)]["profiles"]
        assert profiles == [[f"rank{r}", "1", "RunProfile"] for r in range(WORLD)], run  # one worker per rank
        assert "overall" in loaded[str(run)]["views"]


def test_tensorboard_distributed_view_on_real_gpu_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not HTA_DATA.is_dir():
        pytest.skip(f"{HTA_DATA} (HTA's real NCCL traces) is not in this checkout")
    source = tmp_path / "run"
    shutil.copytree(HTA_DATA, source)  # HTA-style names: ranks from distributedInfo
    out = tmp_path / "tb"
    rc, _, err = _cli([str(source), "--layout", "tensorboard", str(out)], capsys)
    assert (rc, err) == (0, "")
    runs = _tb_run_dirs(out)
    assert runs == [out / "unknown" / "trace" / "no-step"]
    loaded = _tb_load(runs)[str(runs[0])]
    assert loaded["profiles"] == [
        ["All", "1", "DistributedRunProfile"],  # the distributed view across the workers
        ["rank0", "1", "RunProfile"],
        ["rank1", "1", "RunProfile"],
    ]
    assert "distributed" in loaded["views"] and "kernel" in loaded["views"]


_DISTRIBUTED = """
import json, sys
from torch_tb_profiler import io
from torch_tb_profiler.profiler import RunLoader

run = RunLoader(sys.argv[1], sys.argv[1], io.Cache()).load()
every = run.profiles[("All", "1")]
said = {"overlap": every.steps_to_overlap, "waittime": every.steps_to_wait, "commops": every.comm_ops}
print("RESULT " + json.dumps({k: sorted(v["data"]) for k, v in said.items()}))
"""


@pytest.mark.slow
def test_tensorboard_distributed_view_on_gloo_traces(tmp_path: Path) -> None:
    """Real gloo ranks under the real profiler, CPU only: the export gets the plugin's distributed view."""
    import torch.multiprocessing as mp

    from tests.analyze.traces.test_steps import _free_port, _profiled_rank

    (tmp_path / "traces").mkdir()
    spawn: Any = mp.spawn  # type: ignore[attr-defined,unused-ignore]
    spawn(_profiled_rank, args=(2, str(tmp_path / "traces"), _free_port()), nprocs=2, join=True)
    export = layout.export_layout(tmp_path / "traces", tmp_path / "tb", "tensorboard")
    [folder] = export.folders
    loaded = _tb_load([tmp_path / "tb" / folder])[str(tmp_path / "tb" / folder)]
    assert "distributed" in loaded["views"] and ["All", "1", "DistributedRunProfile"] in loaded["profiles"]
    env = {**os.environ, "TORCH_PROFILER_START_METHOD": "fork"}
    done = subprocess.run(
        [sys.executable, "-c", _DISTRIBUTED, str(tmp_path / "tb" / folder)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    assert data == {"overlap": ["1", "2", "all"], "waittime": ["1", "2", "all"], "commops": ["rank0", "rank1"]}


def test_a_flat_save_path_gives_no_distributed_view_but_the_export_does(tmp_path: Path) -> None:
    """Why the export exists: the plugin makes one worker per file name, so a flat folder of
    HTA-named files is one worker per file and no 'All'; the exported folder lines them up."""
    if not HTA_DATA.is_dir():
        pytest.skip(f"{HTA_DATA} (HTA's real NCCL traces) is not in this checkout")
    flat = tmp_path / "flat"
    flat.mkdir()
    for rank in (0, 1):  # torch's own naming, {worker}.{ns}: one worker per file, spans apart
        shutil.copy(HTA_DATA / f"sampled_rank-{rank}.json.gz", flat / f"host_{100 + rank}.{rank}.pt.trace.json.gz")
    export = layout.export_layout(flat, tmp_path / "tb", "tensorboard")
    assert [f.target.split("/")[-1].split(".")[0] for f in export.files] == ["rank0", "rank1"]
    assert export.folders == ("unknown/trace/no-step",)


# --------------------------------------------------------------------------- HTA


def _hta_rank(path: Path) -> int | None:
    """The rank HTA's ``create_rank_to_trace_dict`` gives the file: the first ``"rank": N``, line by line."""
    with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as text:
        for line in text:
            match = HTA_RANK.search(line)
            if match:
                return int(match[1])
    return None


def test_hta_layout_one_file_per_rank_per_folder(save_path: Path, tmp_path: Path) -> None:
    export = layout.export_layout(save_path, tmp_path / "hta", "hta")
    assert export.skipped == ()
    assert export.folders == tuple(sorted(_EXPECTED_FOLDERS))
    assert {f.how for f in export.files} == {"link"}  # the SDK writes distributedInfo.rank: nothing to rewrite
    for folder in export.folders:
        names = sorted(p.name for p in (tmp_path / "hta" / folder).iterdir())
        assert names == [f"rank-{r}.json.gz" for r in range(WORLD)]
        for rank in range(WORLD):
            path = tmp_path / "hta" / folder / f"rank-{rank}.json.gz"
            assert _hta_rank(path) == rank
    for done in export.files:  # a hard link: the same file, no copy
        assert os.path.samefile(done.source, tmp_path / "hta" / done.target)


def _engine_trace(path: Path, distributed_rank: int | None) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10.0, "dur": 5.0, "pid": 0, "tid": 7}]
    data: dict[str, Any] = {"schemaVersion": 1}
    if distributed_rank is not None:
        data["distributedInfo"] = {"backend": "nccl", "rank": distributed_rank, "world_size": 2}
    data["traceEvents"] = events
    path.write_bytes(gzip.compress(json.dumps(data, indent=2).encode()))


def test_hta_layout_sets_the_rank_hta_reads_when_the_trace_says_another(tmp_path: Path) -> None:
    """Relocated vLLM engine traces carry the engine-local rank in distributedInfo (both replicas
    say 0 and 1): HTA would keep one of each pair.  The export writes copies with the global rank."""
    source = tmp_path / "save"
    source.mkdir()
    for replica in (0, 1):
        for local in (0, 1):
            rank = replica * 2 + local
            name = f"rollout_engine_step1_rank{rank}-of-4_replica{replica}_rank{local}.17000{rank}.pt.trace.json.gz"
            _engine_trace(source / name, distributed_rank=local)
    export = layout.export_layout(source, tmp_path / "hta", "hta")
    assert export.skipped == ()
    folder = tmp_path / "hta" / "rollout" / "engine" / "step1"
    assert sorted(p.name for p in folder.iterdir()) == [f"rank-{r}.json.gz" for r in range(4)]
    hows = {f.target: f.how for f in export.files}
    for rank in range(4):
        path = folder / f"rank-{rank}.json.gz"
        assert _hta_rank(path) == rank
        data = json.loads(gzip.decompress(path.read_bytes()))  # still one valid trace
        assert data["distributedInfo"]["rank"] == rank and len(data["traceEvents"]) == 1
        assert hows[f"rollout/engine/step1/rank-{rank}.json.gz"] == ("link" if rank < 2 else "rewritten")


def test_hta_layout_adds_a_rank_to_a_trace_without_distributed_info(tmp_path: Path) -> None:
    source = tmp_path / "save"
    source.mkdir()
    _engine_trace(source / "rank3.1700000000.pt.trace.json.gz", distributed_rank=None)  # vLLM: rank from the name
    plain = source / "rank2.1700000001.pt.trace.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 0}]}))
    export = layout.export_layout(source, tmp_path / "hta", "hta")
    assert export.skipped == () and {f.how for f in export.files} == {"rewritten"}
    folder = tmp_path / "hta" / "rollout" / "engine" / "no-step"
    assert _hta_rank(folder / "rank-3.json.gz") == 3 and _hta_rank(folder / "rank-2.json") == 2
    assert json.loads((folder / "rank-2.json").read_text())["traceEvents"][0]["name"] == "k"
    assert plain.read_text().count("distributedInfo") == 0  # the original is untouched


# --------------------------------------------------------------------------- selection, duplicates, damage


def test_filters_select_what_is_exported(save_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tb"
    args = [str(save_path), "--layout", "tensorboard", str(out), "--ranks", "0,2", "--steps", "2"]
    rc, stdout, _ = _cli([*args, "--stage", "update_actor", "--json"], capsys)
    data = json.loads(stdout)
    assert rc == 0
    assert data["folders"] == ["actor/update-actor/step2_mb1-2"]
    assert sorted(Path(f["target"]).name.split(".")[0] for f in data["files"]) == ["rank0", "rank2"]


def _plain_torch_set(directory: Path, steps: tuple[int, ...] = (3, 4, 5)) -> Path:
    """One plain torch.profiler trace per rank (torch's default name), its steps and stages inside it."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        events = []
        for step in steps:
            t = 1_000_000.0 * step
            events += [
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": 9e5,
                },
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "update_actor",
                    "pid": 1,
                    "tid": 1,
                    "ts": t + 10,
                    "dur": 5e5,
                },
            ]
        info = {"backend": "gloo", "rank": rank, "world_size": WORLD}
        (directory / f"host_{rank}.176400000000{rank}.pt.trace.json").write_text(
            json.dumps({"distributedInfo": info, "traceEvents": events})
        )
    return directory


class _Reads:
    """The files an analysis reads (its ReadProgress)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def begin(self, files: int, total_bytes: int) -> None:
        pass

    def file_done(self, path: str, size: int, seconds: float) -> None:
        self.paths.append(path)


def test_steps_inside_a_plain_trace_are_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the bug: "--layout hta OUT --steps 4" wrote "0 files in 0 folders" where "--steps 4" alone finds step 4
    source = _plain_torch_set(tmp_path / "plain")
    rc, out, err = _cli([str(source), "--json", "--no-png", "--steps", "4"], capsys)
    assert rc == 0 and [s["step"] for s in json.loads(out)["stages"]] == [4]
    rc, out, err = _cli([str(source), "--layout", "hta", str(tmp_path / "hta"), "--steps", "4"], capsys)
    assert rc == 0, err
    assert f"{WORLD} files in 1 folders" in out and "unknown/trace/no-step" in out


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"steps": [4]},
        {"steps": [2]},
        {"steps": [0]},
        {"ranks": [1]},
        {"stages": ["update_actor"]},
        {"stages": ["generate-sequences"], "steps": [1, 2], "ranks": [0, 2]},
    ],
    ids=repr,
)
def test_the_export_keeps_what_the_analysis_reads(save_path: Path, tmp_path: Path, filters: dict[str, Any]) -> None:
    source = tmp_path / "both"
    shutil.copytree(save_path, source)  # the SDK's discrete traces, with their manifests
    _plain_torch_set(source)  # and plain torch traces whose steps and stages lie inside
    reads = _Reads()
    instrument.analyze.analyze(source, jobs=1, progress=reads, **filters)
    done = layout.export_layout(source, tmp_path / "out", "hta", **filters)
    assert done.skipped == ()
    assert sorted(f.source for f in done.files) == sorted(reads.paths)
    assert reads.paths  # every filter here keeps some file


def test_duplicates_and_damaged_entries_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "save"
    source.mkdir()
    _engine_trace(source / "a_rank1.1.pt.trace.json.gz", distributed_rank=1)
    _engine_trace(source / "b_rank1.2.pt.trace.json.gz", distributed_rank=1)  # same folder and rank
    os.mkfifo(source / "fifo.pt.trace.json.gz")  # never opened: it would block
    (source / "junk.json").write_text("not json")
    out = tmp_path / "tb"
    rc, stdout, err = _cli([str(source), "--layout", "tensorboard", str(out)], capsys)
    assert rc == 1 and "1 files in 1 folders" in stdout
    lines = err.splitlines()
    assert len(lines) == 3 and all(line.startswith("instrument analyze: not exported ") for line in lines)
    assert "b_rank1.2.pt.trace.json.gz: duplicate: rollout/engine/no-step already has rank1" in err
    assert "fifo.pt.trace.json.gz: not a regular file" in err and "junk.json: not JSON" in err


# --------------------------------------------------------------------------- OUT: never outside, never over


@pytest.mark.parametrize("kind", ["inside", "non-empty", "symlink", "file"])
def test_a_bad_out_is_refused_before_anything_is_written(
    save_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    if kind == "inside":
        out = save_path / "export"
    elif kind == "non-empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif kind == "symlink":
        out.symlink_to(elsewhere)
    else:
        out.write_text("mine")
    before = sorted(p.name for p in save_path.iterdir())
    rc, stdout, err = _cli([str(save_path), "--layout", "hta", str(out)], capsys)
    assert rc == 2 and stdout == "" and err.startswith("instrument analyze: error: OUT ") and err.count("\n") == 1
    assert sorted(p.name for p in save_path.iterdir()) == before
    assert list(elsewhere.iterdir()) == []
    if kind == "non-empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_bad_layout_arguments_exit_2(save_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli([str(save_path), "--layout", "perfetto", str(tmp_path / "o")], capsys)
    assert rc == 2 and "layout must be one of hta, tensorboard (got 'perfetto')" in err
    rc, _, err = _cli([str(save_path), "--layout", "hta", str(tmp_path / "o"), "--html", "x.html"], capsys)
    assert rc == 2 and "--layout writes no analysis" in err
    assert not (tmp_path / "o").exists()


def test_names_taken_meanwhile_are_never_followed_or_overwritten(tmp_path: Path) -> None:
    """A folder or file name planted in OUT while the export runs (a symlink to elsewhere) is refused."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    source = tmp_path / "src.json"
    source.write_text('{"traceEvents": []}')
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").symlink_to(victim)
    tree = FolderTree(out)
    try:
        with pytest.raises(FileExistsError):
            tree.folder("a/b")  # never mkdir through the planted link
        folder = tree.folder("c")
        os.symlink(victim / "precious", "rank-0.json", dir_fd=folder)
        for place in (layout._place, layout._copy):
            with pytest.raises(FileExistsError):
                place(str(source), "rank-0.json", folder)
        with pytest.raises(FileExistsError):
            layout._rewrite(str(source), "rank-0.json", folder, 3)
    finally:
        tree.close()
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert (victim / "precious").read_text() == "keep"


def test_a_symlinked_trace_is_linked_as_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "trace.json.gz"
    real.parent.mkdir()
    _engine_trace(real, distributed_rank=0)
    source = tmp_path / "save"
    source.mkdir()
    (source / "rank0.5.pt.trace.json.gz").symlink_to(real)
    export = layout.export_layout(source, tmp_path / "tb", "tensorboard")
    target = tmp_path / "tb" / export.files[0].target
    assert export.files[0].how == "link" and not target.is_symlink() and os.path.samefile(target, real)


def test_across_filesystems_a_symlink_else_a_copy(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to make a hard link fail")
    source = tmp_path / "save"
    source.mkdir()
    _engine_trace(source / "rank1.5.pt.trace.json.gz", distributed_rank=1)
    out = Path(tempfile.mkdtemp(dir=shm)) / "tb"
    try:
        export = layout.export_layout(source, out, "tensorboard")
        target = out / export.files[0].target
        assert export.files[0].how == "symlink" and target.is_symlink()
        assert os.readlink(target) == str((source / "rank1.5.pt.trace.json.gz").resolve())
        folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            layout._copy(str(source / "rank1.5.pt.trace.json.gz"), "copied.json.gz", folder)
        finally:
            os.close(folder)
        assert (target.parent / "copied.json.gz").read_bytes() == (source / "rank1.5.pt.trace.json.gz").read_bytes()
    finally:
        shutil.rmtree(out.parent)


def test_a_trace_swapped_for_a_fifo_is_not_linked_into_out(tmp_path: Path) -> None:
    """Listed as a regular file, then replaced by a FIFO before it is linked: the link is undone."""
    fifo = tmp_path / "rank0.1.pt.trace.json.gz"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    folder = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(TraceError, match="not a regular file"):
            layout._place(str(fifo), "rank-0.json.gz", folder)
    finally:
        os.close(folder)
    assert list(out.iterdir()) == []


def test_a_vllm_frontend_trace_is_a_replica_worker_for_tensorboard_and_left_out_of_hta(tmp_path: Path) -> None:
    source = tmp_path / "save"
    source.mkdir()
    _engine_trace(source / "rollout_frontend_step2_replica1_h_7.async_llm.1.pt.trace.json.gz", distributed_rank=None)
    export = layout.export_layout(source, tmp_path / "tb", "tensorboard")
    assert [Path(f.target).parent.as_posix() for f in export.files] == ["rollout/frontend/step2"]
    assert Path(export.files[0].target).name.startswith("replica1.")
    export = layout.export_layout(source, tmp_path / "hta", "hta")
    assert export.files == () and "no rank: a vLLM frontend trace" in export.skipped[0].reason


def test_many_folders_with_few_descriptors(save_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with thousands of folders must not run out of descriptors: folders reopen safely."""
    monkeypatch.setattr(layout, "MAX_OPEN_FOLDERS", 2)
    export = layout.export_layout(save_path, tmp_path / "tb", "tensorboard")
    assert export.skipped == () and len(export.files) == WORLD * STEPS * 2
    assert export.folders == tuple(sorted(_EXPECTED_FOLDERS))
    assert [Path(f.target).name.split(".")[0] for f in export.files[:WORLD]] == [f"rank{r}" for r in range(WORLD)]


_FEW_FDS = """
import resource, sys
from instrument.analyze._layout import export_layout
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
export = export_layout(sys.argv[1], sys.argv[2], "tensorboard")
print(len(export.files), len(export.skipped), export.skipped[:1])
"""


def test_more_folders_than_the_descriptor_limit(tmp_path: Path) -> None:
    """200 step folders under a limit of 64 open files: every one is written."""
    source = tmp_path / "save"
    source.mkdir()
    body = gzip.compress(b'{"distributedInfo": {"rank": 0}, "traceEvents": []}')
    for step in range(1, 201):
        (source / f"actor_stage_step{step}_rank0-of-1_h_pid1_1.pt.trace.json.gz").write_bytes(body)
    done = subprocess.run(
        [sys.executable, "-c", _FEW_FDS, str(source), str(tmp_path / "tb")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "200 0 ()"), done.stderr[-2000:]


@pytest.mark.parametrize("label", ["..", ".", "", "a/../../b", "/etc", "\x1b[31mred", "x" * 300])
def test_hostile_labels_make_one_safe_folder_name(label: str) -> None:
    trace = TraceFile(path="p", role=label, stage=label, step=1, rank=0, world_size=1)
    parts = layout.folder_of(trace).split("/")
    assert len(parts) == 3 and parts[2] == "step1"
    for part in parts[:2]:
        assert part not in ("", ".", "..") and re.fullmatch(r"[A-Za-z0-9.=+-]{1,40}", part), part
