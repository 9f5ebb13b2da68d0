"""``instrument plan``: the plan it prints, its warnings and its exit statuses (in-process and as a real command)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument._shipped import doc_pages, for_reading
from instrument.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["plan", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    status, out, err = _plan(capsys, "--json", *args)
    assert status == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def test_help_of_the_installed_command() -> None:
    exe = shutil.which("instrument", path=str(Path(sys.executable).parent))
    assert exe is not None, "the console script 'instrument' is not installed"
    done = subprocess.run([exe, "plan", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    for flag in ("--num-steps", "--world-size", "--mini-batches", "--stage", "--config", "--json", "KEY=VALUE"):
        assert flag in done.stdout


def test_module_entry_point_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "instrument", "plan", "--num-steps", "1"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "actor_update-actor_step1_rank0-of-1_{host}_pid{pid}_{timestamp}.pt.trace.json.gz" in done.stdout


def test_plan_of_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _plan(
        capsys,
        "--config",
        str(EXAMPLES / "verl_ppo.yaml"),
        "--num-steps=4",
        "--world-size=8",
        "--mini-batches=6",
        "--stage=compute_log_prob",
        "--stage=update_actor:scheduled",
    )
    assert status == 0
    assert "steps    1, 3 of 1-4" in out
    assert "ranks    0, 4 of 8 (2 profiled)" in out
    assert "update_actor: scheduled over 6 mini-batches -> mb2-3" in out
    assert "actor_update-actor_step3_rank4-of-8_mb2-3_{host}_pid{pid}_{timestamp}.pt.trace.json.gz" in out
    assert "actor_compute-log-prob_step1_rank0-of-8_{host}" in out
    assert "files    8 traces (4 per profiled rank)" in out
    assert "on ranks 0, after step 3, timeout 600 s" in out
    assert "warning" not in out


def test_verl_keys_plan_the_same_run(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--num-steps=4", "--world-size=8", "--mini-batches=6", "--stage=update_actor:scheduled"]
    native = _plan_json(capsys, "--config", str(EXAMPLES / "verl_ppo.yaml"), *args)
    verl = _plan_json(capsys, "--config", str(EXAMPLES / "verl_keys.yaml"), *args)
    # the same run; verl's keys also bring verl's rules where the two differ (docs/config.md)
    assert (native["config"].pop("dialect"), verl["config"].pop("dialect")) == ("instrument", "verl")
    assert native == verl


def test_json_lists_every_file_and_window(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan_json(
        capsys, "--num-steps=3", "--world-size=4", "--mini-batches=10", "all_ranks=true", "steps=[2]",
        "schedule.wait=1", "schedule.warmup=1", "schedule.active=2", "schedule.repeat=2",
    )  # fmt: skip
    assert plan["windows"] == [
        {"first": 2, "last": 3, "partial": False},
        {"first": 6, "last": 7, "partial": False},
    ]
    files = plan["files"]
    assert isinstance(files, list)
    assert len(files) == 4 * 2
    assert len(set(files)) == len(files)
    assert plan["ranks"] == [0, 1, 2, 3]
    assert plan["warnings"] == []


def test_continuous_mode_writes_one_trace_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan_json(capsys, "--num-steps=2", "discrete=false", "--stage=a", "--stage=b")
    assert plan["files"] == [
        "actor_continuous_step1_rank0-of-1_{host}_pid{pid}_{timestamp}.pt.trace.json.gz",
        "actor_continuous_step2_rank0-of-1_{host}_pid{pid}_{timestamp}.pt.trace.json.gz",
    ]


@pytest.mark.parametrize(
    ("args", "warning"),
    [
        (
            ["--mini-batches=4", "schedule.skip_first=1", "schedule.warmup=1", "schedule.active=3"],
            "window mb2-4 cannot complete with 4 mini-batches: it is saved partial as mb2-3",
        ),
        (
            ["--mini-batches=3", "schedule.skip_first=2", "schedule.wait=1", "schedule.warmup=1"],
            "no mini-batch is ever recorded: 3 mini-batches per update, but the first window starts at mini-batch 4",
        ),
        (["steps=[2,9]"], "steps [9] are never reached in a 4-step run"),
        (
            ["discrete=false", "schedule.active=2"],
            "continuous mode writes one trace per step; the schedule applies only in discrete mode",
        ),
        (["schedule.active=2", "--stage=gen"], "a schedule is set but no stage is scheduled"),
        (["enable=false"], "profiling is off (enable is false)"),
        (["tool=none"], "profiling is off (tool is 'none')"),
        (["--world-size=2", "finish_hook.cmd=true", "finish_hook.ranks=[1]"], "finish hook ranks [1] profile nothing"),
    ],
)
def test_warnings(capsys: pytest.CaptureFixture[str], args: list[str], warning: str) -> None:
    status, out, _ = _plan(capsys, "--num-steps=4", *args)
    assert status == 0
    assert f"warning: {warning}" in out
    assert main(["plan", "--strict", "--num-steps=4", *args]) == 1


def test_partial_window_is_named_partial(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan_json(capsys, "--num-steps=1", "--mini-batches=4", "schedule.warmup=1", "schedule.active=5")
    assert plan["files"] == [
        "actor_update-actor_step1_rank0-of-1_mb1-3_partial_{host}_pid{pid}_{timestamp}.pt.trace.json.gz"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size=8", "ranks=[9]"], "'ranks' selects rank 9, outside the world of 8 ranks (0..7)"),
        (["finish_hook.cmd=x", "finish_hook.ranks=[3]"], "'finish_hook.ranks' selects rank 3"),
        (["schedul.active=2"], "did you mean 'schedule.active'?"),
        (["schedule.active=0"], "'schedule.active' must be >= 1: 0"),
        (["--stage=update:sched"], "stage flag must be 'scheduled'"),
        (["--stage=..."], "label has no character usable in a file name"),
        (["--config=/nonexistent/x.yaml"], "No such file or directory"),
        (["--mini-batches=-1"], "'num_mini_batches' must be >= 0: -1"),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    status, out, err = _plan(capsys, "--num-steps=2", *args)
    assert status == 2
    assert out == ""
    assert err.startswith("instrument plan: error: ")
    assert message in err


def test_config_file_must_be_a_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "c.yaml"
    listing.write_text("- 1\n- 2\n")
    status, _, err = _plan(capsys, "--num-steps=1", f"--config={listing}")
    assert status == 2
    assert "must be a mapping at the top level" in err


def test_json_config_and_overrides_apply_after_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"steps": [1], "ranks": [0, 1]}))
    plan = _plan_json(capsys, "--num-steps=3", "--world-size=2", f"--config={path}", "steps=[3]")
    assert plan["steps"] == [3]
    assert plan["ranks"] == [0, 1]


# ---------------------------------------------------------------------- what ships: examples and docs (issue 27)


def test_a_shipped_example_plans_as_its_file_does(capsys: pytest.CaptureFixture[str]) -> None:
    by_name = _plan_json(capsys, "--example", "verl_ppo", "--num-steps=4", "--world-size=8")
    by_file = _plan_json(capsys, "--config", str(EXAMPLES / "verl_ppo.yaml"), "--num-steps=4", "--world-size=8")
    assert by_name == by_file
    verl = _plan_json(capsys, "--example", "verl_keys.yaml", "--num-steps=4", "--world-size=8")
    assert verl["files"] == by_file["files"]  # the same settings in verl's keys (its dialect aside)


def test_an_unknown_example_names_the_shipped_ones(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _plan(capsys, "--example", "verl", "--num-steps=1")
    assert (status, out) == (2, "")
    assert err == "instrument plan: error: no example configuration 'verl' (examples: verl_keys, verl_ppo)\n"


def test_example_and_config_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--example", "verl_ppo", "--config", "x.yaml", "--num-steps=1"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_docs_lists_the_pages_and_prints_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert "config         Configuration" in listing and "quickstart     Quick start" in listing
    assert main(["docs", "config"]) == 0
    assert capsys.readouterr().out == for_reading((EXAMPLES.parent / "docs" / "config.md").read_text(encoding="utf-8"))
    assert main(["docs", "docs/schedule.md"]) == 0  # the path the repository's links use works too
    assert capsys.readouterr().out.startswith("# Schedules")
    assert main(["docs", "nope"]) == 2
    assert capsys.readouterr().err.startswith("instrument docs: error: no documentation page 'nope' (pages: analyze,")


def test_help_points_to_what_an_installed_user_has(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "instrument docs [PAGE]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    assert "--example verl_ppo" in text and "instrument docs config" in text
    assert "docs/config.md" not in text and "examples/" not in text


# ---------------------------------------------------------------------- a page as a reader sees it (issue 32)

_MARKED = """\
# Page

Text with ![a picture](images/x.png) inline.

<!-- not run: a GPU -->
```console
$ make test-gpu
<!-- kept: inside a block -->
![kept](images/y.png)
```

![stage time per rank](images/analyze-demo.png)

The marks are `<!-- run: WORDS -->` in text.
<!--run:exit=2-->
````text
```
still inside
````
"""

_READ = """\
# Page

Text with a picture inline.

```console
$ make test-gpu
<!-- kept: inside a block -->
![kept](images/y.png)
```

The marks are `<!-- run: WORDS -->` in text.
````text
```
still inside
````
"""


def test_a_page_is_shown_without_its_marks_and_image_links() -> None:
    assert for_reading(_MARKED) == _READ
    assert for_reading(_READ) == _READ


def _split(markdown: str) -> tuple[list[str], list[str]]:
    """The fenced blocks of a page, fences included (``` or ~~~, closed by the same, at least as long), and
    the lines outside them."""
    blocks: list[str] = []
    outside: list[str] = []
    current: list[str] = []
    fence = ""
    for line in markdown.splitlines():
        bare = line.strip()
        if not fence and (bare.startswith("```") or bare.startswith("~~~")):
            fence = bare[: len(bare) - len(bare.lstrip(bare[0]))]
            current = [line]
        elif fence:
            current.append(line)
            if bare and bare == fence[0] * len(bare) and len(bare) >= len(fence):
                blocks.append("\n".join(current))
                fence = ""
        else:
            outside.append(line)
    return blocks, outside


@pytest.mark.parametrize("name", sorted(doc_pages()))
def test_every_page_prints_without_marks_or_images_and_its_blocks_whole(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["docs", name]) == 0
    shown = capsys.readouterr().out
    blocks, outside = _split(shown)
    assert not [line for line in outside if line.strip().startswith("<!--")]
    assert not [line for line in outside if "![" in line or "](images/" in line]
    assert blocks == _split(doc_pages()[name].read_text(encoding="utf-8"))[0]  # the commands a reader copies
    assert shown.startswith("# ")


_LINES = st.sampled_from(
    ["", "text", "```", "````", "~~~", "```python", "<!-- not run: x -->", "![alt](images/a.png)", "a ![b](c) d",
     "`<!-- run: slow -->` inline", "  indented", "```` ```"]
)  # fmt: skip


@given(st.lists(_LINES, max_size=30))
def test_reading_twice_changes_nothing_more_and_plain_text_is_untouched(lines: list[str]) -> None:
    page = "\n".join(lines) + "\n"
    once = for_reading(page)
    assert for_reading(once) == once
    if not any("<!--" in line or "![" in line for line in lines):
        assert once == page


# ---------------------------------------------------------------------- a reader that stops early (issue 32)

_A_RUN = """\
import sys
import instrument as ins

stages = [ins.profiled_stage(f"stage_{i:02d}") for i in range(24)]  # enough rows for a compare --json of 5+ KB
ins.configure(ins.ProfilerConfig(tool="none", save_path=sys.argv[1]), role="actor", rank=0, world_size=1)
for step in range(1, 31):
    with ins.profile_step(step, last=step == 30):
        for stage in stages:
            with stage:
                sum(range(200))
ins.finish()
"""
_READ_BYTES = 16


def _runs(where: Path) -> None:
    """Two real runs (the step timeline only: no profiler) for analyze and compare to read."""
    for name in ("base", "cand"):
        run = [sys.executable, "-c", _A_RUN, str(where / name)]
        done = subprocess.run(run, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


def _into_a_reader_that_leaves(command: list[str], cwd: Path, read: int) -> tuple[int, str, int]:
    """Run ``instrument COMMAND`` with stdout a pipe of one page; read ``read`` bytes of it and close it (0: its
    read end is closed before the command starts). Returns the exit status, stderr and the pipe's capacity."""
    reader, writer = os.pipe()
    fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, 4096)  # the smallest: a few KB of output fill it
    capacity = fcntl.fcntl(writer, fcntl.F_GETPIPE_SZ)
    if not read:
        os.close(reader)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "instrument", *command], stdout=writer, stderr=subprocess.PIPE, cwd=cwd, text=True
        )
    finally:
        os.close(writer)
    if read:
        got = b""
        while len(got) < read and (chunk := os.read(reader, read - len(got))):
            got += chunk
        assert len(got) == read  # the command began writing
        os.close(reader)
    _out, err = child.communicate(timeout=HANG_GUARD_S)
    return child.returncode, err, capacity


HANG_GUARD_S = 300  # only against a hang: the assertions are about exit statuses and stderr
_LARGE = {  # what each command prints is larger than the pipe and the bytes read: a write after the close fails
    "plan": ["plan", "--num-steps", "2000", "--world-size", "64", "--json"],
    "docs PAGE": ["docs", "config"],
    "analyze": ["analyze", "base", "--no-png"],
    "analyze --json": ["analyze", "base", "--no-png", "--json"],
    "compare --json": ["compare", "base", "cand", "--json"],
}
_SMALL = {  # a few lines: the reader is gone before the first
    "docs": ["docs"],
    "--help": ["--help"],
    "compare": ["compare", "base", "cand"],
    "rollout": ["rollout", "launch-args", "--profiler-dir", "vllm-prof"],
    "plan (text)": ["plan", "--num-steps", "4"],
}


def _whole(command: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The command with nothing closing early: what it prints, and the stderr it has anyway."""
    done = subprocess.run([sys.executable, "-m", "instrument", *command], cwd=cwd, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="sets a pipe's size (Linux)")
def test_a_reader_that_stops_early_ends_plan_quietly(tmp_path: Path) -> None:
    status, err, capacity = _into_a_reader_that_leaves(_LARGE["plan"], tmp_path, _READ_BYTES)
    assert (status, err) == (0, "")
    assert len(_whole(_LARGE["plan"], tmp_path).stdout) > capacity + _READ_BYTES  # so the pipe really broke
    assert _into_a_reader_that_leaves(_SMALL["docs"], tmp_path, 0)[:2] == (0, "")


@pytest.mark.slow  # two runs and twenty commands, each a fresh interpreter: ~30 s
@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="sets a pipe's size (Linux)")
def test_a_reader_that_stops_early_ends_every_command_quietly(tmp_path: Path) -> None:
    """Exit 0 and no more on stderr than the command says anyway (no "Broken pipe", no "Exception ignored")."""
    _runs(tmp_path)
    results, expected = {}, {}
    for name, command in {**_LARGE, **_SMALL}.items():
        whole = _whole(command, tmp_path)
        expected[name] = expected[f"{name}, no reader"] = (0, whole.stderr.decode())
        if name in _LARGE:
            status, err, capacity = _into_a_reader_that_leaves(command, tmp_path, _READ_BYTES)
            assert len(whole.stdout) > capacity + _READ_BYTES, name  # so the pipe really broke
            results[name] = (status, err)
        else:
            del expected[name]
        status, err, _ = _into_a_reader_that_leaves(command, tmp_path, 0)
        results[f"{name}, no reader"] = (status, err)
    assert results == expected
