"""Memory on the CPU, for real: torch.profiler's ``[memory]`` events and its memory timeline.

``contents`` ``memory`` turns on ``profile_memory`` (allocation events in the trace); with ``shapes``
and ``stack`` as well, each trace also gets ``{name}.memory-timeline.html``, torch's
``export_memory_timeline`` plot (deprecated by torch in favour of CUDA snapshots, which the CPU
does not have; it still works on the CPU in torch 2.13). Without ``shapes`` and ``stack`` torch
refuses to build a timeline, which is why none is written then.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import instrument as ins  # noqa: E402
from instrument.naming import parse_trace_name  # noqa: E402
from instrument.recorders.torch import MEMORY_TIMELINE_SUFFIX, wants_memory_timeline  # noqa: E402
from tests.conftest import event_names  # noqa: E402


def _train(save: Path, contents: tuple[str, ...], schedule: ins.Schedule | None = None) -> None:
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(1,), contents=contents, schedule=schedule)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    @ins.profiled_stage("update_actor", scheduled=True)
    def update() -> None:
        for i in range(2):
            with ins.profile_window(mini_batch=i):
                model(torch.randn(32, 64)).sum().backward()

    with ins.profile_step(1):
        update()
    ins.finish()


def test_memory_events_and_a_timeline_beside_each_trace(tmp_path: Path) -> None:
    _train(tmp_path, ("cpu", "memory", "shapes", "stack"), ins.Schedule(active=1, repeat=2))
    traces = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    timelines = sorted(tmp_path.glob(f"*{MEMORY_TIMELINE_SUFFIX}"))
    assert len(traces) == len(timelines) == 2  # one per window
    assert all("[memory]" in event_names(trace) for trace in traces)
    windows = sorted(parse_trace_name(t.name).window for t in timelines)  # type: ignore[union-attr,type-var]
    assert windows == [(0, 0), (1, 1)]
    for timeline in timelines:
        assert "<img src='data:image/png;base64," in timeline.read_text()
    # beside its trace under the same name, timestamp included: the pairing docs/memory.md promises
    paired = {t.name.removesuffix(MEMORY_TIMELINE_SUFFIX) for t in timelines}
    assert paired == {t.name.removesuffix(".pt.trace.json.gz") for t in traces}
    (manifest,) = tmp_path.glob("instrument-manifest-*.jsonl")
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    listed = {r["path"]: r for r in records}
    assert {t.name for t in timelines} <= set(listed)
    assert all(listed[t.name]["bytes"] == t.stat().st_size for t in timelines)


def test_memory_without_shapes_and_stack_gets_events_but_no_timeline(tmp_path: Path) -> None:
    _train(tmp_path, ("cpu", "memory"))
    (trace,) = tmp_path.glob("*.pt.trace.json.gz")
    assert "[memory]" in event_names(trace)
    assert not list(tmp_path.glob(f"*{MEMORY_TIMELINE_SUFFIX}"))


def test_torch_refuses_a_timeline_without_shapes_and_stack() -> None:
    """Why ``wants_memory_timeline`` asks for all three contents: torch's own check."""
    assert wants_memory_timeline(("memory", "shapes", "stack"))
    assert not wants_memory_timeline(("cpu", "memory", "shapes"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.randn(8, 8).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="record_shapes=True, with_stack=True required for memory profiling"):
            prof.export_memory_timeline("unused.html", device="cpu")
