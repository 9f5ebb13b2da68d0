"""Tests for :mod:`instrument.schedule` against the real ``torch.profiler``.

The module under test promises to answer exactly what ``torch.profiler.schedule``
answers (:func:`action_at`), to name the window a recorded step belongs to
(:func:`window_of`), and to list the traces a real ``torch.profiler.profile`` hands
to ``on_trace_ready`` for a loop of ``step()`` after every mini-batch and ``stop()``
after the loop (:func:`plan`).  Each promise is checked against torch itself, and
a few worked examples (computed by hand from the schedule rule in DESIGN.md)
document the behaviour.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerAction, ProfilerActivity

from instrument.config import Schedule
from instrument.schedule import Action, Window, action_at, plan, recorded, window_of

RECORDED = (Action.RECORD, Action.RECORD_AND_SAVE)


# --------------------------------------------------------------------------- helpers


@contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence torch's ``warmup == 0`` warning (a legal schedule we want to test)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*won't be using warmup.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        yield


def torch_schedule(s: Schedule) -> Callable[[int], ProfilerAction]:
    """The ``torch.profiler.schedule`` equivalent of ``s``."""
    with _quiet_torch():
        return torch.profiler.schedule(  # type: ignore[no-any-return]
            skip_first=s.skip_first,
            wait=s.wait,
            warmup=s.warmup,
            active=s.active,
            repeat=s.repeat,
            skip_first_wait=int(s.skip_first_wait),
        )


def schedules(max_phase: int = 6, max_active: int = 6, max_repeat: int = 4) -> st.SearchStrategy[Schedule]:
    """Valid :class:`Schedule` values with small fields."""
    return st.builds(
        Schedule,
        skip_first=st.integers(0, max_phase),
        wait=st.integers(0, max_phase),
        warmup=st.integers(0, max_phase),
        active=st.integers(1, max_active),
        repeat=st.integers(0, max_repeat),
        skip_first_wait=st.booleans(),
    )


def windows(n: int, s: Schedule) -> list[tuple[int, int, bool]]:
    """``plan(n, s)`` as plain ``(first, last, partial)`` triples."""
    return [(w.first, w.last, w.partial) for w in plan(n, s)]


@dataclass(frozen=True)
class TraceCall:
    """One ``on_trace_ready`` call of a real profiler."""

    step_num: int
    mini_batches: frozenset[int]
    in_stop: bool


def run_real_profiler(n: int, s: Schedule) -> list[TraceCall]:
    """Run ``n`` mini-batches under a real CPU ``torch.profiler.profile`` and record every trace handed out."""
    calls: list[TraceCall] = []
    stopping = False

    def handler(p: torch.profiler.profile) -> None:
        names = {event.name for event in p.events()}
        mbs = frozenset(i for i in range(n) if f"mb{i}" in names)
        calls.append(TraceCall(step_num=p.step_num, mini_batches=mbs, in_stop=stopping))

    x = torch.ones(4)
    with _quiet_torch():
        prof = torch.profiler.profile(
            activities=[ProfilerActivity.CPU], schedule=torch_schedule(s), on_trace_ready=handler
        )
        prof.start()
        for i in range(n):
            with torch.profiler.record_function(f"mb{i}"):
                x = x + 1
            prof.step()
        stopping = True
        prof.stop()
    return calls


def simulate(n: int, s: Schedule) -> list[tuple[int, int, bool]]:
    """Reference model of ``profile``'s state machine, driven by torch's own schedule function.

    A trace holds the recorded steps since it started; it is saved when ``step()``
    leaves a RECORD_AND_SAVE step, and ``stop()`` saves what a trace still open holds.
    """
    fn = torch_schedule(s)
    out: list[tuple[int, int, bool]] = []
    open_steps: list[int] = []
    for i in range(n):
        action = fn(i)
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            open_steps.append(i)
        if action == ProfilerAction.RECORD_AND_SAVE:
            out.append((open_steps[0], open_steps[-1], False))
            open_steps = []
    if open_steps:
        out.append((open_steps[0], open_steps[-1], True))
    return out


# --------------------------------------------------------------------------- Action


@pytest.mark.parametrize("name", ["NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"])
def test_action_members_match_torch(name: str) -> None:
    assert Action[name].value == ProfilerAction[name].value


def test_action_has_no_extra_members() -> None:
    assert {a.name for a in Action} == {"NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"}


# --------------------------------------------------------------------------- action_at


@settings(max_examples=500, deadline=None)
@given(s=schedules(), step=st.integers(0, 80))
def test_action_at_matches_torch_schedule(s: Schedule, step: int) -> None:
    expected = torch_schedule(s)(step)
    got = action_at(step, s)
    assert got.name == expected.name
    assert got.value == expected.value


@settings(max_examples=100, deadline=None)
@given(s=schedules())
def test_action_at_matches_torch_schedule_over_a_whole_run(s: Schedule) -> None:
    fn = torch_schedule(s)
    assert [action_at(i, s).name for i in range(81)] == [fn(i).name for i in range(81)]


def test_recorded_follows_action_at() -> None:
    s = Schedule(wait=1, warmup=1, active=2, repeat=2)
    assert [recorded(i, s) for i in range(9)] == [False, False, True, True, False, False, True, True, False]


@pytest.mark.parametrize("bad", [-1, -100])
def test_negative_step_is_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match="step_num"):
        action_at(bad, Schedule())
    with pytest.raises(ValueError):
        window_of(bad, Schedule())


@pytest.mark.parametrize("bad", [True, False, 1.0, 2.5, "3", None])
def test_non_int_step_is_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="step_num"):
        action_at(bad, Schedule())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        window_of(bad, Schedule())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- window_of


@settings(max_examples=300, deadline=None)
@given(s=schedules())
def test_window_of_every_step(s: Schedule) -> None:
    for step in range(81):
        if not recorded(step, s):
            with pytest.raises(ValueError, match="not recorded"):
                window_of(step, s)
            continue
        first, last = window_of(step, s)
        assert first <= step <= last
        assert last - first + 1 == s.active
        assert action_at(last, s) is Action.RECORD_AND_SAVE
        assert all(action_at(i, s) is Action.RECORD for i in range(first, last))
        assert window_of(first, s) == window_of(last, s) == (first, last)
        for outside in (first - 1, last + 1):
            if outside >= 0 and recorded(outside, s):
                assert window_of(outside, s) != (first, last)


def test_window_of_example() -> None:
    s = Schedule(wait=1, warmup=1, active=2, repeat=2)
    assert [window_of(i, s) for i in (2, 3, 6, 7)] == [(2, 3), (2, 3), (6, 7), (6, 7)]
    for i in (0, 1, 4, 5, 8, 9):
        with pytest.raises(ValueError):
            window_of(i, s)


# --------------------------------------------------------------------------- plan


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=schedules(max_phase=3, max_active=3, max_repeat=3), n=st.integers(0, 14))
def test_plan_matches_real_profiler(s: Schedule, n: int) -> None:
    calls = run_real_profiler(n, s)
    empty = [c for c in calls if not c.mini_batches]
    saved = [c for c in calls if c.mini_batches]

    # Empty traces come only from stop() when the loop ends just as a window starts.
    for c in empty:
        assert c.in_stop
        assert action_at(n, s) in RECORDED
        assert window_of(n, s)[0] == n

    expected = plan(n, s)
    assert len(saved) == len(expected), (calls, expected)
    for call, window in zip(saved, expected, strict=True):
        assert call.mini_batches == frozenset(range(window.first, window.last + 1))
        assert call.in_stop is window.partial
        # on_trace_ready fires in the step() leaving the window's last step, or in stop() after the loop.
        assert call.step_num == (n if window.partial else window.last + 1)
        assert window.size == len(call.mini_batches)


@settings(max_examples=400, deadline=None)
@given(s=schedules(), n=st.integers(0, 60))
def test_plan_matches_profiler_state_machine(s: Schedule, n: int) -> None:
    assert windows(n, s) == simulate(n, s)


@settings(max_examples=200, deadline=None)
@given(s=schedules(), n=st.integers(0, 60))
def test_plan_windows_are_window_of(s: Schedule, n: int) -> None:
    ws = plan(n, s)
    for w in ws:
        assert 0 <= w.first <= w.last < n
        assert window_of(w.first, s)[0] == w.first
        full_last = window_of(w.first, s)[1]
        assert w.partial is (full_last >= n)
        assert w.last == min(full_last, n - 1)
    assert all(not w.partial for w in ws[:-1])
    assert [w.first for w in ws] == sorted({window_of(i, s)[0] for i in range(n) if recorded(i, s)})


# (schedule, mini-batches, expected plan as (first, last, partial), empty trace handed out in stop())
WORKED_EXAMPLES = [
    (Schedule(wait=1, warmup=1, active=2, repeat=2), 10, [(2, 3, False), (6, 7, False)], False),
    (Schedule(skip_first=1, warmup=1, active=3), 4, [(2, 3, True)], False),
    (Schedule(wait=1, active=2, repeat=0), 9, [(1, 2, False), (4, 5, False), (7, 8, False)], False),
    (Schedule(wait=1, active=2, repeat=0), 10, [(1, 2, False), (4, 5, False), (7, 8, False)], True),
    (
        Schedule(skip_first=2, wait=2, warmup=1, active=1, repeat=2, skip_first_wait=True),
        12,
        [(3, 3, False), (7, 7, False)],
        False,
    ),
    (Schedule(skip_first=2, wait=1, warmup=2, active=3), 5, [], True),
    (Schedule(skip_first=2, wait=1, warmup=2, active=3), 4, [], False),
    (Schedule(active=1, repeat=0), 3, [(0, 0, False), (1, 1, False), (2, 2, False)], True),
]


@pytest.mark.parametrize(("s", "n", "expected", "empty_in_stop"), WORKED_EXAMPLES)
def test_worked_examples_on_real_profiler(
    s: Schedule, n: int, expected: list[tuple[int, int, bool]], empty_in_stop: bool
) -> None:
    assert windows(n, s) == expected
    calls = run_real_profiler(n, s)
    saved = [(min(c.mini_batches), max(c.mini_batches), c.in_stop) for c in calls if c.mini_batches]
    assert saved == expected
    empty = [c for c in calls if not c.mini_batches]
    assert [c.in_stop for c in empty] == ([True] if empty_in_stop else [])


def test_plan_two_repeats() -> None:
    # cycle = 1 + 1 + 2: NONE WARMUP RECORD SAVE | NONE WARMUP RECORD SAVE | NONE ...
    assert windows(10, Schedule(wait=1, warmup=1, active=2, repeat=2)) == [(2, 3, False), (6, 7, False)]


def test_plan_partial_window_at_end_of_loop() -> None:
    # step 0 skipped, 1 WARMUP, 2-3 RECORD, 4 would be SAVE but the loop ends after mini-batch 3.
    s = Schedule(skip_first=1, warmup=1, active=3)
    assert plan(4, s) == [Window(2, 3, partial=True)]
    assert plan(5, s) == [Window(2, 4)]


def test_plan_unbounded_repeat() -> None:
    # cycle = 1 + 0 + 2, repeat=0 never stops: NONE RECORD SAVE, three times over 9 mini-batches.
    s = Schedule(wait=1, active=2, repeat=0)
    assert windows(9, s) == [(1, 2, False), (4, 5, False), (7, 8, False)]
    assert len(plan(300, s)) == 100


def test_plan_skip_first_wait() -> None:
    # skip 2, then the first cycle starts `wait` steps in: WARMUP at 2, SAVE at 3; later cycles wait 2 again.
    s = Schedule(skip_first=2, wait=2, warmup=1, active=1, repeat=2, skip_first_wait=True)
    assert windows(12, s) == [(3, 3, False), (7, 7, False)]
    # Without skip_first_wait the first wait is served too.
    s_waiting = Schedule(skip_first=2, wait=2, warmup=1, active=1, repeat=2)
    assert windows(12, s_waiting) == [(5, 5, False), (9, 9, False)]


def test_plan_first_window_never_starts() -> None:
    s = Schedule(skip_first=2, wait=1, warmup=2, active=3)  # first recorded mini-batch is 5
    for n in range(6):
        assert plan(n, s) == []
    assert plan(6, s) == [Window(5, 5, partial=True)]


def test_plan_zero_mini_batches() -> None:
    assert plan(0, Schedule()) == []


def test_window_size() -> None:
    assert Window(2, 4).size == 3
    assert Window(7, 7, partial=True).size == 1


@pytest.mark.parametrize("bad", [-1, -10])
def test_plan_negative_n_is_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match="num_mini_batches"):
        plan(bad, Schedule())


@pytest.mark.parametrize("bad", [True, 3.0, "3", None])
def test_plan_non_int_n_is_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="num_mini_batches"):
        plan(bad, Schedule())  # type: ignore[arg-type]
