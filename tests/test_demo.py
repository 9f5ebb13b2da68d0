"""``make demo`` (``examples/ppo_demo_multi.py``: four gloo ranks, a planted straggler, what the analysis says of it)
and the one-process ``examples/ppo_demo.py``: runs, profiles exactly the configured steps, archives the traces."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import re
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:  # the examples import each other as top-level modules, as when run as scripts
    sys.path.insert(0, str(EXAMPLES))

import ppo_demo  # noqa: E402
import ppo_demo_multi  # noqa: E402
import torch  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from ppo_demo import ARCHIVE_NAME, DEFAULT_CONFIG, DemoResult, run_demo  # noqa: E402
from ppo_demo_multi import ACTOR, ROLLOUT, SLOW_RANK, WORLD_SIZE, BestOfN  # noqa: E402
from ppo_workers import NUM_MINI_BATCHES, PROMPT_LEN, RESPONSE_LEN, VOCAB, init_models, scores  # noqa: E402

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


SINGLE_PLAN = [
    *("plan", "--config", str(CONFIG), "--num-steps", "4", "--mini-batches", "6", "--role", "actor_rollout_ref"),
    *("--stage", "generate_sequences", "--stage", "compute_log_prob", "--stage", "compute_ref_log_prob"),
    *("--stage", "critic:compute_values", "--stage", "critic:update_critic:scheduled"),
    *("--stage", "update_actor:scheduled"),
]
"""``instrument plan`` for the one-process demo: its role and its stages, each under its own role."""

PLAN_SUFFIX = "_{host}_pid{pid}_{timestamp}" + TRACE_SUFFIX


def _without_host_pid_and_time(name: str) -> str:
    return re.sub(r"_[^_]+_pid\d+_\d+" + re.escape(TRACE_SUFFIX) + "$", "", name)


def _planned(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The file names ``instrument plan ARGUMENTS`` lists, without their host, pid and time."""
    capsys.readouterr()
    assert main([*arguments, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["counts"]["files"] == len(planned["files"])  # every name is listed
    assert all(f.endswith(PLAN_SUFFIX) for f in planned["files"])
    return [f.removesuffix(PLAN_SUFFIX) for f in planned["files"]]


def test_the_plan_lists_exactly_the_files_the_demo_writes(
    demo: tuple[DemoResult, str], capsys: pytest.CaptureFixture[str]
) -> None:
    result, _ = demo
    assert any(a.startswith("critic:") for a in SINGLE_PLAN)  # stages named after their own role
    written = sorted(_without_host_pid_and_time(p.name) for p in _trace_files(result.save_path))
    assert written == sorted(_planned(SINGLE_PLAN, capsys))


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


# --------------------------------------------------------------------------- make demo: four gloo processes

ROOT = EXAMPLES.parent
ACTOR_RANKS = tuple(r for r in range(WORLD_SIZE) if ppo_demo_multi.role_of(r) == ACTOR)
GENERATE = {"role": ROLLOUT, "stage": "generate_sequences", "rank": SLOW_RANK}
"""The planted straggler, as the analysis' --json names a stage on a rank."""


def _make_demo_command() -> list[str]:
    """The ``python`` line of ``make demo``, read from the Makefile, with this interpreter and absolute paths."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    (line,) = [row for row in recipe.splitlines() if "$(BIN)/python " in row]
    words = shlex.split(line)
    assert words[0] == "$(BIN)/python"
    return [sys.executable, *(str(ROOT / w) if (ROOT / w).is_file() else w for w in words[1:])]


@dataclass(frozen=True)
class MultiRun:
    """``make demo``'s run, in a temporary folder, and ``instrument analyze --json`` of it."""

    done: subprocess.CompletedProcess[str]
    save_path: Path
    report: dict[str, Any]

    def steps(self) -> list[dict[str, Any]]:
        """The timeline's steps."""
        return list(self.report["timeline"]["steps"])

    def traced_steps(self) -> set[int]:
        """The steps some rank traced (their profiler start and export is on the step)."""
        return {n.step for p in _trace_files(self.save_path) if (n := parse_trace_name(p.name)) is not None}


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> MultiRun:
    """``make demo`` as the Makefile runs it (4 processes, 8 steps), its save_path in a temporary folder."""
    where = tmp_path_factory.mktemp("demo-multi")
    save_path = where / "profile"
    command = [*_make_demo_command(), f"save_path={save_path}"]
    done = subprocess.run(command, cwd=where, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    analyse = [sys.executable, "-m", "instrument.cli", "analyze", str(save_path), "--json"]
    analysed = subprocess.run(analyse, cwd=where, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert analysed.returncode == 0, analysed.stderr
    return MultiRun(done, save_path, json.loads(analysed.stdout))


def _waits(ranks: list[dict[str, Any]], rank: int) -> dict[tuple[Any, Any, Any], float]:
    (lane,) = [r for r in ranks if r["rank"] == rank]
    return {(w["role"], w["stage"], w["rank"]): w["ms"] for w in lane["waited_for"]}


def _key(part: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (part["role"], part["stage"], part["rank"])


@pytest.mark.slow  # four processes importing torch, 8 steps: ~30 s on 2 busy cores
def test_make_demo_runs_four_ranks_into_one_save_path_and_the_hook_once(
    multi: MultiRun, capsys: pytest.CaptureFixture[str]
) -> None:
    out = multi.done.stdout
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == [f"{s}/8" for s in range(1, 9)]
    assert "ranks     all 4 ended with the actor's weights" in out  # the weight sync reached the rollout ranks
    manifests = sorted(multi.save_path.glob("instrument-manifest-*.jsonl"))
    records = [json.loads(line) for m in manifests for line in m.read_text(encoding="utf-8").splitlines()]
    assert len(manifests) == WORLD_SIZE and len({r["run"] for r in records}) == 1  # four processes, one run
    timelines = {(r["role"], r["rank"], r["world"]) for r in records if r["tool"] == "timeline"}
    assert timelines == {(ppo_demo_multi.role_of(r), r, WORLD_SIZE) for r in range(WORLD_SIZE)}
    hook_ends = [line for line in multi.done.stderr.splitlines() if line.startswith("[hook rank") and " exit " in line]
    assert len(hook_ends) == 1 and hook_ends[0].startswith("[hook rank 0] exit 0 "), multi.done.stderr  # once
    with tarfile.open(multi.save_path.parent / ARCHIVE_NAME, "r:gz") as archive:
        members = {Path(m.name).name: m for m in archive.getmembers()}
        timelines_archived = {
            name: archive.extractfile(m).read()  # type: ignore[union-attr]
            for name, m in members.items()
            if name.endswith(".timeline.bin")
        }
    assert {p.name for p in _trace_files(multi.save_path)} <= set(members)  # the hook ran after every rank's traces
    slow = [p for p in _trace_files(multi.save_path) if "generate-sequences" in p.name]
    assert slow and all(f"_rank{SLOW_RANK}-of-4_" in p.name for p in slow)
    events = json.loads(gzip.decompress(slow[0].read_bytes()))["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)  # the planted work, in the slow rank's own trace
    # make demo traces its last step, so the hook runs after every process's last step: each timeline whole.
    on_disk = {p.name: p.read_bytes() for p in multi.save_path.glob("*.timeline.bin")}
    assert len(on_disk) == WORLD_SIZE and timelines_archived == on_disk
    # The traces are what `instrument plan` says each role's profiled rank writes under make demo's arguments.
    words = _make_demo_command()
    overrides = [w for w in words[2:] if "=" in w and not w.startswith("-")]
    assert "ranks=[0,3]" in overrides
    common = ["plan", "--config", str(CONFIG), "--num-steps", words[words.index("--num-steps") + 1]]
    common += ["--world-size", str(WORLD_SIZE), "--mini-batches", "6"]
    actor = [*common, "--role", ACTOR, "--stage", "compute_log_prob", "--stage", "compute_ref_log_prob"]
    actor += ["--stage", "critic:compute_values", "--stage", "critic:update_critic:scheduled"]
    actor += ["--stage", "update_actor:scheduled", *overrides, "ranks=[0]"]  # the last word wins
    rollout = [*common, "--role", ROLLOUT, "--stage", "generate_sequences", *overrides, f"ranks=[{SLOW_RANK}]"]
    written = sorted(_without_host_pid_and_time(p.name) for p in _trace_files(multi.save_path))
    assert written == sorted(_planned(actor, capsys) + _planned(rollout, capsys))


@pytest.mark.slow
def test_the_slow_rollout_rank_is_the_straggler_of_its_stage(multi: MultiRun) -> None:
    stragglers = [f for f in multi.report["findings"] if f["kind"] == "straggler"]
    named = [(f["role"], f["stage"], f["rank"]) for f in stragglers]
    assert (ROLLOUT, "generate_sequences", SLOW_RANK) in named, multi.report["findings"]
    assert [n for n in named if n[0] == ROLLOUT] == [(ROLLOUT, "generate_sequences", SLOW_RANK)]  # not rank 2
    (finding,) = [f for f in stragglers if f["rank"] == SLOW_RANK]
    assert f"rank {SLOW_RANK}" in finding["text"] and "actor ranks" in finding["text"]  # who waited for it


def _most_waited_for(steps: list[dict[str, Any]], rank: int) -> tuple[tuple[Any, Any, Any], dict[Any, float]]:
    """What ``rank`` waited for longest, summed over ``steps``, and every total."""
    total: dict[tuple[Any, Any, Any], float] = {}
    for step in steps:
        for key, ms in _waits(step["ranks"], rank).items():
            total[key] = total.get(key, 0.0) + ms
    return max(total, key=total.__getitem__), total


def _crosses_roles(step: dict[str, Any]) -> bool:
    """Whether the step's critical path runs through stages of both roles (idle and the SDK's own time aside)."""
    worked = [p for p in step["critical_path"] if p["stage"] != "idle" and not p["stage"].startswith("instrument:")]
    return {ROLLOUT, ACTOR} <= {p["role"] for p in worked}


@pytest.mark.slow
def test_the_actor_ranks_wait_for_the_slow_rank_on_untraced_steps(multi: MultiRun) -> None:
    """On the steps no rank traced, what each actor rank waited for longest is rank 3's rollout."""
    untraced = [s for s in multi.steps() if s["step"] not in multi.traced_steps()]
    assert len(untraced) >= 4
    for rank in ACTOR_RANKS:
        most, total = _most_waited_for(untraced, rank)
        assert most == _key(GENERATE), (rank, total)


@pytest.mark.slow
def test_the_critical_path_crosses_roles_on_untraced_steps(multi: MultiRun) -> None:
    """Most untraced steps' critical paths run through rank 3's rollout and an actor stage.

    Most, not all: on a loaded machine a rank can resume later than the hand-off tolerance after the stage it
    waited for (the scheduler did not run it), and that gap is then the path's unattributed idle.
    """
    untraced = [s for s in multi.steps() if s["step"] not in multi.traced_steps()]
    crossing = [_crosses_roles(s) and any(_key(p) == _key(GENERATE) for p in s["critical_path"]) for s in untraced]
    assert sum(crossing) > len(untraced) / 2, [s["critical_path"] for s in untraced]


@pytest.mark.slow
def test_the_straggler_is_the_first_finding(multi: MultiRun) -> None:
    """Causes before effects: the straggler's finding comes before the idle it causes (issue 32 item 2)."""
    first = multi.report["findings"][0]
    assert (first["kind"], first["role"], first["stage"], first["rank"]) == (
        "straggler",
        ROLLOUT,
        "generate_sequences",
        SLOW_RANK,
    ), multi.report["findings"]


@pytest.mark.slow
def test_the_actor_ranks_wait_for_the_slow_rank_over_every_step(multi: MultiRun) -> None:
    """Traced steps too: of the user's stages, rank 3's rollout is what the actor ranks waited for longest.

    On a traced step they also wait for rank 3's profiler to stop and export: that is instrument's own time
    (``instrument:`` spans), the finding on traced steps reports it, and it is left out here.
    """
    assert multi.traced_steps() == {2, 8}
    for rank in ACTOR_RANKS:
        _, total = _most_waited_for(multi.steps(), rank)
        users = {k: ms for k, ms in total.items() if not str(k[1]).startswith("instrument:")}
        assert max(users, key=users.__getitem__) == _key(GENERATE), (rank, total)


@pytest.mark.slow
def test_the_critical_path_crosses_roles_on_traced_steps(multi: MultiRun) -> None:
    """A traced step's path runs through both roles' stages as well, the profiler's own time its own part."""
    traced = [s for s in multi.steps() if s["step"] in multi.traced_steps()]
    assert traced and all(_crosses_roles(step) for step in traced), [s["critical_path"] for s in traced]
    kinds = {f["kind"] for f in multi.report["findings"]}
    assert "instrument" in kinds, multi.report["findings"]  # the traced steps' profiler time, said as such


# ------------------------------------------------------------------ the multi-process demo's parts, in this process


def test_best_of_n_keeps_the_best_scoring_candidate_of_each_prompt() -> None:
    policy, _, _ = init_models(torch.Generator().manual_seed(0))
    prompts = torch.randint(0, VOCAB, (12, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    rollout = BestOfN(policy, torch.Generator().manual_seed(2))
    again = BestOfN(policy, torch.Generator().manual_seed(2))
    instrument.testing.reset()
    try:
        chosen = rollout.generate_sequences(prompts)
    finally:
        instrument.testing.reset()  # the stage ran before any configure(): nothing to name
    with torch.no_grad():
        candidates = torch.stack([again._sample(prompts) for _ in range(ppo_demo_multi.CANDIDATES)])
    assert chosen.shape == (12, PROMPT_LEN + RESPONSE_LEN) and torch.equal(chosen[:, :PROMPT_LEN], prompts)
    best = scores(candidates.flatten(0, 1)).view(ppo_demo_multi.CANDIDATES, -1).max(dim=0).values
    assert torch.equal(scores(chosen), best)
    assert all(any(torch.equal(chosen[i], c[i]) for c in candidates) for i in range(12))  # one of its own


def test_a_slowed_best_of_n_samples_the_same_and_adds_real_work() -> None:
    """The planted slowness changes no result; only ``aten::mm`` (which the policy's layers never call) is added."""
    from torch.profiler import ProfilerActivity, profile

    policy, _, _ = init_models(torch.Generator().manual_seed(0))
    prompts = torch.randint(0, VOCAB, (6, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    ops: list[set[str]] = []
    chosen: list[torch.Tensor] = []
    instrument.testing.reset()
    try:
        for factor in (1.0, 2.0):
            rollout = BestOfN(policy, torch.Generator().manual_seed(2), slow_factor=factor)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                chosen.append(rollout.generate_sequences(prompts))
            ops.append({e.key for e in prof.key_averages()})
    finally:
        instrument.testing.reset()
    assert torch.equal(chosen[0], chosen[1])
    assert "aten::mm" not in ops[0] and "aten::mm" in ops[1]


def test_the_roles_of_the_ranks() -> None:
    assert [ppo_demo_multi.role_of(r) for r in range(WORLD_SIZE)] == [ACTOR, ACTOR, ROLLOUT, ROLLOUT]
    assert ppo_demo_multi.role_of(SLOW_RANK) == ROLLOUT


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_slow_factor_is_a_finite_number_of_at_least_one(factor: float) -> None:
    if 1 <= factor < math.inf:
        assert ppo_demo_multi.check_slow_factor(factor) == factor
    else:
        with pytest.raises(ValueError, match=r"'slow_factor' must be a finite number >= 1 \(1: no straggler\)"):
            ppo_demo_multi.check_slow_factor(factor)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ranks=[4]"], "the demo has 4 ranks"),
        (["finish_hook.ranks=[9]"], "finish_hook.ranks"),
        (["--slow-factor", "0.5"], "'slow_factor' must be a finite number >= 1"),
        (["--num-steps", "0"], "'num_steps' must be an int >= 1: 0"),
    ],
)
def test_a_bad_multi_demo_argument_is_one_line_and_exit_2_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    status = ppo_demo_multi.main([*args, f"save_path={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("ppo_demo_multi.py: error: ")
    assert needle in err, err
    assert not (tmp_path / "out").exists()
