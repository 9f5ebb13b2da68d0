"""``instrument plan`` against hostile input: broken config files (L1) and huge runs (L2, issue 15).

L1: every bad configuration file or override is one line on stderr naming the file (line and
column for parse errors) and exit 2. L2: a plan is computed, not enumerated, so 10**8 steps x
10**8 ranks answers at once; a hypothesis property checks the arithmetic against a brute-force
enumeration built from :func:`instrument.schedule.action_at` alone.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import naming
from instrument.cli import main
from instrument.config import FinishHook, ProfilerConfig, Schedule
from instrument.plan import StageSpec, count, int_runs, plan_run
from instrument.schedule import Action, Window, action_at, plan, window_of, window_series

# Guards against a regression that hangs or eats memory; the assertions are about output only.
HANG_GUARD_S = 60
MEMORY_LIMIT = 1 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m instrument ARGS`` in a child with 1 GiB of address space and a hang guard."""
    return subprocess.run(
        [sys.executable, "-m", "instrument", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=HANG_GUARD_S,
        preexec_fn=_limit_memory,
    )


def _assert_one_line_error(status: int, out: str, err: str, command: str, *needles: str) -> None:
    assert status == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"instrument {command}: error: ")
    for needle in needles:
        assert needle in lines[0]


# --------------------------------------------------------------------------- L1: bad config files


def _deep_yaml() -> str:
    return "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 60)) + "  " * 60 + "c: 1\n"


BAD_FILES = [
    ("broken.yaml", "steps: [1\nranks: 2\n", ["broken.yaml", "invalid YAML at line 2, column 6"]),
    ("tab.yaml", "steps:\n\t- 1\n", ["tab.yaml", "invalid YAML at line 2, column 1"]),
    ("two.yaml", "steps: [1]\n---\nranks: [0]\n", ["two.yaml", "invalid YAML at line 2", "single document"]),
    ("nul.yaml", "steps: [1]\x00\n", ["nul.yaml", "invalid YAML at line 1"]),
    ("broken.json", '{"steps": [1,\n', ["broken.json", "invalid JSON at line 2, column 1"]),
    ("list.yaml", "- 1\n- 2\n", ["list.yaml", "must be a mapping at the top level"]),
    ("scalar.json", "3", ["scalar.json", "must be a mapping at the top level"]),
    ("value.yaml", "steps: x\n", ["value.yaml", "'steps' must be a list of ints or null: 'x'"]),
    ("key.yaml", "schedul:\n  active: 2\n", ["key.yaml", "did you mean 'schedule"]),
    ("intkey.yaml", "1: 2\n", ["intkey.yaml", "keys must be strings"]),
    ("deep.yaml", _deep_yaml(), ["deep.yaml", "nested deeper than 32 levels"]),
    ("deep.json", "[" * 100_000, ["deep.json", "nested too deeply"]),
    (
        "bomb.yaml",
        "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
        + "steps: [*i, *i, *i, *i, *i, *i, *i, *i, *i]\n",
        ["bomb.yaml", "more than 10000 values"],
    ),
    ("big.yaml", "# padding\n" * 30_000, ["big.yaml", "larger than 256 KiB"]),
]


@pytest.mark.parametrize(("name", "text", "needles"), BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_bad_config_file_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, needles: list[str]
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    status = main(["plan", "--num-steps=2", f"--config={path}"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", *needles)


def test_not_utf8_config_names_the_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"save_path: caf\xe9\n")
    status = main(["plan", "--num-steps=2", f"--config={path}"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", "latin1.yaml", "not UTF-8 text (byte 0xe9 on line 1)")


def test_config_that_is_a_directory_or_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--num-steps=2", f"--config={tmp_path}"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", str(tmp_path), "it is a directory")
    status = main(["plan", "--num-steps=2", f"--config={tmp_path / 'nope.yaml'}"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", "nope.yaml", "No such file or directory")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_config_that_never_ends_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    """A FIFO without a writer blocks ``open``; /dev/zero never ends: both refused at once (real child)."""
    if kind == "fifo":
        path = tmp_path / "config.yaml"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    done = _run_cli("plan", "--num-steps=2", f"--config={path}")
    _assert_one_line_error(done.returncode, done.stdout, done.stderr, "plan", str(path), "not a regular file")


def test_unreadable_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file (and a child dropped to another uid cannot reach this interpreter)")
    path = tmp_path / "secret.yaml"
    path.write_text("steps: [1]\n")
    path.chmod(0)
    status = main(["plan", "--num-steps=2", f"--config={path}"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", "secret.yaml", "Permission denied")


def test_bad_override_blames_the_override_not_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.yaml"
    path.write_text("steps: [1]\n")
    status = main(["plan", "--num-steps=2", f"--config={path}", "schedule.active=0"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", "'schedule.active' must be >= 1: 0")
    assert "good.yaml" not in err


def test_bad_file_is_named_even_with_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("contents: [gpu]\n")
    status = main(["plan", "--num-steps=2", f"--config={path}", "steps=[1]"])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan", "bad.yaml: 'contents' items must be among")


@pytest.mark.parametrize("override", ["steps=[1", "steps", "=1", "ranks=[-1]", "tool=perf"])
def test_bad_override_alone(capsys: pytest.CaptureFixture[str], override: str) -> None:
    status = main(["plan", "--num-steps=2", override])
    out, err = capsys.readouterr()
    _assert_one_line_error(status, out, err, "plan")


# --------------------------------------------------------------------------- L2: huge runs by arithmetic


def test_4096_ranks_by_1000_steps() -> None:
    done = _run_cli("plan", "--num-steps", "1000", "--world-size", "4096", "all_ranks=true")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1:6] == [
        "steps    1-1000 of 1-1000",
        "ranks    0-4095 of 4096 (4096 profiled)",
        "role     actor",
        "stage    update_actor: recorded whole (scheduled)",
        "files    4096000 traces (1000 per profiled rank) in outputs/profile/:",
    ]
    assert lines[6] == "  actor_update-actor_step1_rank0-of-4096_{host}_pid{pid}_{timestamp}.pt.trace.json.gz"
    assert lines[16] == "  ... and 4095990 more (--json lists the first 10000)"
    assert len(lines) == 18


def test_1e8_steps_by_1e8_ranks_by_1e8_mini_batches() -> None:
    n = 100_000_000
    done = _run_cli(
        "plan", f"--num-steps={n}", f"--world-size={n}", f"--mini-batches={n}", "all_ranks=true",
        "schedule.warmup=1", "schedule.active=3", "schedule.repeat=0",
        "finish_hook.cmd=true", "finish_hook.all_ranks=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"steps    1-{n} of 1-{n}\n" in out
    assert f"ranks    0-{n - 1} of {n} ({n} profiled)\n" in out
    windows = 25_000_000  # 1 warmup + 3 recorded per cycle of 4
    assert (
        f"-> mb1-3, mb5-7, mb9-11, mb13-15, mb17-19, mb21-23, mb25-27, mb29-31, mb33-35, mb37-39, "
        f"... and {windows - 10} more (one every 4 mini-batches, the last mb{n - 3}-{n - 1})\n"
    ) in out
    assert f"finish   'true' on ranks 0-{n - 1}, after step {n}, timeout 600 s\n" in out
    assert f"files    {n * n * windows} traces ({n * windows} per profiled rank)" in out
    assert "warning" not in out


def test_1e8_json_keeps_lists_bounded_and_says_so() -> None:
    n = 100_000_000
    done = _run_cli(
        "plan", "--json", f"--num-steps={n}", f"--world-size={n}", f"--mini-batches={n}", "ranks=[0,7]",
        "schedule.repeat=0", "finish_hook.cmd=true", "finish_hook.all_ranks=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["counts"] == {"steps": n, "ranks": 2, "windows": n, "files": 2 * n * n, "files_per_rank": n * n}
    assert result["truncated"] == ["steps", "windows", "finish_hook_ranks", "files"]
    assert result["step_ranges"] == [[1, n]]
    assert result["ranks"] == [0, 7]
    assert result["finish_hook_rank_ranges"] == [[0, n - 1]]
    assert len(result["steps"]) == len(result["files"]) == len(result["finish_hook_ranks"]) == 10_000
    assert result["windows"][-1] == {"first": 9_999, "last": 9_999, "partial": False}
    assert (
        result["files"][1]
        == f"actor_update-actor_step1_rank0-of-{n}_mb1_{{host}}_pid{{pid}}_{{timestamp}}.pt.trace.json.gz"
    )
    assert result["warnings"] == [
        f"finish hook ranks 1-6, 8-{n - 1} ({n - 2} ranks) profile nothing themselves; "
        "their command sees the other ranks' files only on a shared filesystem"
    ]


def test_json_lists_everything_for_a_small_world(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", "--num-steps=2", "--world-size=3", "all_ranks=true"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ranks"] == [0, 1, 2]
    assert result["rank_ranges"] == [[0, 2]]
    assert result["truncated"] == []
    assert len(result["files"]) == result["counts"]["files"] == 6


def test_more_ranks_than_the_json_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", "--num-steps=1", "--world-size=10001", "all_ranks=true"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ranks"] == list(range(10_000))
    assert result["truncated"] == ["ranks", "files"]
    assert result["counts"]["ranks"] == 10_001


# --------------------------------------------------------------------------- arithmetic == enumeration


def _brute_windows(n: int, s: Schedule) -> list[Window]:
    """Windows from torch's per-step actions alone: open at the first recorded step, close at SAVE."""
    windows: list[Window] = []
    first: int | None = None
    for i in range(n):
        action = action_at(i, s)
        if action in (Action.RECORD, Action.RECORD_AND_SAVE) and first is None:
            first = i
        if action is Action.RECORD_AND_SAVE:
            assert first is not None
            windows.append(Window(first, i))
            first = None
    if first is not None:
        windows.append(Window(first, n - 1, partial=True))
    return windows


schedules = st.builds(
    Schedule,
    skip_first=st.integers(0, 4),
    wait=st.integers(0, 3),
    warmup=st.integers(0, 3),
    active=st.integers(1, 4),
    repeat=st.integers(0, 3),
    skip_first_wait=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(s=schedules, n=st.integers(0, 50))
def test_window_series_equals_enumeration(s: Schedule, n: int) -> None:
    series = window_series(n, s)
    assert list(series) == _brute_windows(n, s) == plan(n, s)
    assert series.total == len(series) == len(plan(n, s))
    assert [series[i] for i in range(-series.total, 0)] == list(series)
    assert series[1:] == list(series)[1:]


def test_window_series_of_a_huge_loop() -> None:
    s = Schedule(skip_first=3, wait=2, warmup=1, active=2, repeat=0)
    n = 10**30 + 2  # windows cover 6-7, 11-12, ...: the one at 10**30 + 1 is cut after one mini-batch
    series = window_series(n, s)
    assert series.total == (n - 6 - 1) // 5 + 1
    assert series[-1] == Window(10**30 + 1, 10**30 + 1, partial=True)
    assert series[-2] == Window(10**30 - 4, 10**30 - 3)
    assert series[12_345] == Window(6 + 5 * 12_345, 7 + 5 * 12_345)
    assert window_of(series[-2].first, s) == (series[-2].first, series[-2].last)


@st.composite
def runs_to_plan(draw: st.DrawFn) -> tuple[ProfilerConfig, dict[str, object]]:
    world = draw(st.integers(1, 4))
    num_steps = draw(st.integers(1, 5))
    selected = st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True)
    hook = draw(st.none() | st.builds(FinishHook, cmd=st.just("true"), ranks=selected, all_ranks=st.booleans()))
    config = ProfilerConfig(
        enable=draw(st.booleans()) or True,
        steps=draw(st.none() | st.lists(st.integers(1, 7), min_size=1, max_size=4, unique=True)),
        ranks=draw(selected),
        all_ranks=draw(st.booleans()),
        discrete=draw(st.booleans()),
        schedule=draw(st.none() | schedules),
        finish_hook=hook,
    )
    names = st.sampled_from(["gen", "ref", "update"])
    own_role = st.none() | st.just("critic")  # profiled_stage(name, role="critic") in an actor process
    stage_list = draw(st.lists(st.builds(StageSpec, names, st.booleans(), own_role), min_size=1, max_size=3))
    return config, {
        "num_steps": num_steps,
        "world_size": world,
        "num_mini_batches": draw(st.integers(0, 9)),
        "stages": tuple(stage_list),
    }


@settings(max_examples=300, deadline=None)
@given(case=runs_to_plan())
def test_plan_run_equals_brute_force_enumeration(case: tuple[ProfilerConfig, dict[str, object]]) -> None:
    config, kwargs = case
    run = plan_run(config, **kwargs)  # type: ignore[arg-type]
    num_steps, world = kwargs["num_steps"], kwargs["world_size"]
    stages = kwargs["stages"]
    assert isinstance(num_steps, int) and isinstance(world, int) and isinstance(stages, tuple)
    n = kwargs["num_mini_batches"]
    assert isinstance(n, int)

    steps = [s for s in range(1, num_steps + 1) if config.profiles_step(s)]
    ranks = [r for r in range(world) if config.profiles_rank(r)]
    windows = _brute_windows(n, config.schedule) if config.schedule is not None and config.discrete else []
    expected: list[str] = []
    for step in steps:
        for rank in ranks:
            if not config.discrete:
                parts: list[tuple[str, str, Window | None]] = [("actor", naming.CONTINUOUS_STAGE, None)]
            else:
                parts = []
                for stage in stages:
                    role = stage.role or "actor"
                    if stage.scheduled and config.schedule is not None:
                        parts.extend((role, stage.name, w) for w in windows)
                    else:
                        parts.append((role, stage.name, None))
            for role, stage_name, w in parts:
                expected.append(
                    naming.trace_prefix(
                        role=role, stage=stage_name, step=step, rank=rank, world_size=world,
                        window=None if w is None else (w.first, w.last), partial=w is not None and w.partial,
                    )
                )  # fmt: skip

    assert [t.prefix for t in run.traces] == expected
    assert [run.traces[i].prefix for i in range(len(expected))] == expected
    assert run.traces.total == len(expected)
    assert list(run.steps) == steps and count(run.steps) == len(steps)
    assert list(run.ranks) == ranks and count(run.ranks) == len(ranks)
    for rank in range(world):
        assert run.traces.of_rank(rank) == sum(1 for t in run.traces if t.rank == rank)
    if config.schedule is not None and config.discrete:
        assert list(run.windows) == windows
    hook = config.finish_hook
    if hook is not None:
        chosen = [r for r in range(world) if hook.all_ranks or r in hook.ranks]
        assert list(run.finish_ranks) == chosen
        idle = [r for r in chosen if r not in ranks]
        notes = [w for w in run.warnings if w.startswith("finish hook ranks")]
        assert notes == ([f"finish hook ranks {idle} profile nothing themselves; their command sees the other "
                          "ranks' files only on a shared filesystem"] if idle else [])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.integers(0, 40), unique=True).map(sorted), start=st.integers(0, 5), size=st.integers(0, 9))
def test_int_runs_equal_enumeration(values: list[int], start: int, size: int) -> None:
    for seq in (values, range(start, start + size)):
        runs = int_runs(seq)
        assert [v for a, b in runs for v in range(a, b + 1)] == list(seq)
        assert all(b + 1 < c for (_, b), (c, _) in itertools.pairwise(runs))


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("update_actor", StageSpec("update_actor")),
        ("update_actor:scheduled", StageSpec("update_actor", scheduled=True)),
        ("critic:compute_values", StageSpec("compute_values", role="critic")),
        ("critic:update_critic:scheduled", StageSpec("update_critic", scheduled=True, role="critic")),
        (" critic : update_critic ", StageSpec("update_critic", role="critic")),
    ],
)
def test_a_stage_may_name_its_own_role(text: str, spec: StageSpec) -> None:
    assert StageSpec.parse(text) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("update:sched", "stage flag must be 'scheduled'"),  # a typo of the flag, not a role
        ("critic:update:schedule", "stage flag must be 'scheduled'"),
        ("a:b:c", "stage must look like NAME, NAME:scheduled or ROLE:NAME[:scheduled]"),
        (":update", "stage must look like"),
        ("critic::scheduled", "stage must look like"),
        ("...:update", "label has no character usable in a file name"),
    ],
)
def test_bad_stage_forms_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        StageSpec.parse(text)


def test_stages_of_their_own_role_are_named_after_it(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--num-steps=1", "--role=actor_rollout_ref", "--mini-batches=2", "schedule.active=2"]
    assert main([*args, "--stage=critic:update_critic:scheduled", "--stage=update_actor", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"] == [
        {"name": "update_critic", "scheduled": True, "role": "critic"},
        {"name": "update_actor", "scheduled": False, "role": "actor_rollout_ref"},
    ]
    assert [f.split("_{host}")[0] for f in plan["files"]] == [
        "critic_update-critic_step1_rank0-of-1_mb0-1",
        "actor-rollout-ref_update-actor_step1_rank0-of-1",
    ]
    assert main([*args, "--stage=critic:update_critic:scheduled"]) == 0
    assert "stage    update_critic (role critic): scheduled over 2 mini-batches -> mb0-1" in capsys.readouterr().out
