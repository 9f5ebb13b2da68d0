"""``examples/ppo_demo.py`` (``make demo``): runs, profiles exactly the configured steps, archives the traces."""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:  # the examples import each other as top-level modules, as when run as scripts
    sys.path.insert(0, str(EXAMPLES))

import ppo_demo  # noqa: E402
from ppo_demo import ARCHIVE_NAME, DEFAULT_CONFIG, DemoResult, run_demo  # noqa: E402
from ppo_workers import NUM_MINI_BATCHES  # noqa: E402

import instrument.testing  # noqa: E402
from instrument import schedule  # noqa: E402
from instrument.cli import load_config, main  # noqa: E402
from instrument.config import ProfilerConfig  # noqa: E402
from instrument.naming import SCRATCH_PREFIX, TRACE_SUFFIX, parse_trace_name  # noqa: E402
from tests.conftest import without_timeline  # noqa: E402

CONFIG = EXAMPLES / "demo.yaml"
STAGES = {"generate-sequences", "compute-log-prob", "compute-ref-log-prob", "compute-values"}
UPDATES = {"update-actor", "update-critic"}
HANG_GUARD_S = 300  # only against a hang: the assertions are about output


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, str]:
    """One demo run of 4 steps (steps 2 and 4 profiled), shared by the tests that read its results."""
    save_path = tmp_path_factory.mktemp("demo") / "profile"
    out = io.StringIO()
    instrument.testing.reset()
    try:
        result = run_demo(CONFIG, num_steps=4, overrides=[f"save_path={save_path}"], out=out)
    finally:
        instrument.testing.reset()
    return result, out.getvalue()


def _trace_files(save_path: Path) -> list[Path]:
    return sorted(save_path.glob(f"*{TRACE_SUFFIX}"))


def test_demo_config_records_mini_batches_2_to_3() -> None:
    cfg = ProfilerConfig.from_file(CONFIG)
    assert cfg == load_config(CONFIG)  # the command line reads files the same way
    assert cfg.tool == "torch" and cfg.discrete and cfg.steps == (2, 4)
    assert cfg.schedule is not None
    windows = schedule.plan(NUM_MINI_BATCHES, cfg.schedule)
    assert [(w.first, w.last, w.partial) for w in windows] == [(2, 3, False)]
    assert cfg.finish_hook is not None and ARCHIVE_NAME in cfg.finish_hook.cmd
    assert DEFAULT_CONFIG == CONFIG  # found beside the script, from any working directory


def test_traces_only_for_profiled_steps_with_stage_names(demo: tuple[DemoResult, str]) -> None:
    result, _ = demo
    assert result.profiled_steps == (2, 4)
    on_disk = _trace_files(result.save_path)
    assert sorted(result.traces) == on_disk
    names = [parse_trace_name(p.name) for p in on_disk]
    assert all(n is not None for n in names), [p.name for p in on_disk]
    seen = {(n.step, n.stage, n.window) for n in names if n is not None}
    expected: set[tuple[int, str, tuple[int, int] | None]] = {(s, stage, None) for s in (2, 4) for stage in STAGES}
    expected |= {(s, stage, (2, 3)) for s in (2, 4) for stage in UPDATES}
    assert seen == expected
    assert len(on_disk) == len(expected)  # one trace per stage and profiled step, no more
    assert all(n is not None and (n.rank, n.world_size, n.partial) == (0, 1, False) for n in names)
    critic = {"compute-values", "update-critic"}  # the critic's stages carry its role, as in verl's worker groups
    assert {(n.stage in critic, n.role) for n in names if n is not None} == {
        (False, "actor-rollout-ref"),
        (True, "critic"),
    }
    assert any("update-actor" in p.name and "_mb2-3_" in p.name for p in on_disk)


def test_traces_are_gzipped_chrome_traces(demo: tuple[DemoResult, str]) -> None:
    import gzip

    result, _ = demo
    trace = next(p for p in result.traces if "update-actor" in p.name)
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)


def test_manifest_lists_every_trace(demo: tuple[DemoResult, str]) -> None:
    result, _ = demo
    assert result.manifest is not None
    assert result.manifest.parent == result.save_path
    assert result.manifest.name.startswith("instrument-manifest-") and result.manifest.suffix == ".jsonl"
    records = [json.loads(line) for line in result.manifest.read_text(encoding="utf-8").splitlines()]
    records = without_timeline(records)  # the step timeline is listed too; this is about the traces
    assert {Path(r["path"]).name for r in records} == {p.name for p in result.traces}
    assert {(r["stage"], r["role"]) for r in records if r["role"] == "critic"} == {
        ("compute_values", "critic"),
        ("update_critic", "critic"),
    }
    assert {r["role"] for r in records} == {"actor_rollout_ref", "critic"}


def test_finish_hook_archives_the_traces(demo: tuple[DemoResult, str]) -> None:
    result, _ = demo
    assert result.archive == result.save_path.parent / ARCHIVE_NAME
    with tarfile.open(result.archive, "r:gz") as archive:
        members = {Path(name).name for name in archive.getnames()}
    assert {p.name for p in result.traces} <= members
    assert result.manifest is not None and result.manifest.name in members
    assert not [m for m in members if m.startswith(SCRATCH_PREFIX)]  # no empty scratch folder (issue 27)


def _make_demo_plan_arguments() -> list[str]:
    """The arguments of ``make demo``'s ``instrument plan`` line, read from the Makefile itself."""
    text = (EXAMPLES.parent / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    (line,) = [row for row in recipe.splitlines() if "instrument plan" in row]
    words = shlex.split(line)
    return words[words.index("plan") :]


def _without_host_pid_and_time(name: str) -> str:
    return re.sub(r"_[^_]+_pid\d+_\d+" + re.escape(TRACE_SUFFIX) + "$", "", name)


def test_make_demos_plan_lists_exactly_the_files_the_demo_writes(
    demo: tuple[DemoResult, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = demo
    arguments = _make_demo_plan_arguments()
    monkeypatch.chdir(EXAMPLES.parent)  # make runs it from the checkout's root
    assert any(a.startswith("critic:") for a in arguments)  # stages named after their own role
    capsys.readouterr()
    assert main([*arguments, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["counts"]["files"] == len(planned["files"])  # every name is listed
    suffix = "_{host}_pid{pid}_{timestamp}" + TRACE_SUFFIX
    assert all(f.endswith(suffix) for f in planned["files"])
    expected = sorted(f.removesuffix(suffix) for f in planned["files"])
    written = sorted(_without_host_pid_and_time(p.name) for p in _trace_files(result.save_path))
    assert written == expected


def test_rewards_are_finite_and_learning(demo: tuple[DemoResult, str]) -> None:
    result, _ = demo
    assert len(result.rewards) == 4
    assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in result.rewards)
    assert result.rewards[-1] > result.rewards[0]


def test_output_has_a_line_per_step_and_names_the_paths(demo: tuple[DemoResult, str]) -> None:
    result, text = demo
    step_lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert [line.endswith("profiled") for line in step_lines] == [False, True, False, True]
    assert str(result.save_path) in text
    assert result.manifest is not None and str(result.manifest) in text
    assert result.archive is not None and str(result.archive) in text
    assert all(p.name in text for p in result.traces)


def test_disabled_profiling_is_deterministic_and_writes_nothing(tmp_path: Path) -> None:
    save_path = tmp_path / "profile"
    runs = []
    for _ in range(2):
        out = io.StringIO()
        runs.append(run_demo(CONFIG, num_steps=2, overrides=[f"save_path={save_path}", "enable=false"], out=out))
        instrument.testing.reset()
        assert "profiling: off" in out.getvalue()
    assert runs[0].rewards == runs[1].rewards
    assert runs[0].files == () and runs[0].profiled_steps == () and runs[0].archive is None
    assert not save_path.exists()


def test_steps_beyond_the_run_are_named(tmp_path: Path) -> None:
    out = io.StringIO()
    result = run_demo(CONFIG, num_steps=1, overrides=[f"save_path={tmp_path / 'p'}", "steps=[3]"], out=out)
    assert result.profiled_steps == () and result.traces == ()
    assert "step(s) 3 lie beyond step 1" in out.getvalue()


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_step_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="num_steps"):
        run_demo(CONFIG, num_steps=bad, out=io.StringIO())  # type: ignore[arg-type]


@pytest.mark.slow  # a fresh interpreter importing torch: ~5 s
def test_the_script_runs_from_another_directory(tmp_path: Path) -> None:
    """``python examples/ppo_demo.py``, as ``make demo`` runs it, in a child process started elsewhere."""
    save_path = tmp_path / "profile"
    script = EXAMPLES / "ppo_demo.py"
    args = ["--num-steps", "2", "--seed", "3", f"save_path={save_path}"]
    command = [sys.executable, str(script), *args]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "step 2/2" in done.stdout and "profiled" in done.stdout
    assert "USDT:" not in done.stderr  # the torch recorder keeps kineto quiet: the demo filters nothing
    assert {parse_trace_name(p.name).step for p in _trace_files(save_path)} == {2}  # type: ignore[union-attr]
    assert (tmp_path / ARCHIVE_NAME).is_file()


def test_command_line_defaults() -> None:
    parser = argparse.ArgumentParser()
    ppo_demo.add_arguments(parser)
    defaults = parser.parse_args([])
    assert (Path(defaults.config), defaults.num_steps, defaults.seed, defaults.overrides) == (CONFIG, 4, 0, [])
    args = parser.parse_args(["--config", "x.yaml", "--num-steps", "2", "--seed", "3", "steps=[1]"])
    assert (args.config, args.num_steps, args.seed, args.overrides) == ("x.yaml", 2, 3, ["steps=[1]"])


@pytest.mark.parametrize(
    ("content", "args", "needles"),
    [
        ("steps: [1\n", [], ["broken.yaml", "invalid YAML at line 2"]),
        ("contents: [gpu]\n", [], ["broken.yaml: 'contents' items must be among"]),
        ("steps: [1]\n", ["--num-steps", "0"], ["'num_steps' must be an int >= 1: 0"]),
        ("steps: [1]\n", ["--slow-step", "0"], ["'slow_step' must be >= 1: 0"]),
        ("steps: [1]\n", ["--metrics-port", "70000"], ["'metrics_port' must be 0-65535: 70000"]),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, args: list[str], needles: list[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(content)
    status = ppo_demo.main([f"--config={path}", *args, f"save_path={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("ppo_demo.py: error: ")
    assert all(needle in err for needle in needles), err
    assert not (tmp_path / "out").exists()


def test_the_cli_has_no_demo_and_loads_no_torch() -> None:
    """The demos left the library: ``instrument demo`` is gone and the CLI imports no example or torch."""
    code = (
        "import sys, instrument.cli\n"
        "try:\n    instrument.cli.main(['demo'])\nexcept SystemExit as exc:\n    print(exc.code)\n"
        "print(sorted(m for m in sys.modules if m in ('torch', 'ppo_demo', 'ppo_workers') or 'demo' in m))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert done.stdout.splitlines() == ["2", "[]"], done.stderr
    assert "invalid choice: 'demo'" in done.stderr


def test_slow_step_flag_fires_the_trigger_and_lists_the_trace(tmp_path: Path) -> None:
    out = io.StringIO()
    result = run_demo(DEFAULT_CONFIG, num_steps=4, overrides=[f"save_path={tmp_path / 'p'}"], slow_step=5, out=out)
    triggered = [t.name for t in result.traces if "_trig_" in t.name]
    assert triggered and all("_step6_" in name for name in triggered)
    assert "profiled on demand (slow-step trigger)" in out.getvalue()
    assert any(name in out.getvalue() for name in triggered)
