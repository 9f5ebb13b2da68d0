"""``instrument compare``: its output, ``--json`` and ``--html``, and one line and exit 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from instrument.cli import main
from tests.analyze.analyzers.test_compare import SLOW, timeline_run, trace_run


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["compare", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    return trace_run(root / "base", seed=31), trace_run(root / "cand", seed=32, slow=True)


def test_text_names_the_change_first(capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path]) -> None:
    status, out, err = _run(capsys, str(pair[0]), str(pair[1]))
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == f"instrument compare: {pair[0]} \u2192 {pair[1]}"
    assert lines[3].startswith("1. candidate is ") and lines[4].startswith("2. update_actor +")
    assert "aten::mm" in lines[4]


def test_json_and_html(capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path], tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    status, out, err = _run(capsys, str(pair[0]), str(pair[1]), "--json", "--html", str(page))
    assert status == 0, err
    data = json.loads(out)
    assert [c["stage"] for c in data["changes"] if c["significant"]] == ["update_actor"]
    assert data["html"] == str(page) and "<h2>Findings</h2>" in page.read_text()
    assert data["method"]["alpha"] == 0.01 and data["method"]["min_change_pct"] == 5.0


def test_filters_and_min_change(capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path]) -> None:
    status, out, _ = _run(capsys, str(pair[0]), str(pair[1]), "--json", "--stage", "update-actor", "--ranks", "0-1")
    assert status == 0
    [change] = json.loads(out)["changes"]
    assert change["stage"] == "update_actor" and change["samples"] == [12, 12] and change["significant"]
    status, out, _ = _run(capsys, str(pair[0]), str(pair[1]), "--json", "--min-change", "50", "--steps", "1-3")
    assert status == 0
    data = json.loads(out)
    assert not any(c["significant"] for c in data["changes"])
    assert {c["samples"][0] for c in data["changes"]} == {12}


def test_analyze_json_outputs_are_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = timeline_run(tmp_path / "base", seed=33)
    cand = timeline_run(tmp_path / "cand", seed=34, slow=SLOW)
    for name, where in (("base", base), ("cand", cand)):
        status = main(["analyze", str(where), "--json", "--no-png", "--quiet"])
        (tmp_path / f"{name}.json").write_text(capsys.readouterr().out)
        assert status == 0
    status, out, err = _run(capsys, str(tmp_path / "base.json"), str(tmp_path / "cand.json"), "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["step"]["significant"] and data["timeline"]["critical_path"]  # timeline steps travel in the JSON
    assert data["changes"] == []  # the JSON of a timeline-only run has no per-stage instances: said, not guessed
    assert data["findings"][1]["text"] == "no stage in both runs to compare"


_NAN_RANK = (
    '{"directory": "x", "stages": [{"role": "a", "stage": "b", "step": 1, "per_rank": [{"rank": 0, "wall_ms": "9"}]}]}'
)
BAD_INPUTS = [  # (name, content: None = absent, "/" = an empty directory, words on stderr)
    ("missing", None, "no such directory or file"),
    ("empty", "/", "no trace and no step timeline in it"),
    ("other.json", '{"traceEvents": []}', "not the --json output of instrument analyze (no 'directory' and 'stages'"),
    ("list.json", "[1, 2]", "not the --json output of instrument analyze"),
    ("notes.txt", "hello", "neither a directory nor JSON"),
    (
        "bad.json",
        '{"directory": "x", "stages": [{"step": "1"}]}',
        "(a stage's 'step' must be an int or null (got '1'))",
    ),
    ("nan.json", _NAN_RANK, "('wall_ms' must be a number (got '9'))"),
]


@pytest.mark.parametrize(("name", "content", "words"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    pair: tuple[Path, Path],
    tmp_path: Path,
    name: str,
    content: str | None,
    words: str,
) -> None:
    bad = tmp_path / name
    if content == "/":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    status, out, err = _run(capsys, str(bad), str(pair[1]))
    assert status == 2 and not out
    assert err.count("\n") == 1 and err.startswith(f"instrument compare: error: baseline {bad}: ")
    assert words in err and "Traceback" not in err


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["compare", str(pair[0]), str(pair[1]), "--min-change", "-3"])
    assert stopped.value.code == 2
    assert "--min-change must be a percentage >= 0" in capsys.readouterr().err
    status, _, err = _run(capsys, str(pair[0]), str(pair[1]), "--jobs", "0")
    assert status == 2 and "--jobs must be >= 1" in err


def test_the_installed_command(pair: tuple[Path, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "instrument", "compare", str(pair[0]), str(pair[1]), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changes"][0]["stage"] == "update_actor"


def test_a_slower_machine_is_one_finding_in_text_json_and_page(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every stage 40% longer in the candidate, update_actor 30% more on top: the machine once, that stage first."""
    from tests.analyze.analyzers.test_compare_machine import machine_run

    base = machine_run(tmp_path / "base", seed=51)
    cand = machine_run(tmp_path / "cand", seed=52, factor=1.4, slow=1.3)
    status, out, err = _run(capsys, str(base), str(cand))
    assert status == 0, err
    lines = out.splitlines()
    assert lines[3].startswith("1. candidate is ") and ": update_actor +" in lines[3]
    assert lines[4].startswith("2. every stage +4") and lines[4].endswith(
        "the machine, not a stage; each stage is judged against it."
    )
    assert lines[5].startswith("3. update_actor +") and "beyond the machine" in lines[5]
    assert out.count("the machine, not a stage") == 1
    page = tmp_path / "diff.html"
    status, out, err = _run(capsys, str(base), str(cand), "--json", "--html", str(page))
    assert status == 0, err
    data = json.loads(out)
    assert data["machine"]["common"] is True and 38 <= data["machine"]["change_pct"] <= 42
    assert [c["stage"] for c in data["changes"] if c["significant"]] == ["update_actor"]
    assert [f["kind"] for f in data["findings"]][:3] == ["step", "machine", "stage"]
    assert page.read_text().count("the machine, not a stage") == 1
