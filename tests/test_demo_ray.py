"""``examples/ppo_demo_ray.py`` (``make demo-ray``): the PPO demo on a local Ray cluster, two groups of two ranks."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:  # the examples import each other as top-level modules, as when run as scripts
    sys.path.insert(0, str(EXAMPLES))

import ppo_demo_ray  # noqa: E402
from ppo_demo import ARCHIVE_NAME  # noqa: E402
from ppo_demo_ray import WORLD_SIZE, RayDemoResult, run_ray_demo  # noqa: E402
from ppo_ray_workers import ACTOR_ROLLOUT_REF, CRITIC  # noqa: E402

from instrument.config import ProfilerConfig  # noqa: E402
from instrument.integrations.ray import CONTROLLER_ROLE, WorkerFailure  # noqa: E402
from instrument.naming import TRACE_SUFFIX, parse_trace_name  # noqa: E402
from tests.conftest import without_timeline  # noqa: E402

CONFIG = EXAMPLES / "demo.yaml"
NUM_STEPS = 3
PROFILED = (2, 3)
STAGES = {
    "actor-rollout-ref": {"generate-sequences", "compute-log-prob", "compute-ref-log-prob", "update-actor"},
    "critic": {"compute-values", "update-critic"},
}
UPDATES = {"update-actor", "update-critic"}


@pytest.fixture(scope="module")
def ray_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[RayDemoResult, str, float, bool]:
    """One run of 3 steps, steps 2 and 3 profiled on every rank; Ray is started and stopped by the demo."""
    ray_was_up = ray.is_initialized()  # another test file's cluster: the demo runs on it and leaves it up
    save_path = tmp_path_factory.mktemp("demo-ray") / "profile"
    out = io.StringIO()
    started = time.monotonic()
    try:
        result = run_ray_demo(
            CONFIG,
            num_steps=NUM_STEPS,
            overrides=[f"save_path={save_path}", "all_ranks=true", f"steps=[{PROFILED[0]},{PROFILED[1]}]"],
            out=out,
        )
    finally:
        if not ray_was_up and ray.is_initialized():  # never leave a cluster behind for the next file's fixture
            ray.shutdown()
    return result, out.getvalue(), time.monotonic() - started, ray_was_up


@pytest.mark.slow
def test_traces_for_both_groups_and_ranks_on_profiled_steps_only(
    ray_demo: tuple[RayDemoResult, str, float, bool],
) -> None:
    result, _, _, _ = ray_demo
    assert result.profiled_steps == PROFILED
    on_disk = sorted(result.save_path.glob(f"*{TRACE_SUFFIX}"))
    assert sorted(result.traces) == on_disk
    names = [parse_trace_name(p.name) for p in on_disk]
    assert all(n is not None for n in names), [p.name for p in on_disk]
    seen = [(n.role, n.stage, n.step, n.rank, n.world_size, n.window, n.partial) for n in names if n is not None]
    expected = {
        (role, stage, step, rank, WORLD_SIZE, (2, 3) if stage in UPDATES else None, False)
        for role, stages in STAGES.items()
        for stage in stages
        for step in PROFILED
        for rank in range(WORLD_SIZE)
    }
    assert set(seen) == expected
    assert len(seen) == len(expected) == 24  # one trace per stage, step and rank, no more
    assert any("update-actor" in p.name and "_mb2-3_" in p.name for p in on_disk)
    assert any("update-critic" in p.name and "_mb2-3_" in p.name for p in on_disk)
    assert len({n.pid for n in names if n is not None}) == 2 * WORLD_SIZE  # every rank is its own Ray actor


@pytest.mark.slow
def test_colocated_group_is_driven_once_per_profiled_step(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    result, _, _, _ = ray_demo
    assert result.workers == 2 * WORLD_SIZE  # actor_rollout_ref and ref are the same actors
    # Once per step: the step timeline (on by default) has the controller drive every step, profiled or not.
    assert sorted(result.starts) == [
        (group, rank, NUM_STEPS) for group in (ACTOR_ROLLOUT_REF, CRITIC) for rank in range(WORLD_SIZE)
    ]
    assert sorted(result.recorded) == sorted(
        (step, group, rank) for step in PROFILED for group in (ACTOR_ROLLOUT_REF, CRITIC) for rank in range(WORLD_SIZE)
    )
    assert result.failures == ()


@pytest.mark.slow
def test_one_manifest_per_worker_process(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    result, _, _, _ = ray_demo
    assert len(result.manifests) == 2 * WORLD_SIZE + 1  # and the controller's, listing its step timeline
    assert result.manifest == result.manifests[0]
    assert sorted(result.manifests) == sorted(result.save_path.glob("instrument-manifest-*.jsonl"))
    listed: set[str] = set()
    owners = set()
    for manifest in result.manifests:
        records = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines()]
        assert len({(r["role"], r["rank"]) for r in records}) == 1  # one process, one place in one group
        owners |= {(r["role"], r["rank"]) for r in records}
        assert len(records) - len(without_timeline(records)) == 1  # each process lists its own step timeline
        listed |= {Path(r["path"]).name for r in without_timeline(records)}
    assert owners == {(group, rank) for group in (ACTOR_ROLLOUT_REF, CRITIC) for rank in range(WORLD_SIZE)} | {
        (CONTROLLER_ROLE, 0)
    }
    assert listed == {p.name for p in result.traces}


@pytest.mark.slow
def test_finish_hook_archive_lists_every_trace_and_manifest(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    result, _, _, _ = ray_demo
    assert result.archive == result.save_path.parent / ARCHIVE_NAME
    with tarfile.open(result.archive, "r:gz") as archive:
        members = {Path(name).name for name in archive.getnames()}
    assert {p.name for p in result.traces} <= members  # the hook waited for the other workers' exports
    # The workers' manifests; the controller's is written when its timeline closes, at ctl.finish(), after the hook.
    assert {m.name for m in result.manifests[:-1]} <= members
    controller = {p.name for p in result.save_path.glob(f"{CONTROLLER_ROLE}_timeline_*")}
    assert len(controller) == 1 and controller <= members  # its steps are in it, though


@pytest.mark.slow
def test_rewards_are_finite_and_ranks_stay_in_sync(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    result, _, _, _ = ray_demo
    assert len(result.rewards) == NUM_STEPS
    assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in result.rewards)
    assert result.in_sync


@pytest.mark.slow
def test_output_names_who_profiled_and_where_the_files_are(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    result, text, elapsed, _ = ray_demo
    step_lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines] == ["1/3", "2/3", "3/3"]
    assert "profiled" not in step_lines[0]
    assert all(line.endswith("profiled by actor_rollout_ref[0,1] critic[0,1]") for line in step_lines[1:])
    assert str(result.save_path) in text
    assert all(str(m) in text for m in result.manifests)
    assert result.archive is not None and str(result.archive) in text
    assert all(p.name in text for p in result.traces)
    assert "failure" not in text
    assert "Ray actors driven, each once per step" in text  # the step timeline drives every step
    print(f"ray demo: {NUM_STEPS} steps, 4 workers, in {elapsed:.1f} s")


@pytest.mark.slow
def test_the_analysis_that_make_demo_ray_ends_with_starts_with_findings(
    ray_demo: tuple[RayDemoResult, str, float, bool],
) -> None:
    result, _, _, _ = ray_demo
    command = [sys.executable, "-m", "instrument", "analyze", str(result.save_path)]
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    first = lines.index("Findings")  # before any table
    assert lines[first + 1].startswith("1. "), text
    assert "Steps" in lines[first:] and lines.index("Steps") > first
    data = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, check=True).stdout)
    assert data["findings"] and all(f["text"] for f in data["findings"])
    assert data["timeline"]["clock"]["aligned"] is True  # one host: one clock; every worker has its estimate too
    # The controller's timeline is of the same run as the workers' (its manifest names the Ray job's run).
    lanes = {(r["role"], r["rank"]) for step in data["timeline"]["steps"] for r in step["ranks"]}
    assert (CONTROLLER_ROLE, 0) in lanes and len(lanes) == 2 * WORLD_SIZE + 1


@pytest.mark.slow
def test_ray_is_left_as_it_was_found(ray_demo: tuple[RayDemoResult, str, float, bool]) -> None:
    _, _, _, ray_was_up = ray_demo
    assert ray.is_initialized() == ray_was_up


# --------------------------------------------------------------------------- no Ray needed


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ranks=[0,2]"], "'ranks' selects rank 2, outside the world of 2 ranks"),
        (["finish_hook.ranks=[3]"], "'finish_hook.ranks' selects rank 3"),
    ],
)
def test_ranks_outside_a_group_are_refused_before_ray_starts(overrides: list[str], message: str) -> None:
    ray_was_up = ray.is_initialized()
    with pytest.raises(ValueError, match=message):
        run_ray_demo(CONFIG, num_steps=1, overrides=overrides, out=io.StringIO())
    assert ray.is_initialized() == ray_was_up


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_step_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="num_steps"):
        run_ray_demo(CONFIG, num_steps=bad, out=io.StringIO())  # type: ignore[arg-type]


def _result(tmp_path: Path, *, traces: int, failures: int) -> RayDemoResult:
    trace = tmp_path / f"critic_update-critic_step1_rank0-of-2_mb2-3_h_pid1_1{TRACE_SUFFIX}"
    return RayDemoResult(
        files=(trace,) * traces,
        save_path=tmp_path,
        manifest=None,
        archive=None,
        rewards=(0.1,),
        profiled_steps=(1,),
        manifests=(),
        recorded=(),
        starts=(),
        workers=4,
        failures=tuple(WorkerFailure(CRITIC, 1, "stop_profile", "boom") for _ in range(failures)),
        in_sync=True,
    )


def test_main_passes_the_arguments_and_reports_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[object, ...]] = []
    outcome = {"traces": 1, "failures": 0}

    def fake(cfg: ProfilerConfig, steps_total: int, *, seed: int) -> RayDemoResult:
        calls.append((cfg.all_ranks, cfg.save_path, steps_total, seed))
        return _result(tmp_path, **outcome)

    monkeypatch.setattr(ppo_demo_ray, "train", fake)
    args = ["--config", str(CONFIG), "--num-steps", "2", "--seed", "3", "all_ranks=true", "save_path=rel/p"]
    assert ppo_demo_ray.main(args) == 0
    assert calls == [(True, str(Path("rel/p").absolute()), 2, 3)]  # made absolute: workers may run elsewhere
    outcome["failures"] = 1
    assert ppo_demo_ray.main(args) == 1
    assert "worker(s) failed" in capsys.readouterr().err
    outcome.update(traces=0, failures=0)
    assert ppo_demo_ray.main(args) == 1
    assert "wrote no trace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "args", "needles"),
    [
        ("steps: [1\n", [], ["broken.yaml", "invalid YAML at line 2"]),
        ("ranks: [0, 2]\n", [], ["'ranks' selects rank 2", "each worker group of the Ray demo has 2 ranks"]),
        ("steps: [1]\n", ["--num-steps", "-1"], ["'num_steps' must be an int >= 1: -1"]),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, args: list[str], needles: list[str]
) -> None:
    ray_was_up = ray.is_initialized()
    path = tmp_path / "broken.yaml"
    path.write_text(content)
    status = ppo_demo_ray.main([f"--config={path}", *args, f"save_path={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("ppo_demo_ray.py: error: ")
    assert all(needle in err for needle in needles), err
    assert not (tmp_path / "out").exists()
    assert ray.is_initialized() == ray_was_up
