"""A new recorder is one module plus one registration: :class:`StageFiles` below, registered through the public
API alone (``instrument.recorders.register``) or found as an entry point of group ``instrument.recorders``
(a real ``*.dist-info`` on ``sys.path``, read by the real ``importlib.metadata``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import instrument as ins
from instrument import _tools, recorders
from instrument._warnings import WarnOnce
from instrument.manifest import TraceRecord, read_manifests
from instrument.recorders import FastRange, FastRanges, FastScope, Publish, Report, TraceSpec
from tests.conftest import without_timeline

GUARD_S = 120.0  # only ever hit when something hangs


class StageFiles:
    """The whole recorder: one small JSON file per trace (a stage, or a continuous step) with its ranges."""

    tool = "stage_files"
    stage_range_in_windows = True

    def __init__(self, publish: Publish, report: Report) -> None:
        self._publish = publish
        self._spec: TraceSpec | None = None
        self._ranges: list[str] = []
        self.windows_saved = 0

    @property
    def tracing(self) -> bool:
        return self._spec is not None

    def on_step(self, role: str, step: int) -> None:
        pass

    def start(self, spec: TraceSpec) -> None:
        self._spec, self._ranges, self.windows_saved = spec, [], 0

    def window_step(self) -> None:
        pass

    def enter_range(self, name: str, *, concurrent: bool = False) -> Callable[[], None]:
        self._ranges.append(name)
        return lambda: None

    def stop(self) -> None:
        spec = self._spec
        if spec is None:
            return
        self._spec, self.windows_saved = None, 1
        name = f"{spec.prefix()}.stage.json"
        path = Path(spec.save_path) / name
        path.write_text(json.dumps(self._ranges))
        self._publish(TraceRecord(**spec.identity_fields(), path=name, bytes=path.stat().st_size, tool=self.tool))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.stop()


class FastStageFiles(StageFiles):
    """The same, offering the per-call fast path in continuous mode: later calls of a stage open its range alone."""

    def __init__(self, publish: Publish, report: Report) -> None:
        super().__init__(publish, report)
        self.fast_calls: list[str] = []

    def fast_ranges(self, *, discrete: bool) -> FastScope | None:
        return None if discrete else "any thread"

    def fast_range(self, name: str, *, discrete: bool) -> FastRange | None:
        return (self.fast_calls.append, name, lambda: self.fast_calls.append("exit"))


@pytest.fixture(autouse=True)
def _registry_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry is process-wide: each test leaves it as it found it (the only use of its private names here)."""
    monkeypatch.setattr(_tools, "_REGISTRY", dict(_tools._REGISTRY))
    monkeypatch.setattr(_tools, "_broken", set())
    monkeypatch.setattr(_tools, "_warn", WarnOnce(_tools.logger))
    yield


def _train(save: Path, tool: str) -> list[str]:
    """The recorders' files of a two-step run (its step timeline left out)."""
    ins.configure(
        ins.ProfilerConfig(tool=tool, save_path=str(save), steps=(2,), contents=("cpu",)),
        role="actor",
        rank=0,
        world_size=1,
    )

    @ins.profiled_stage("compute_log_prob")
    def log_prob() -> None:
        pass

    for step in (1, 2):
        with ins.profile_step(step):
            log_prob()
            with ins.profiled_stage("update_actor"), ins.profile_window(mini_batch=0):
                pass
    return without_timeline(ins.finish())


def test_a_registered_recorder_writes_its_files_and_the_manifest_lists_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'stage_files'"):
        ins.ProfilerConfig(tool="stage_files")  # not registered yet
    recorders.register("stage_files", StageFiles)
    assert "stage_files" in recorders.registered_tools()
    files = sorted(Path(f).name for f in _train(tmp_path, "stage_files"))
    assert [name.split("_step")[0] for name in files] == ["actor_compute-log-prob", "actor_update-actor"]
    assert all(name.endswith(".stage.json") and "_step2_rank0-of-1" in name for name in files)
    update = next(tmp_path.glob("actor_update-actor_*.stage.json"))
    assert json.loads(update.read_text()) == ["update_actor", "mini_batch0"]
    assert sorted((r.stage, r.tool) for r in without_timeline(read_manifests(tmp_path))) == [
        ("compute_log_prob", "stage_files"),
        ("update_actor", "stage_files"),
    ]


def test_beside_torch_each_recorder_writes_its_own_files(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    recorders.register("stage_files", StageFiles)
    files = [Path(f).name for f in _train(tmp_path, "torch+stage_files")]
    assert sorted(n.split("_step")[0] for n in files if n.endswith(".pt.trace.json.gz")) == [
        "actor_compute-log-prob",
        "actor_update-actor",
    ]
    assert len([n for n in files if n.endswith(".stage.json")]) == 2
    by_tool = sorted((r.tool, r.stage) for r in without_timeline(read_manifests(tmp_path)))
    assert by_tool == [
        ("stage_files", "compute_log_prob"),
        ("stage_files", "update_actor"),
        ("torch", "compute_log_prob"),
        ("torch", "update_actor"),
    ]


def test_a_recorder_may_offer_the_per_call_fast_path(tmp_path: Path) -> None:
    assert isinstance(FastStageFiles(lambda record: None, lambda what, exc: None), FastRanges)
    assert not isinstance(StageFiles(lambda record: None, lambda what, exc: None), FastRanges)
    built: list[FastStageFiles] = []

    def factory(publish: Publish, report: Report) -> FastStageFiles:
        built.append(FastStageFiles(publish, report))
        return built[-1]

    recorders.register("stage_files", factory)
    ins.configure(
        ins.ProfilerConfig(tool="stage_files", save_path=str(tmp_path), steps=(1,), discrete=False),
        role="a",
        rank=0,
        world_size=1,
    )

    @ins.profiled_stage("generate")
    def generate() -> None:
        pass

    with ins.profile_step(1):
        for _ in range(3):
            generate()  # the first through the session, the next two by (enter, arg, exit)
    (path,) = without_timeline(ins.finish())
    assert built[0].fast_calls == ["generate", "exit", "generate", "exit"]
    assert json.loads(Path(path).read_text()) == ["generate"]  # the one range the session opened


# --------------------------------------------------------------------------- entry points


def _distribution(site: Path, entry_points: str) -> Path:
    """A minimal installed distribution in ``site``: METADATA and ``entry_points.txt``, as pip leaves them."""
    info = site / "instrument_plugin_example-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: instrument-plugin-example\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return site


ENTRY_POINTS = f"""
    [instrument.recorders]
    stage_files_ep = {__name__}:StageFiles
    broken_ep = tests.recorders.no_such_module:Recorder
    """


def test_an_entry_point_recorder_is_found_when_its_name_is_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_distribution(tmp_path / "site", ENTRY_POINTS)))
    assert {"stage_files_ep", "broken_ep"} <= set(recorders.registered_tools())  # listed, not loaded
    assert "stage_files_ep" not in _tools._REGISTRY
    files = _train(tmp_path / "profile", "stage_files_ep")
    assert recorders.recorder_class("stage_files_ep") is StageFiles
    assert len(files) == 2
    assert {r.tool for r in without_timeline(read_manifests(tmp_path / "profile"))} == {"stage_files"}


def test_a_bad_entry_point_warns_once_and_stays_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(_distribution(tmp_path / "site", ENTRY_POINTS)))
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for _ in range(2):
            with pytest.raises(ValueError, match="'broken_ep'"):
                ins.ProfilerConfig(tool="broken_ep")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("instrument: recorder entry point 'broken_ep' (tests.recorders.no_such_module:Recorder)")
    assert "ModuleNotFoundError" in warning and "skipped" in warning
    assert "broken_ep" not in recorders.registered_tools()
    assert ins.ProfilerConfig(tool="torch+stage_files_ep").tool == "torch+stage_files_ep"  # the good one still loads


def test_import_instrument_loads_no_entry_point(tmp_path: Path) -> None:
    site = _distribution(tmp_path / "site", "[instrument.recorders]\nbroken_ep = no_such_module:Recorder\n")
    code = "import instrument, instrument.recorders as r; print(','.join(r.registered_tools()))"
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{site}:{root}", "PATH": "/usr/bin:/bin"},
        timeout=GUARD_S,
        check=True,
    )
    assert done.stdout.strip() == "broken_ep,nvtx,torch,torch_memory"
    assert done.stderr == ""
