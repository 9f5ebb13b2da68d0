"""The findings registry: one signature, one list, ranked in one place, said everywhere a report is."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from instrument import cli
from instrument.analyze import (
    Finding,
    TimelineAnalysis,
    analyze,
    register_finding,
    registered_findings,
    render_text,
    unregister_finding,
    write_html,
)
from tests.analyze.analyzers.test_timeline import disaggregated, write_timelines

PLANTED = "every step of this run was planted by a test (10,000 ms a step, by its own count)"


def planted(analysis: TimelineAnalysis) -> Iterable[Finding]:
    """A rule a test adds: it loses more time than any built-in finding, so it must be said first."""
    yield Finding("planted", PLANTED, 10_000.0, None, None, None, tuple(s.step for s in analysis.steps))


def modest(analysis: TimelineAnalysis) -> Iterable[Finding]:
    """A rule whose loss (0.5 ms a step) ranks it below every built-in finding of the run."""
    return [Finding("modest", "a modest finding", 0.5, None, None, None, ())]


def broken(analysis: TimelineAnalysis) -> Iterable[Finding]:
    raise RuntimeError("a bug in a rule")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "profile"
    directory.mkdir()
    write_timelines(directory, disaggregated(), {r: r * 1_000_000_000 for r in range(8)})
    return directory


@pytest.fixture
def rules() -> Iterator[None]:
    register_finding(planted)
    register_finding(modest)
    try:
        yield
    finally:
        unregister_finding(planted)
        unregister_finding(modest)


def test_the_built_in_rules_are_the_list() -> None:
    assert [r.__name__ for r in registered_findings()] == [
        "stragglers",
        "bubbles",
        "dominant_stage",
        "slow_steps",
        "instrument_time",
    ]


def test_registering_twice_keeps_one_and_unregistering_an_absent_rule_is_no_error() -> None:
    register_finding(planted)
    register_finding(planted)
    try:
        assert registered_findings().count(planted) == 1
    finally:
        unregister_finding(planted)
    unregister_finding(planted)
    assert planted not in registered_findings()


def test_a_rule_must_be_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        register_finding("planted")  # type: ignore[arg-type]


@pytest.mark.usefixtures("rules")
def test_an_added_finding_is_ranked_among_the_others(run_dir: Path) -> None:
    findings = analyze(run_dir).timeline.findings  # type: ignore[union-attr]
    kinds = [f.kind for f in findings]
    assert kinds[0] == "planted"  # the most time lost per step
    assert kinds[-1] == "modest"  # the least
    assert "straggler" in kinds[1:-1]
    assert [f.lost_ms for f in findings] == sorted((f.lost_ms for f in findings), reverse=True)


@pytest.mark.usefixtures("rules")
def test_an_added_finding_is_said_in_text_html_and_json(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = analyze(run_dir)
    text = render_text(report)
    assert PLANTED in text
    assert text.index(PLANTED) < text.index("rollout generate_sequences on rank 7")  # ranked first
    page = tmp_path / "page.html"
    write_html(report, page)
    assert PLANTED in page.read_text()
    assert cli.main(["analyze", str(run_dir), "--json", "--no-png", "--quiet"]) == 0
    said = json.loads(capsys.readouterr().out)["findings"]
    assert said[0]["kind"] == "planted" and said[0]["text"] == PLANTED and said[0]["lost_ms"] == 10_000.0
    assert said[-1]["kind"] == "modest"


def test_a_rule_that_raises_is_left_out_with_a_warning(run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    register_finding(broken)
    try:
        report = analyze(run_dir)
    finally:
        unregister_finding(broken)
    assert report.timeline is not None
    assert any(f.kind == "straggler" for f in report.timeline.findings)
    assert [r.getMessage() for r in caplog.records if "broken" in r.getMessage()] == [
        "instrument analyze: finding rule broken failed, its findings are left out: RuntimeError('a bug in a rule')"
    ]
