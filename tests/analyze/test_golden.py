"""The same input gives the same analysis: ``--json`` of ``instrument analyze`` and ``instrument compare`` on two
synthetic 16-rank runs (benchmarks/timeline_analysis.py's writer, fixed seeds), byte for byte against the files
in ``golden/``, written by the code before the analyze package was re-laid (issue 31).

A change that means to alter what the analysis says updates them: ``INSTRUMENT_WRITE_GOLDEN=1 pytest
tests/analyze/test_golden.py``, and the diff of ``golden/`` is then part of the review.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from instrument import cli

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
sys.path.insert(0, str(ROOT / "benchmarks"))
from timeline_analysis import write_run  # noqa: E402

RANKS, STEPS, STAGES = 16, 6, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("golden")
    pair = (root / "base", root / "cand")
    for seed, directory in enumerate(pair):
        directory.mkdir()
        write_run(directory, RANKS, STEPS, STAGES, seed=seed)
    return pair


def _said(capsys: pytest.CaptureFixture[str], args: list[str], root: Path) -> str:
    """What the command printed as JSON, its machine-made parts (paths, seconds, file times) made constant."""
    assert cli.main(args) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out.replace(str(root), "ROOT"))
    data.pop("elapsed_s", None)
    for run in data.get("runs", []):
        run["started"] = "WHEN"  # the files' times: when the test wrote them
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _check(name: str, said: str) -> None:
    path = GOLDEN / name
    if os.environ.get("INSTRUMENT_WRITE_GOLDEN") == "1":
        path.write_text(said)
    assert said == path.read_text(), f"{name} differs from tests/analyze/golden/{name}"


@pytest.mark.parametrize("side", [0, 1])
def test_analyze_json_is_the_golden_one(runs: tuple[Path, Path], side: int, capsys: pytest.CaptureFixture[str]) -> None:
    root = runs[side].parent
    _check(f"analyze-{side}.json", _said(capsys, ["analyze", str(runs[side]), "--json", "--no-png", "--quiet"], root))


def test_compare_json_is_the_golden_one(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _check("compare.json", _said(capsys, ["compare", str(runs[0]), str(runs[1]), "--json"], runs[0].parent))


def test_a_saved_analysis_compares_as_the_golden_one_too(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = []
    for side, directory in enumerate(runs):
        assert cli.main(["analyze", str(directory), "--json", "--no-png", "--quiet"]) == 0
        saved.append(tmp_path / f"{side}.json")
        saved[-1].write_text(capsys.readouterr().out)
    _check("compare-saved.json", _said(capsys, ["compare", str(saved[0]), str(saved[1]), "--json"], tmp_path))
