"""Session-level behaviour of configure(): the CUPTI rule between a CUPTI recorder (torch) and NVTX injection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import instrument as ins
from instrument import _tools, recorders
from instrument.testing import RecordingRecorder


@pytest.mark.parametrize(
    ("tool", "contents", "keep", "kept"),
    [
        ("torch", ("cpu", "cuda"), None, False),  # torch with CUDA: nsys's injection would take CUPTI
        ("torch", ("cpu",), None, True),  # no CUDA activity: nothing to fight over
        ("nvtx", ("cpu", "cuda"), None, True),  # the NVTX backend needs the injection
        ("torch", ("cpu", "cuda"), "1", True),  # the documented override
    ],
)
def test_nvtx_injection_is_dropped_only_under_torch_with_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool: str, contents: tuple[str, ...], keep: str | None, kept: bool
) -> None:
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    if keep is not None:
        monkeypatch.setenv("INSTRUMENT_KEEP_NVTX_INJECTION", keep)
    ins.configure(ins.ProfilerConfig(tool=tool, contents=contents, save_path=str(tmp_path)), role="actor", rank=0)
    assert ("NVTX_INJECTION64_PATH" in os.environ) is kept


@pytest.mark.parametrize(
    ("tool", "kept"),
    [
        ("torch+torch_memory", False),  # any part that uses CUPTI decides
        ("torch_memory", True),  # memory snapshots do not use CUPTI
        ("cupti_probe", False),  # what a recorder uses is its registration's to say, not its name
        ("plain_probe", True),
    ],
)
def test_a_recorder_that_declares_cupti_drops_nvtx_injection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tool: str, kept: bool
) -> None:
    monkeypatch.setattr(_tools, "_REGISTRY", dict(_tools._REGISTRY))  # the registry is process-wide
    recorders.register("cupti_probe", RecordingRecorder, uses_cupti=True)
    recorders.register("plain_probe", RecordingRecorder)
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    ins.configure(ins.ProfilerConfig(tool=tool, save_path=str(tmp_path)), role="actor", rank=0, world_size=1)
    assert ("NVTX_INJECTION64_PATH" in os.environ) is kept
