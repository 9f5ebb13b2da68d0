"""Trace times no clock could give, through the whole command: skipped with a note, never a traceback.

Real SDK traces (two ranks, two steps; discrete and continuous) get one ``ts`` or ``dur`` replaced by
``Infinity``, ``-Infinity``, ``NaN`` (Python's json writes them), 1e300 or 1.7e308: on a stage range in one
file and on an op in another, the step timeline files removed so the step timeline is built from the
traces. Each runs through ``instrument analyze`` (text, ``--json``, ``--html`` with ``--merged-trace``) and
``instrument compare`` (both ways), read by each reader: the streaming one (standard library), ijson (the
streaming one's fallback) and the plain ``json`` one (no ijson installed).

What each reader does with them is its own: a literal JSON has not (``NaN``, ``Infinity``) makes a streaming
reader skip the file as not JSON (ijson refuses it, and the fast reader words it as ijson); a number no clock
gives (1e300, and the literals where the plain reader accepts them) leaves the event out with a note on the
file. Every other number is as before: nothing infinite or NaN reaches the output.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from instrument import cli, naming
from instrument.analyze.traces import _reader, _stream
from tests.analyze.test_analyze import _run_ranks

WORLD, STEPS = 2, 2
VALUES = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan, "1e300": 1e300, "1.7e308": 1.7e308}
LITERALS = {"Infinity", "-Infinity", "NaN"}  # what JSON has not: only the plain reader reads past them
READERS = ("stream", "ijson", "plain")
LEFT_OUT = "event(s) left out: a ts or dur not finite"


@pytest.fixture(scope="module", params=["discrete", "continuous"])
def good(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real SDK traces of two ranks and two steps: one file per stage, or one per step holding its stages."""
    path = tmp_path_factory.mktemp(f"times-{request.param}") / "profile"
    _run_ranks(path, discrete=request.param == "discrete", world=WORLD, steps=STEPS)
    return path


def _rewrite(path: Path, pick: Any, field: str, value: float) -> None:
    data = json.loads(gzip.decompress(path.read_bytes()))
    event = next(e for e in data["traceEvents"] if e.get("ph") == "X" and pick(e))
    event[field] = value
    path.write_bytes(gzip.compress(json.dumps(data).encode()))  # json writes NaN / Infinity as such


def _stage(event: dict[str, Any]) -> bool:
    name = str(event.get("name"))
    return event.get("cat") == "user_annotation" and not name.startswith(("mini_batch", "ProfilerStep"))


def _hostile(good: Path, tmp_path: Path, field: str, value: float) -> tuple[Path, set[str]]:
    """A copy of ``good`` with the value planted in a stage range and in an op; the names of the two files."""
    save = tmp_path / "hostile"
    shutil.copytree(good, save)
    for timeline in save.glob(f"*{naming.TIMELINE_SUFFIX}"):
        timeline.unlink()  # the step timeline from traces: where ts became ns (round) and raised
    traces = sorted(save.glob("*.pt.trace.json.gz"))
    _rewrite(traces[0], _stage, field, value)
    _rewrite(traces[-1], lambda e: e.get("cat") == "cpu_op", field, value)
    return save, {traces[0].name, traces[-1].name}


@pytest.fixture(params=READERS)
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which reader decodes the files: the streaming one, ijson (its fallback) or plain ``json``."""
    if request.param == "ijson":

        def unfollowed(stream: Any) -> Iterator[Any]:
            raise _stream.UnfollowedError("every file read by ijson")
            yield  # a generator, as the real one

        monkeypatch.setattr(_stream, "events", unfollowed)
    elif request.param == "plain":
        monkeypatch.setattr(_reader, "_have_ijson", lambda: False)
    return str(request.param)


def _strict(text: str) -> Any:
    """JSON as JSON is: ``NaN`` or ``Infinity`` in it fails the test."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in the output")

    return json.loads(text, parse_constant=refuse)


def _numbers(data: Any) -> Iterator[float]:
    if isinstance(data, dict):
        for value in data.values():
            yield from _numbers(value)
    elif isinstance(data, list):
        for value in data:
            yield from _numbers(value)
    elif isinstance(data, float):
        yield data


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main([*args, "--jobs", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Error" not in err, err
    command = f"instrument {args[0]}: "
    assert all(line.startswith(command) for line in err.splitlines()), err
    return rc, out, err


@pytest.mark.parametrize("field", ["ts", "dur"])
@pytest.mark.parametrize("value", list(VALUES))
def test_times_no_clock_could_give_are_skipped_with_a_note_on_every_path(
    good: Path, tmp_path: Path, reader: str, field: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    save, planted = _hostile(good, tmp_path, field, VALUES[value])
    skips = value in LITERALS and reader != "plain"
    files = len(list(good.glob("*.pt.trace.json.gz")))

    rc, out, err = _run(["analyze", str(save), "--json", "--no-png"], capsys)
    data = _strict(out)
    assert all(math.isfinite(x) for x in _numbers(data))
    skipped = {Path(s["path"]).name: s["reason"] for s in data["skipped"]}
    notes = {Path(n["path"]).name: n["reason"] for n in data["notes"] if LEFT_OUT in n["reason"]}
    if skips:
        assert rc == 1 and set(skipped) == planted and not notes, (skipped, notes)
        assert all(reason.startswith("not JSON") for reason in skipped.values()), skipped
        assert data["files"] == files - len(planted)
    else:
        assert rc == 0 and not skipped and set(notes) == planted, (skipped, data["notes"])
        assert all(reason.startswith("1 event(s) left out") for reason in notes.values()), notes
        assert data["files"] == files and data["ranks"] == list(range(WORLD))
        assert f"note: {save}" in err  # said on stderr too, once a file
    assert data["steps"] and data["stages"]  # the rest is analysed

    rc, out, _ = _run(["analyze", str(save), "--no-png"], capsys)
    assert rc == (1 if skips else 0)
    assert not {"inf", "nan", "Infinity", "NaN"} & set(out.replace("│", " ").split()), out

    html, merged = tmp_path / "report.html", tmp_path / "merged.json.gz"
    rc, _, _ = _run(["analyze", str(save), "--no-png", "--html", str(html), "--merged-trace", str(merged)], capsys)
    assert rc == (1 if skips else 0) and html.stat().st_size > 0
    events = _strict(gzip.decompress(merged.read_bytes()).decode())["traceEvents"]
    assert events and all(math.isfinite(x) for x in _numbers(events))

    for pair in ([str(good), str(save)], [str(save), str(good)]):
        rc, out, _ = _run(["compare", *pair, "--json"], capsys)
        assert rc == (1 if skips else 0)
        assert all(math.isfinite(x) for x in _numbers(_strict(out)))
    rc, out, _ = _run(["compare", str(good), str(save)], capsys)
    assert rc == (1 if skips else 0) and out
