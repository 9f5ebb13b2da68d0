"""``instrument analyze`` names the paths the user gave, never the hidden temp files it writes through (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from instrument.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "hta"


def test_a_bad_png_path_names_the_path_given_not_a_temp_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    given = tmp_path / "missing" / "picture.png"
    status = main(["analyze", str(DATA), "--png", str(given), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1] == f"instrument analyze: error: cannot write {given}: No such file or directory"
    assert ".tmp" not in err


def test_a_bad_html_path_names_the_path_given_not_a_temp_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    given = tmp_path / "missing" / "report.html"
    status = main(["analyze", str(DATA), "--no-png", "--html", str(given), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1] == f"instrument analyze: error: cannot write {given}: No such file or directory"
    assert ".tmp" not in err
