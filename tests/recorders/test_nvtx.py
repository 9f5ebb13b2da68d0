"""The NVTX backend, observed through a logging NVTX tool (tests/nvtx_support) instead of Nsight Systems.

Every scenario runs in its own interpreter (NVTX attaches a tool once per process, at the first
call) and ends with a mark in a ``test`` domain, so the tool initialises even where the backend
emits nothing. Markers the scenarios drop into that domain are ordered with the backend's ranges
in the log, which is how the tests see what a range or a capture range covers.
"""

from __future__ import annotations

import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
from tests.conftest import without_timeline
from tests.nvtx_support import fixtures
from tests.nvtx_support.fixtures import ToolEvents, run_with_tool

nvtx_tool = fixtures.nvtx_tool  # the session fixture: the logging tool, built once

Event = dict[str, Any]

_PRELUDE = '''
import asyncio
import sys

import nvtx

import instrument as ins
import instrument.recorders.nvtx as nvtx_backend


def note(text):
    """A marker in the tool's log, ordered with the backend's ranges."""
    nvtx.mark(message=text, domain="test")


class BoomError(Exception):
    pass


class CaptureRecorder:
    """Stands in for cudaProfilerStart/Stop (no GPU here): logs where each capture range opens and closes."""

    def start(self):
        note("capture_start")

    def stop(self):
        note("capture_stop")


class Worker:
    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self):
        pass

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, n, fail_at=None):
        for i in range(n):
            with ins.profile_window(mini_batch=i):
                if i == fail_at:
                    raise BoomError("user error")


def run(cfg, *, steps, rank=0, world=1, mini_batches=2, role="actor"):
    ins.configure(cfg, role=role, rank=rank, world_size=world)
    worker = Worker()
    for step in range(1, steps + 1):
        with ins.profile_step(step, last=(step == steps)):
            worker.compute_log_prob()
            worker.update_actor(mini_batches)
    ins.finish()
'''


def _scenario(body: str) -> str:
    return _PRELUDE + textwrap.dedent(body) + '\nnote("end")\n'


def _run(tool: Path, tmp: Path, body: str) -> ToolEvents:
    return run_with_tool(tool, _scenario(body), tmp)


def _ours(events: list[Event]) -> list[Event]:
    """The backend's events: those in the ``instrument`` domain."""
    return [e for e in events if e["domain"] == "instrument"]


def _pushes(events: list[Event]) -> list[str]:
    return [e["msg"] for e in _ours(events) if e["ev"] == "push"]


def _timeline(events: list[Event]) -> list[str]:
    """Ranges of the backend and the scenario's markers, e.g. ``push update_actor step1``, ``capture_start``."""
    lines = []
    for event in events:
        if event["domain"] == "instrument" and event["ev"] in {"push", "pop", "start", "end"}:
            lines.append(f"{event['ev']} {event['msg']}" if event["msg"] is not None else event["ev"])
        elif event["domain"] == "test" and event["ev"] == "mark" and event["msg"] != "end":
            lines.append(event["msg"])
    return lines


def _category_names(events: list[Event]) -> dict[int, str]:
    return {e["cat"]: e["msg"] for e in events if e["ev"] == "category" and e["domain"] == "instrument"}


def _assert_balanced(events: list[Event]) -> None:
    """Every pop closes the innermost open push of its thread and domain, every start has one end, none left open."""
    stacks: dict[tuple[int, str | None], list[Event]] = defaultdict(list)
    started: dict[int, Event] = {}
    ended: set[int] = set()
    for event in events:
        key = (event["tid"], event["domain"])
        if event["ev"] == "push":
            assert event["depth"] == len(stacks[key]), event
            stacks[key].append(event)
        elif event["ev"] == "pop":
            assert stacks[key], f"pop with nothing open: {event}"
            assert stacks[key].pop()["msg"] == event["msg"], event
            assert event["depth"] == len(stacks[key]), event
        elif event["ev"] == "start":
            assert event["id"] not in started, f"range id reused: {event}"
            started[event["id"]] = event
        elif event["ev"] == "end":
            assert event["id"] in started and event["id"] not in ended, f"end without its start: {event}"
            ended.add(event["id"])
    assert not {key: [e["msg"] for e in s] for key, s in stacks.items() if s}, "ranges left open"
    assert set(started) == ended, "start ranges never ended"


def _expected_discrete(steps: list[int], mini_batches: int = 2) -> list[str]:
    pushes = []
    for step in steps:
        pushes += [f"compute_log_prob step{step}", f"update_actor step{step}"]
        pushes += [f"mini_batch{i} step{step}" for i in range(mini_batches)]
    return pushes


# ---------------------------------------------------------------------- the tool itself


def test_the_tool_logs_what_the_nvtx_package_emits(nvtx_tool: Path, tmp_path: Path) -> None:
    """Registered strings resolve to text; categories, colours, payloads, depths, ids and threads are logged."""
    script = textwrap.dedent(
        """
        import threading
        import nvtx
        domain = nvtx.get_domain("demo")
        print(type(domain).__name__)
        domain.push_range(message='outer "q"', color=0xFF102030, category="actor", payload=7)
        domain.push_range(message="inner", category="actor")
        domain.pop_range()
        domain.pop_range()
        range_id = domain.start_range(message="async", payload=2)
        domain.end_range(range_id)
        nvtx.push_range("no domain")
        nvtx.pop_range()
        def worker():
            domain.push_range(message="thread")
            domain.pop_range()
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        domain.pop_range()
        print(range_id)
        """
    )
    events = run_with_tool(nvtx_tool, script, tmp_path)
    assert events.stdout.split()[0] == "Domain"  # a DummyDomain would mean no tool attached
    by_msg = {e["msg"]: e for e in events if e["ev"] in {"push", "start"}}
    outer, inner = by_msg['outer "q"'], by_msg["inner"]
    assert (outer["domain"], outer["color"], outer["payload"], outer["depth"]) == ("demo", 0xFF102030, 7, 0)
    assert (inner["depth"], inner["payload"]) == (1, None)
    assert {e["cat"]: (e["domain"], e["msg"]) for e in events if e["ev"] == "category"} == {
        outer["cat"]: ("demo", "actor")
    }
    assert inner["cat"] == outer["cat"]
    start = by_msg["async"]
    (end,) = [e for e in events if e["ev"] == "end"]
    assert start["id"] == end["id"] == int(events.stdout.split()[1])
    assert by_msg["no domain"]["domain"] is None
    assert by_msg["thread"]["tid"] != outer["tid"]
    pops = [e for e in events if e["ev"] == "pop"]
    assert [p["msg"] for p in pops[:2]] == ["inner", 'outer "q"']
    assert pops[-1].get("unmatched") is True  # the stray pop at the end
    _assert_balanced(events[: events.index(pops[-1])])


# ---------------------------------------------------------------------- what is emitted, and where


def test_ranges_only_on_profiled_steps_and_ranks(nvtx_tool: Path, tmp_path: Path) -> None:
    body = """
    cfg = ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1, 3), ranks=(0,))
    run(cfg, steps=3, rank={rank}, world=2)
    """
    profiled = _run(nvtx_tool, tmp_path / "rank0", body.format(rank=0))
    assert _pushes(profiled) == _expected_discrete([1, 3])
    assert {e["payload"] for e in _ours(profiled) if e["ev"] == "push"} == {1, 3}
    assert [e for e in _ours(profiled) if e["ev"] in {"start", "end", "mark"}] == []
    _assert_balanced(profiled)

    unprofiled = _run(nvtx_tool, tmp_path / "rank1", body.format(rank=1))
    assert _ours(unprofiled) == []  # not even the domain is created


def test_one_domain_a_category_per_role_a_colour_per_stage_and_the_step_as_payload(
    nvtx_tool: Path, tmp_path: Path
) -> None:
    body = """
    cfg = ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=({steps}), discrete={discrete})
    run(cfg, steps=3, role={role!r})
    """
    runs = {
        "actor": _run(nvtx_tool, tmp_path / "a", body.format(steps="1, 2", discrete=True, role="actor")),
        "actor_rollout_ref": _run(
            nvtx_tool, tmp_path / "b", body.format(steps="3,", discrete=False, role="actor_rollout_ref")
        ),
    }
    colours: dict[str, set[int]] = defaultdict(set)
    for role, events in runs.items():
        ranges = [e for e in events if e["ev"] in {"push", "start"} and e["domain"] != "test"]
        assert ranges
        assert {e["domain"] for e in ranges} == {"instrument"}
        names = _category_names(events)
        assert {names.get(e["cat"]) for e in ranges} == {role}
        for event in ranges:
            label, _, step = event["msg"].rpartition(" ")
            assert event["payload"] == int(step.removeprefix("step")), event
            assert isinstance(event["color"], int), event
            if label.startswith(("compute_log_prob", "update_actor")):
                colours[label].add(event["color"])
    assert set(colours) == {"compute_log_prob", "update_actor"}
    assert all(len(c) == 1 for c in colours.values()), f"a stage changed colour: {dict(colours)}"


def test_mini_batch_ranges_nest_inside_their_stage(nvtx_tool: Path, tmp_path: Path) -> None:
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        cfg = ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(2,))
        run(cfg, steps=2, mini_batches=3)
        """,
    )
    assert _timeline(events) == [
        "push compute_log_prob step2",
        "pop compute_log_prob step2",
        "push update_actor step2",
        "push mini_batch0 step2",
        "pop mini_batch0 step2",
        "push mini_batch1 step2",
        "pop mini_batch1 step2",
        "push mini_batch2 step2",
        "pop mini_batch2 step2",
        "pop update_actor step2",
    ]
    depths = {e["msg"]: e["depth"] for e in _ours(events) if e["ev"] == "push"}
    assert depths["update_actor step2"] == 0
    assert {depths[f"mini_batch{i} step2"] for i in range(3)} == {1}
    _assert_balanced(events)


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_a_stage_that_raises_pops_every_range_and_the_error_reaches_the_user(
    nvtx_tool: Path, tmp_path: Path, discrete: bool
) -> None:
    events = _run(
        nvtx_tool,
        tmp_path,
        f"""
        cfg = ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1, 2), discrete={discrete})
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        worker = Worker()
        try:
            with ins.profile_step(1):
                worker.update_actor(3, fail_at=1)
        except BoomError as exc:
            note("caught")
            print("CAUGHT", type(exc).__name__, exc)
        with ins.profile_step(2):  # the next step is recorded as usual
            worker.update_actor(1)
        ins.finish()
        """,
    )
    assert "CAUGHT BoomError user error" in events.stdout
    (caught,) = [e for e in events if e["domain"] == "test" and e["msg"] == "caught"]
    _assert_balanced(events[: events.index(caught)])  # closed by the time the user sees the error
    _assert_balanced(events)
    pushes = _pushes(events)
    step1 = ["update_actor step1", "mini_batch0 step1", "mini_batch1 step1"]
    step2 = ["update_actor step2", "mini_batch0 step2"]
    assert pushes == (step1 + step2 if discrete else ["step1", *step1, "step2", *step2])


def test_an_async_stage_uses_start_end_ranges_that_cover_the_awaited_work(nvtx_tool: Path, tmp_path: Path) -> None:
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        @ins.profiled_stage("generate_sequences")
        async def generate(i):
            note(f"begin{i}")
            await asyncio.sleep(0.01)
            note(f"done{i}")
            return i

        async def main():
            return await asyncio.gather(generate(0), generate(1))  # interleaved on one thread

        ins.configure(ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1,)), role="rollout",
                      rank=0, world_size=1)
        with ins.profile_step(1):
            print("RESULT", asyncio.run(main()))
        ins.finish()
        """,
    )
    assert "RESULT [0, 1]" in events.stdout
    assert _pushes(events) == []  # push/pop nest per thread: wrong for interleaved coroutines
    _assert_balanced(events)
    timeline = [e for e in events if e["domain"] in {"instrument", "test"}]
    starts = [e for e in timeline if e["ev"] == "start"]
    assert [s["msg"] for s in starts] == ["generate_sequences step1"] * 2
    assert len({s["id"] for s in starts}) == 2
    names = _category_names(events)
    assert {(names.get(s["cat"]), s["payload"]) for s in starts} == {("rollout", 1)}
    position = {id(e): i for i, e in enumerate(timeline)}
    marks = {e["msg"]: position[id(e)] for e in timeline if e["ev"] == "mark"}
    for i, start in enumerate(starts):  # coroutine i opens its range before its first marker
        (end,) = [e for e in timeline if e["ev"] == "end" and e["id"] == start["id"]]
        assert position[id(start)] < marks[f"begin{i}"] < marks[f"done{i}"] < position[id(end)]


def test_continuous_mode_wraps_each_profiled_step_in_a_step_range(nvtx_tool: Path, tmp_path: Path) -> None:
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        cfg = ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1, 3), discrete=False,
                                 schedule=ins.Schedule(active=1))
        run(cfg, steps=3)
        """,
    )
    _assert_balanced(events)
    pushes = [(e["msg"], e["depth"]) for e in _ours(events) if e["ev"] == "push"]
    expected = []
    for step in (1, 3):
        expected += [(f"step{step}", 0), (f"compute_log_prob step{step}", 1), (f"update_actor step{step}", 1)]
        expected += [(f"mini_batch{i} step{step}", 2) for i in range(2)]
    assert pushes == expected
    outer = [e for e in _ours(events) if e["ev"] == "push" and e["depth"] == 0]
    assert [e["payload"] for e in outer] == [1, 3]
    assert {_category_names(events).get(e["cat"]) for e in outer} == {"actor"}


# ---------------------------------------------------------------------- capture ranges


def _capture_pairs(timeline: list[str]) -> list[list[str]]:
    """The ranges inside each capture range, which must open and close alternately."""
    pairs: list[list[str]] = []
    inside = False
    for line in timeline:
        if line == "capture_start":
            assert not inside, f"capture range opened twice: {timeline}"
            inside = True
            pairs.append([])
        elif line == "capture_stop":
            assert inside, f"capture range closed while none was open: {timeline}"
            inside = False
        elif inside:
            pairs[-1].append(line)
    assert not inside, "a capture range was left open"
    return pairs


def test_discrete_mode_opens_one_capture_range_per_profiled_stage(nvtx_tool: Path, tmp_path: Path) -> None:
    """cudaProfilerStart/Stop are replaced by a recorder (``CUDA_PROFILER``) because there is no GPU here."""
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        nvtx_backend.CUDA_PROFILER = CaptureRecorder()
        run(ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1, 3)), steps=3)
        """,
    )
    expected = []
    for s in (1, 3):
        expected.append([f"push compute_log_prob step{s}", f"pop compute_log_prob step{s}"])
        update = [f"push update_actor step{s}"]
        update += [f"{ev} mini_batch{i} step{s}" for i in range(2) for ev in ("push", "pop")]
        expected.append([*update, f"pop update_actor step{s}"])
    timeline = _timeline(events)
    assert _capture_pairs(timeline) == expected
    assert timeline.count("capture_start") == 4


def test_continuous_mode_opens_one_capture_range_per_profiled_step(nvtx_tool: Path, tmp_path: Path) -> None:
    """cudaProfilerStart/Stop are replaced by a recorder (``CUDA_PROFILER``) because there is no GPU here.

    Each capture range must hold the whole step, its outer ``step{S}`` range included: nsys
    records only what happens inside a capture range.
    """
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        nvtx_backend.CUDA_PROFILER = CaptureRecorder()
        run(ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(2, 3), discrete=False), steps=3)
        """,
    )
    timeline = _timeline(events)
    assert timeline.count("capture_start") == timeline.count("capture_stop") == 2
    pairs = _capture_pairs(timeline)
    assert [p[0] for p in pairs] == ["push step2", "push step3"]
    assert [p[-1] for p in pairs] == ["pop step2", "pop step3"]
    assert sum(len(p) for p in pairs) == len(timeline) - 4  # no range outside a capture range


def test_a_scheduled_stage_captures_only_its_recorded_window(nvtx_tool: Path, tmp_path: Path) -> None:
    """cudaProfilerStart/Stop are replaced by a recorder (``CUDA_PROFILER``) because there is no GPU here.

    Schedule(wait=1, active=2) over 5 mini-batches records mini-batches 1-2: one capture range.
    """
    events = _run(
        nvtx_tool,
        tmp_path,
        """
        nvtx_backend.CUDA_PROFILER = CaptureRecorder()
        ins.configure(ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1,),
                                         schedule=ins.Schedule(wait=1, active=2)),
                      role="actor", rank=0, world_size=1)
        with ins.profile_step(1):
            Worker().update_actor(5)
        ins.finish()
        """,
    )
    timeline = [line for line in _timeline(events) if "update_actor" not in line]  # a stage range is optional
    assert _capture_pairs(timeline) == [
        ["push mini_batch1 step1", "pop mini_batch1 step1", "push mini_batch2 step1", "pop mini_batch2 step1"]
    ]
    assert timeline.index("capture_start") == timeline.index("pop mini_batch0 step1") + 1
    assert timeline.index("capture_stop") == timeline.index("push mini_batch3 step1") - 1
    _assert_balanced(events)


_REPEATED_STAGES = """
class Fast:
    @ins.profiled_stage("rollout")
    def rollout(self, fail=False):
        self.score()
        with ins.profile_window(mini_batch=0):
            pass
        if fail:
            raise BoomError("user error")

    @ins.profiled_stage("score")
    def score(self):
        pass


ins.configure(ins.ProfilerConfig(tool="nvtx", save_path="profile", steps=(1,)), role="actor", rank=0, world_size=1)
fast = Fast()
with ins.profile_step(1):
    for call in range(3):
        try:
            fast.rollout(fail=(call == 2))
        except BoomError:
            note("raised")
ins.finish()
"""

_ONE_CALL = ["push rollout step1", "push score step1", "pop score step1", "push mini_batch0 step1"]
_ONE_CALL += ["pop mini_batch0 step1", "pop rollout step1"]


def test_repeated_discrete_stages_keep_their_capture_ranges_on_the_fast_path(nvtx_tool: Path, tmp_path: Path) -> None:
    """cudaProfilerStart/Stop are replaced by a recorder (``CUDA_PROFILER``) because there is no GPU here.

    The first call of a stage in a step goes through the session; the next ones open their
    capture range and range by themselves (a fast path). Seen from the tool, every call looks the
    same: one capture range around the outer stage, the nested stage and the mini-batch inside it,
    also when the stage raises.
    """
    events = _run(nvtx_tool, tmp_path, "nvtx_backend.CUDA_PROFILER = CaptureRecorder()\n" + _REPEATED_STAGES)
    timeline = _timeline(events)
    assert _capture_pairs([line for line in timeline if line != "raised"]) == [_ONE_CALL] * 3
    assert timeline[-1] == "raised"
    _assert_balanced(events)


def test_without_cuda_repeated_discrete_stages_are_ranges_only(nvtx_tool: Path, tmp_path: Path) -> None:
    """The real capture-range seam on a machine without CUDA (torch imported, CPU build): no capture
    ranges, the same ranges on the first call and on the fast path, and nothing absorbed."""
    pytest.importorskip("torch")
    body = "import torch\n" + _REPEATED_STAGES + "assert ins.current_run().failures == 0, ins.current_run()\n"
    events = _run(nvtx_tool, tmp_path, body)
    assert [line for line in _timeline(events) if line != "raised"] == _ONE_CALL * 3
    _assert_balanced(events)


# ---------------------------------------------------------------------- in this process (no tool attached)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_without_a_tool_the_backend_is_silent_and_still_brackets_capture_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cudaProfilerStart/Stop are replaced by a recorder (``CUDA_PROFILER``) because there is no GPU here.

    No NVTX tool is attached to the test process, so the ``nvtx`` package hands out a
    do-nothing domain: the backend must run without a single absorbed failure.
    """
    pytest.importorskip("nvtx")
    import instrument.recorders.nvtx as nvtx_backend

    recorder = _Recorder()
    monkeypatch.setattr(nvtx_backend, "CUDA_PROFILER", recorder)
    session = ins.configure(
        ins.ProfilerConfig(tool="nvtx", save_path=str(tmp_path), steps=(1, 2)), role="actor", rank=0, world_size=1
    )

    @ins.profiled_stage("compute_log_prob")
    def stage() -> int:
        return 42

    for step in (1, 2, 3):
        with ins.profile_step(step):
            assert stage() == 42
    ins.finish()
    assert session.failures == 0
    assert recorder.calls == ["start", "stop"] * 2


def test_the_torch_tool_does_not_import_nvtx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    for name in [m for m in sys.modules if m == "nvtx" or m.startswith(("nvtx.", "instrument.recorders.nvtx"))]:
        monkeypatch.delitem(sys.modules, name)
    ins.configure(
        ins.ProfilerConfig(tool="torch", save_path=str(tmp_path), steps=(1,), contents=("cpu",)),
        role="actor",
        rank=0,
        world_size=1,
    )

    @ins.profiled_stage("compute_log_prob")
    def stage() -> None:
        pass

    with ins.profile_step(1):
        stage()
    assert len(without_timeline(ins.finish())) == 1
    assert "nvtx" not in sys.modules
    assert "instrument.recorders.nvtx" not in sys.modules
