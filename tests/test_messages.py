"""Messages that name the fix (issue 27): the extra to install, the keyword meant, the list syntax, the field
as written, a file where a directory should be, and the path the user gave rather than a hidden temp file."""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import pytest

import instrument as ins
from instrument import _tools, metrics, recorders


def _warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` raise ``ModuleNotFoundError`` (as if it were not installed)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


# ------------------------------------------------------------------------------------------- missing extras


def test_a_recorder_whose_package_is_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "nvtx")
    monkeypatch.delitem(sys.modules, "instrument.recorders.nvtx", raising=False)
    # the module path, not a class a previous test may have cached in the registry
    fresh = dataclasses.replace(recorders.registration("nvtx"), factory="instrument.recorders.nvtx:NvtxBackend")
    monkeypatch.setitem(_tools._REGISTRY, "nvtx", fresh)
    with pytest.raises(ModuleNotFoundError, match=r"^tool='nvtx' needs 'nvtx' \(not installed\): ") as caught:
        recorders.recorder_class("nvtx")
    assert "pip install 'instrument-rl[nvtx]'" in str(caught.value)
    assert caught.value.name == "nvtx"


def test_tool_nvtx_without_nvtx_warns_with_the_extra_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _block(monkeypatch, "nvtx")
    monkeypatch.delitem(sys.modules, "instrument.recorders.nvtx", raising=False)
    fresh = dataclasses.replace(recorders.registration("nvtx"), factory="instrument.recorders.nvtx:NvtxBackend")
    monkeypatch.setitem(_tools._REGISTRY, "nvtx", fresh)
    caplog.set_level(logging.WARNING, logger="instrument")

    @ins.profiled_stage("update_actor")
    def update() -> int:
        return 7

    run = ins.configure(ins.ProfilerConfig(tool="nvtx", steps=[1], save_path=str(tmp_path)), role="actor", rank=0)
    with ins.profile_step(1):
        assert update() == 7
    ins.finish()
    assert run.failures >= 1
    assert "pip install 'instrument-rl[nvtx]'" in _warnings(caplog)


def test_a_recorder_that_is_not_ours_keeps_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tools, "_REGISTRY", dict(_tools._REGISTRY))  # process-wide: "elsewhere" goes again after
    recorders.register("elsewhere", "no_such_package_here.module:Recorder")
    with pytest.raises(ModuleNotFoundError, match="No module named 'no_such_package_here'"):
        recorders.recorder_class("elsewhere")


def test_metrics_without_prometheus_client_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _block(monkeypatch, "prometheus_client")
    monkeypatch.setattr(metrics, "_shared", {})  # families not yet made in this process
    caplog.set_level(logging.WARNING, logger="instrument")
    config = ins.ProfilerConfig(tool="none", metrics=True, save_path=str(tmp_path), timeline=False)
    run = ins.configure(config, role="actor", rank=0)
    with ins.profile_step(1):
        pass
    ins.finish()
    assert run.failures == 1
    shown = _warnings(caplog)
    assert "ProfilerConfig(metrics=True) needs 'prometheus_client'" in shown
    assert "pip install 'instrument-rl[metrics]'" in shown


def test_serve_without_prometheus_client_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "prometheus_client")
    with pytest.raises(ModuleNotFoundError, match=r"serve\(\) needs 'prometheus_client'") as caught:
        metrics.serve(0)
    assert "pip install 'instrument-rl[metrics]'" in str(caught.value)


# ------------------------------------------------------------------------------------------- constructors


@pytest.mark.parametrize(
    ("build", "wrong", "meant"),
    [
        (ins.ProfilerConfig, "step", "steps"),
        (ins.ProfilerConfig, "save_dir", "save_path"),
        (ins.Schedule, "actve", "active"),
        (ins.FinishHook, "command", "cmd"),
        (ins.SlowStep, "factr", "factor"),
    ],
)
def test_unknown_keywords_say_did_you_mean(build: type, wrong: str, meant: str) -> None:
    kwargs = {"cmd": "true"} if build is ins.FinishHook else {}
    with pytest.raises(TypeError, match=rf"^{build.__name__}\(\) got an unexpected keyword argument '{wrong}'; "):
        build(**kwargs, **{wrong: (1,)})
    try:
        build(**kwargs, **{wrong: (1,)})
    except TypeError as exc:
        assert str(exc).endswith(f"did you mean {meant!r}?")


def test_an_unknown_keyword_with_no_near_name_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"'zzz'; valid keywords: skip_first, wait, warmup, active, repeat"):
        ins.Schedule(zzz=1)  # type: ignore[call-arg]


def test_known_keywords_and_positional_values_still_build() -> None:
    assert ins.Schedule(0, 1, 0, 2).active == 2
    assert ins.FinishHook("true", timeout_s=5).cmd == "true"
    assert ins.ProfilerConfig(steps=[2, 1]).steps == (1, 2)


@pytest.mark.parametrize("value", ["2,4", " 2, 4 ", "(2,4)"])
def test_steps_written_without_brackets_suggest_a_list(value: str) -> None:
    with pytest.raises(TypeError, match=r"'steps' must be a list of ints or null: .* \(did you mean \[2,4\]\?\)$"):
        ins.ProfilerConfig(steps=value)


def test_steps_from_an_override_without_brackets_suggest_a_list() -> None:
    with pytest.raises(TypeError, match=r"\(did you mean \[2,4\]\?\)"):
        ins.ProfilerConfig.from_overrides(["steps=2,4"])
    with pytest.raises(TypeError, match=r"'ranks' must be a list of ints: 'a,b'$"):  # no guess for non-numbers
        ins.ProfilerConfig(ranks="a,b")


def test_schedule_active_names_the_field_as_written_and_schedule_none() -> None:
    for build in (lambda: ins.Schedule(active=0), lambda: ins.ProfilerConfig.from_overrides(["schedule.active=0"])):
        with pytest.raises(ValueError, match=r"^'schedule\.active' must be >= 1: 0; schedule=None records") as caught:
            build()
        assert "schedule=None" in str(caught.value)


def test_a_save_path_that_is_a_file_says_so(tmp_path: Path) -> None:
    afile = tmp_path / "profile"
    afile.write_text("")
    with pytest.raises(ValueError, match=r"^'save_path' is a file, not a directory: '.*profile'$"):
        ins.ProfilerConfig(save_path=str(afile))
    with pytest.raises(ValueError, match=r"is a file, not a directory: '.*profile/run1' \('.*profile' is\)$"):
        ins.ProfilerConfig(save_path=str(afile / "run1"))
    assert ins.ProfilerConfig(save_path=str(tmp_path / "new" / "dir")).save_path.endswith("dir")


# ------------------------------------------------------------------------------------- quiet by default (issue 32)


def _quick_start_loop(tmp_path: Path, **config: object) -> ins.RunInfo:
    """The README's quick start on this machine (no CUDA): a real torch.profiler trace of one stage."""

    @ins.profiled_stage("update_actor", scheduled=True)
    def update(batch: list[range]) -> None:
        for i, mb in enumerate(batch):
            with ins.profile_window(mini_batch=i):
                sum(x * x for x in mb)

    cfg = ins.ProfilerConfig(steps=(1,), ranks=(0,), save_path=str(tmp_path), **config)  # type: ignore[arg-type]
    run = ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in (1, 2):
        with ins.profile_step(step, last=step == 2):
            update([range(100)] * 2)
    assert ins.finish()  # it did record
    return run


def test_the_default_contents_say_nothing_about_cuda(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the default records it, and there is nothing to warn about either way")
    caplog.set_level(logging.WARNING, logger="instrument")
    run = _quick_start_loop(tmp_path)
    assert _warnings(caplog) == ""  # docs/quickstart.md: profiling is silent
    assert run.failures == 0


def test_cuda_named_without_cuda_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: nothing to warn about")
    caplog.set_level(logging.WARNING, logger="instrument")
    _quick_start_loop(tmp_path / "a", contents=["cpu", "cuda"])
    assert (
        _warnings(caplog)
        == "instrument: contents asks for 'cuda' but CUDA is not available here; recording CPU activity only"
    )


def test_the_default_contents_are_remembered_wherever_a_config_goes() -> None:
    import pickle

    import attrs

    from instrument.config._settings import contents_named

    default, named = ins.ProfilerConfig(), ins.ProfilerConfig(contents=("cpu", "cuda"))
    assert default == named and default.contents == ("cpu", "cuda") and hash(default) == hash(named)
    assert repr(default) == repr(named)  # the mark is invisible
    assert not contents_named(default.contents) and contents_named(named.contents)
    assert not contents_named(pickle.loads(pickle.dumps(default)).contents)  # to a Ray worker
    assert not contents_named(attrs.evolve(default, steps=(2,)).contents)
    assert not contents_named(ins.ProfilerConfig.from_overrides(["steps=[1]"]).contents)
    assert not contents_named(ins.ProfilerConfig.from_dict({"ranks": [1]}).contents)
    assert contents_named(ins.ProfilerConfig.from_overrides(["contents=[cpu,cuda]"]).contents)
    assert not contents_named(default.union(ins.ProfilerConfig(ranks=(1,))).contents)  # neither role named it
    assert contents_named(default.union(ins.ProfilerConfig(contents=["cpu"])).contents)
    assert default.union(ins.ProfilerConfig(contents=["cpu"])).contents == ("cpu", "cuda")
    assert default.intersect(ins.ProfilerConfig(contents=["cpu"])).contents == ("cpu",)
