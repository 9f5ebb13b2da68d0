"""``instrument analyze`` names the paths the user gave, never the hidden temp files it writes through, and
says what exists when a filter matches nothing (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument.analyze.model import IntRanges
from instrument.analyze.traces._selection import _without
from instrument.cli import main
from tests.analyze.traces.test_runs import real_run

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of one rank: stage update_actor on steps 1 and 2, and its step timeline."""
    save = tmp_path_factory.mktemp("one") / "profile"
    real_run(save, "1,2")
    return save


def _written(save: Path, tmp: Path) -> list[str]:
    """Outputs the analysis may write: the default picture in the run's folder, any file in ``tmp``."""
    return sorted(p.name for p in [*save.glob("instrument-analysis*"), *tmp.iterdir()])


def test_a_bad_png_path_names_the_path_given_not_a_temp_file(
    one_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    given = tmp_path / "missing" / "picture.png"
    status = main(["analyze", str(one_run), "--png", str(given), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1] == f"instrument analyze: error: cannot write {given}: No such file or directory"
    assert ".tmp" not in err


def test_a_bad_html_path_names_the_path_given_not_a_temp_file(
    one_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    given = tmp_path / "missing" / "report.html"
    status = main(["analyze", str(one_run), "--no-png", "--html", str(given), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1] == f"instrument analyze: error: cannot write {given}: No such file or directory"
    assert ".tmp" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ranks", "2"], ["nothing in", "matches --ranks 2", "--ranks 2: no such rank here (ranks: 0)"]),
        (["--steps", "9"], ["matches --steps 9", "--steps 9: no such step here (steps: 1-2)"]),
        (
            ["--stage", "update-actr"],
            ["matches --stage update-actr", "(stages: update_actor); did you mean 'update_actor'?"],
        ),
        (["--ranks", "0", "--steps", "2", "--stage", "generate"], ["--stage generate: no such stage here"]),
    ],
)
def test_a_filter_that_matches_nothing_exits_2_says_what_exists_and_writes_nothing(
    one_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: list[str]
) -> None:
    html, merged = tmp_path / "report.html", tmp_path / "merged.json.gz"
    status = main(["analyze", str(one_run), *args, "--html", str(html), "--merged-trace", str(merged), "--quiet"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("instrument analyze: error: nothing in ")
    for words in said:
        assert words in err
    assert "there: ranks 0; steps 1-2; stages update_actor" in err
    assert _written(one_run, tmp_path) == []


def test_a_filter_partly_absent_runs_and_names_what_is_absent_once(
    one_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["analyze", str(one_run), "--ranks", "0,2-5", "--steps", "2,7", "--no-png", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0
    assert "update_actor" in out
    assert err.count("--ranks 2-5: no such rank here (ranks: 0); the rest is analysed") == 1
    assert err.count("--steps 7: no such step here (steps: 1-2); the rest is analysed") == 1


def test_a_directory_with_no_trace_exits_2_and_writes_no_picture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["analyze", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == (
        f"instrument analyze: error: no trace to analyse in {tmp_path}: "
        "no *.json / *.json.gz trace and no step timeline"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_directory_whose_traces_cannot_be_read_names_them_then_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.json").write_text('{"no": "events"}')
    status = main(["analyze", str(tmp_path), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert lines[0].startswith(f"instrument analyze: skipped {tmp_path / 'broken.json'}: ")
    assert lines[1].endswith("none of its 1 trace files could be read (each named above)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json"]


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), min_size=1, max_size=5),
    st.sets(st.integers(0, 90), max_size=20),
)
def test_the_absent_values_are_exactly_those_asked_and_not_there(asked: list[tuple[int, int]], there: set[int]) -> None:
    ranges = IntRanges((first, first + length) for first, length in asked)
    gone = _without(ranges, there)
    expected = IntRanges.of(v for v in ranges if v not in there)
    assert gone == str(expected)
