"""``with profiled_stage(...)`` on the step timeline's shortcut (issue 32): each block is one span of its own
step, nested, threaded, in asyncio tasks, out of order and on errors, as the decorator records it.

Spans carry their own clock values: the tests check which spans there are and how they nest, never how long.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import instrument as ins
from instrument.naming import TIMELINE_SUFFIX
from instrument.timeline import Span, read_timeline


def _configure(tmp_path: Path, **config: object) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "p"), tool="none", **config)  # type: ignore[arg-type]
    ins.configure(cfg, role="actor", rank=0, world_size=1)


def _stages(tmp_path: Path) -> list[Span]:
    ins.finish()
    [path] = (tmp_path / "p").glob(f"*{TIMELINE_SUFFIX}")
    return [s for s in read_timeline(path).spans if s.kind == "stage" and not s.stage.startswith("instrument:")]


def _inside(inner: Span, outer: Span) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


def test_a_block_is_a_span_of_its_step_as_a_decorated_call_is(tmp_path: Path) -> None:
    _configure(tmp_path)

    @ins.profiled_stage("update_actor")
    def update() -> int:
        with ins.profiled_stage("inner"):
            return 1

    for step in (1, 2):
        with ins.profile_step(step), ins.profiled_stage("generate"):
            assert update() == 1
    spans = _stages(tmp_path)
    assert [(s.stage, s.step) for s in sorted(spans, key=lambda s: (s.step, s.start_ns))] == [
        (name, step) for step in (1, 2) for name in ("generate", "update_actor", "inner")
    ]
    for step in (1, 2):
        by_name = {s.stage: s for s in spans if s.step == step}
        assert _inside(by_name["inner"], by_name["update_actor"]) and _inside(
            by_name["update_actor"], by_name["generate"]
        )


def test_one_object_entered_nested_and_again_gives_a_span_each(tmp_path: Path) -> None:
    _configure(tmp_path)
    stage = ins.profiled_stage("rollout")
    with ins.profile_step(1):
        with stage, stage:  # the same object inside itself (recursion): the inner block pushes its own
            pass
        with stage:  # and again after: the object's slot is free once more
            pass
    outer, inner, again = sorted(_stages(tmp_path), key=lambda s: s.start_ns)
    assert _inside(inner, outer) and inner.end_ns <= outer.end_ns and outer.end_ns <= again.start_ns


def test_one_object_in_several_threads_at_once_keeps_each_threads_span(tmp_path: Path) -> None:
    _configure(tmp_path)
    stage = ins.profiled_stage("generate")
    inside, leave = threading.Barrier(4), threading.Event()

    def worker() -> None:
        with stage:
            inside.wait(timeout=60)  # all four inside the one object's block at once
            leave.wait(timeout=60)

    with ins.profile_step(1):
        threads = [threading.Thread(target=worker) for _ in range(3)]
        for thread in threads:
            thread.start()
        with stage:
            inside.wait(timeout=60)
            leave.set()
        for thread in threads:
            thread.join(timeout=60)
    spans = _stages(tmp_path)
    assert len(spans) == 4 and len({s.thread for s in spans}) == 4
    assert all(s.stage == "generate" and s.step == 1 and s.start_ns <= s.end_ns for s in spans)
    # each span is its thread's own: every one began before any ended (they overlapped)
    assert max(s.start_ns for s in spans) <= min(s.end_ns for s in spans)


def test_one_object_in_asyncio_tasks_at_once_keeps_each_tasks_span(tmp_path: Path) -> None:
    _configure(tmp_path)
    stage = ins.profiled_stage("generate")
    order: list[str] = []

    async def request(name: str, gate: asyncio.Event, then: asyncio.Event | None) -> None:
        with stage:
            order.append(f"{name} in")
            if then is not None:
                then.set()
            await gate.wait()
            order.append(f"{name} out")

    async def main() -> None:
        a_gate, b_gate, b_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(request("a", a_gate, None))
        await asyncio.sleep(0)
        b = asyncio.create_task(request("b", b_gate, b_in))
        await b_in.wait()
        a_gate.set()  # a leaves first, while b is still inside: out of order across tasks
        await a
        b_gate.set()
        await b

    with ins.profile_step(1):
        asyncio.run(main())
    assert order == ["a in", "b in", "a out", "b out"]
    first, second = sorted(_stages(tmp_path), key=lambda s: s.start_ns)
    assert first.start_ns <= second.start_ns <= first.end_ns <= second.end_ns  # a's span and b's, overlapping


def test_blocks_closed_out_of_order_by_hand_each_close_their_own(tmp_path: Path) -> None:
    _configure(tmp_path)
    a, b = ins.profiled_stage("a"), ins.profiled_stage("b")
    with ins.profile_step(1):
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)  # a first, b still open
        b.__exit__(None, None, None)
        b.__exit__(None, None, None)  # one exit too many: nothing, no error
    spans = {s.stage: s for s in _stages(tmp_path)}
    assert set(spans) == {"a", "b"}
    assert spans["a"].start_ns <= spans["b"].start_ns and spans["a"].end_ns <= spans["b"].end_ns


def test_an_error_leaves_the_block_recorded_and_goes_on_unchanged(tmp_path: Path) -> None:
    _configure(tmp_path)
    error = ValueError("from training")
    with ins.profile_step(1), pytest.raises(ValueError) as caught, ins.profiled_stage("update_actor"):
        raise error
    assert caught.value is error
    with ins.profile_step(2), ins.profiled_stage("update_actor"):  # the slot was given back
        pass
    assert [(s.stage, s.step) for s in _stages(tmp_path)] == [("update_actor", 1), ("update_actor", 2)]


def test_a_block_across_a_profiled_and_an_unprofiled_step_uses_each_steps_path(tmp_path: Path) -> None:
    """A profiled step records blocks through frames (and the timeline); the next step's shortcut is unaffected."""
    _configure(tmp_path, steps=(1,))
    stage = ins.profiled_stage("generate")
    for step in (1, 2, 3):
        with ins.profile_step(step), stage:
            pass
    assert [(s.stage, s.step) for s in _stages(tmp_path)] == [("generate", 1), ("generate", 2), ("generate", 3)]


def test_building_a_stage_checks_its_arguments_every_time() -> None:
    ins.profiled_stage("update_actor")  # a name checked once ...
    with pytest.raises(TypeError, match=r"^'scheduled' must be true or false: 1$"):
        ins.profiled_stage("update_actor", scheduled=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^'name' must be a non-empty stage name"):
        ins.profiled_stage(["update_actor"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quotes, backslashes or control characters"):
        ins.profiled_stage("update_actor", role='a"b')
    with pytest.raises(TypeError, match="profiled_stage needs a stage name"):
        ins.profiled_stage(print)  # type: ignore[arg-type]
