"""``--ranks`` / ``--steps`` ranges are intervals: bounded memory whatever the numbers (issue 27)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from instrument.analyze import analyze
from instrument.analyze._cli import parse_int_list
from instrument.analyze.model import Filters, IntRanges
from instrument.analyze.traces._snapshots import find_memory_files

HUGE = "0-999999999999"


def _write_trace(path: Path, step: int, ms: float) -> None:
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "update_actor", "pid": 1, "tid": 1, "ts": 10, "dur": ms * 1e3},
    ]
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()))


def _two_ranks(directory: Path) -> None:
    for rank in (0, 1):
        name = f"actor_update-actor_step2_rank{rank}-of-2_host_pid{rank + 1}_1.pt.trace.json.gz"
        _write_trace(directory / name, 2, 1.0 + rank)


def test_parse_int_list_keeps_intervals() -> None:
    parsed = parse_int_list("5-7, 0,2,3")
    assert parsed.intervals == ((0, 0), (2, 3), (5, 7))
    assert list(parsed) == [0, 2, 3, 5, 6, 7]
    assert str(parsed) == "0,2-3,5-7"
    assert 6 in parsed and 4 not in parsed and -1 not in parsed and "2" not in parsed


def test_a_huge_range_is_one_interval() -> None:
    parsed = parse_int_list(f"{HUGE},3")
    assert parsed.intervals == ((0, 999999999999),)  # 3 is inside: merged, nothing expanded
    assert 999999999999 in parsed and 10**12 not in parsed
    assert len(parsed) == 10**12


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "1-b"])
def test_parse_int_list_refuses_bad_text(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_int_list(text)


def test_plain_lists_still_work_and_are_checked() -> None:
    assert Filters.of(ranks=[3, 1, 2]).ranks == IntRanges([(1, 3)])
    assert Filters.of(all_ranks=False).ranks == IntRanges.of([0])
    with pytest.raises(ValueError, match="'steps' must hold non-negative ints"):
        Filters.of(steps=[-1])


def test_huge_ranges_filter_the_analysis_and_the_memory_files(tmp_path: Path) -> None:
    _two_ranks(tmp_path)
    report = analyze(tmp_path, ranks=parse_int_list(HUGE), steps=parse_int_list("1-99999999999"), jobs=1)
    assert report.ok, report.skipped
    assert report.ranks == (0, 1)
    only = analyze(tmp_path, ranks=parse_int_list("1-999999999999"), jobs=1)
    assert only.ranks == (1,)
    assert find_memory_files(tmp_path, ranks=parse_int_list(HUGE), steps=parse_int_list(HUGE)) == []


def _capped(code: str, cap_bytes: int) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter whose address space is capped (a range expanded into a list dies)."""
    wrapper = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({cap_bytes}, {cap_bytes}))\n{code}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, env=env, check=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_the_cli_with_huge_ranges_runs_under_a_memory_cap(tmp_path: Path) -> None:
    _two_ranks(tmp_path)
    code = (
        "import sys; from instrument.cli import main\n"
        f"sys.exit(main(['analyze', {str(tmp_path)!r}, '--ranks', {HUGE!r}, '--steps', '1-99999999999', "
        "'--no-png', '--json', '--quiet', '--jobs', '1']))"
    )
    done = _capped(code, 3 << 30)
    assert "MemoryError" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ranks"] == [0, 1]
