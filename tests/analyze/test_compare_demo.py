"""The demo's ``--slow-stage NAME:FACTOR``: the pair of runs ``docs/compare.md`` compares.

Only what does not depend on the clock is checked: the option's words, and that the planted op (``aten::mm``)
runs inside the slowed stage and nowhere else. How much slower the stage is depends on the machine.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:  # the examples import each other as top-level modules, as when run as scripts
    sys.path.insert(0, str(EXAMPLES))

import ppo_demo  # noqa: E402

from instrument.analyze.traces._ops import read_ops  # noqa: E402


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("update_actor", "must be NAME:FACTOR"),
        ("update_actor:0.5", "FACTOR >= 1"),
        ("update_actor:fast", "FACTOR >= 1"),
        ("policy:2", "no stage named 'policy'"),
        ("nothing:2", "no stage named 'nothing'"),
    ],
)
def test_a_bad_slow_stage_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ppo_demo.parse_slow_stage(text)


def test_a_bad_slow_stage_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = ppo_demo.main(["--slow-stage", "update_actor:x", f"save_path={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "'slow_stage' must be NAME:FACTOR" in err
    assert not (tmp_path / "out").exists()


def test_the_slowed_stage_runs_the_planted_op_and_no_other_stage_does(tmp_path: Path) -> None:
    assert ppo_demo.parse_slow_stage("compute_log_prob:2") == ("compute_log_prob", 2.0)
    result = ppo_demo.run_demo(
        num_steps=1,
        overrides=["steps=[1]", f"save_path={tmp_path / 'p'}", "finish_hook=null"],
        slow_stage=("compute_log_prob", 2.0),
        out=io.StringIO(),
    )
    calls = {}
    for trace in result.traces:
        stage = trace.name.split("_")[1]
        tables = read_ops(str(trace), {stage: None})
        calls[stage] = tables[stage][None].rows.get(("op", "aten::mm"), [0.0, 0.0])[1]
    assert calls["compute-log-prob"] >= 1
    assert calls["compute-ref-log-prob"] == 0 and calls["generate-sequences"] == 0
