"""``ProfilerConfig.from_file``: the library's way to read a YAML or JSON configuration.

The hostile files (FIFOs, alias bombs, deep nesting, huge files, bad bytes) are covered through the
command line in ``test_plan_scale.py``; these tests pin the library call itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from instrument import ProfilerConfig
from instrument.cli import load_config


def test_yaml_and_json_files_with_overrides_after_them(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "a.yaml").write_text("steps: [1, 2]\nschedule: {active: 2}\n")
    (tmp_path / "a.json").write_text('{"steps": [1, 2], "schedule": {"active": 2}}')
    from_yaml = ProfilerConfig.from_file(tmp_path / "a.yaml", ["steps=[3]"])
    from_json = ProfilerConfig.from_file(str(tmp_path / "a.json"), ("steps=[3]",))
    assert from_yaml == from_json
    assert from_yaml.steps == (3,) and from_yaml.schedule is not None and from_yaml.schedule.active == 2
    assert load_config(tmp_path / "a.json", ["steps=[3]"]) == from_json  # the CLI reads files the same way
    assert load_config(None, ["steps=[3]"]).steps == (3,)


def test_one_string_of_overrides_is_refused(tmp_path: Path) -> None:
    """``list("steps=[1]")`` would be nine one-character overrides: refuse the string itself."""
    path = tmp_path / "a.json"
    path.write_text("{}")
    with pytest.raises(TypeError, match=r"a list of 'key=value' strings, not one string: 'steps=\[1\]'"):
        ProfilerConfig.from_file(path, "steps=[1]")


@pytest.mark.parametrize(
    ("text", "overrides", "kind", "message"),
    [
        ("[1, 2]", [], ValueError, "bad.json: the configuration must be a mapping at the top level"),
        ('{"steps": [1', [], ValueError, "bad.json: invalid JSON at line 1, column"),
        ('{"tool": "perf"}', ["steps=[1]"], ValueError, "bad.json: 'tool' must be one of"),
        ('{"steps": [1]}', ["schedule.active=0"], ValueError, "'schedule.active' must be >= 1: 0"),
        ('{"discrete": "yes"}', [], TypeError, "bad.json: 'discrete' must be true or false: 'yes'"),
    ],
)
def test_errors_are_one_line_and_blame_the_file_only_when_it_is_wrong(
    tmp_path: Path, text: str, overrides: list[str], kind: type[Exception], message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(kind) as caught:
        ProfilerConfig.from_file(path, overrides)
    shown = str(caught.value)
    assert message in shown and "\n" not in shown
    assert ("bad.json" in shown) == message.startswith("bad.json")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read configuration .*nope\.yaml: No such file or directory"):
        ProfilerConfig.from_file(tmp_path / "nope.yaml")
