"""Event times no clock could give (``NaN``, ``±Infinity``, past ±4.6e15 µs) are left out, never a traceback.

Property tests over the three places a trace time is first taken: the scanner (every number of the
analysis), the step timeline from traces (``_range``: µs made integer ns) and compare's op reader.
The same inputs through the whole command are in ``tests/hostile/test_trace_times.py``.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from instrument.analyze.traces import _ops, _trace_spans
from instrument.analyze.traces._scanner import MAX_US, Scanner

_FINITE_US = st.floats(-1e12, 1e12, allow_nan=False)
# what a hostile or broken writer puts where a time goes: every float, the edges of the bound, ints
_ANY_TIME = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([MAX_US, -MAX_US, MAX_US * 0.999, 1e300, 1.7e308, -1e300])
    | st.integers(-(1 << 70), 1 << 70)
    | _FINITE_US
)


def _placed(ts: float, dur: float) -> bool:
    """Whether an event with these times lies where a clock could give it (the rule under test, restated)."""
    end = ts + (dur or 0)
    return all(math.isfinite(x) and abs(x) < MAX_US for x in (ts, end))


@st.composite
def _events(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["stage", "op", "mini", "step", "kernel"]))
        name, cat = {
            "stage": ("update_actor", "user_annotation"),
            "op": ("aten::mm", "cpu_op"),
            "mini": (f"mini_batch{i}", "user_annotation"),
            "step": (f"ProfilerStep#{i}", "user_annotation"),
            "kernel": ("gemm", "kernel"),
        }[kind]
        good = draw(st.booleans())
        ts = draw(_FINITE_US) if good else draw(_ANY_TIME)
        dur = draw(st.floats(0, 1e6)) if good else draw(_ANY_TIME)
        out.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur})
    return out


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple | list):
        return all(_finite(v) for v in value)
    return True


@settings(max_examples=300, deadline=None)
@given(events=_events(), mode=st.sampled_from(["discrete", "continuous", "inside"]))
def test_the_scanner_leaves_out_every_event_no_clock_could_give_and_notes_it(
    events: list[dict[str, Any]], mode: str
) -> None:
    scanner = Scanner("update_actor", mode == "continuous", inside=mode == "inside")
    scanner.feed(events)
    segments = scanner.finish()
    left_out = sum(not _placed(e["ts"], e["dur"]) for e in events)
    assert scanner.unplaced == left_out
    assert scanner.events == len(events) - left_out
    assert any("left out" in note for note in scanner.notes) == (left_out > 0), scanner.notes
    for segment in segments:
        numbers = [segment.wall_us, segment.cpu_us, segment.kernel_us, segment.minibatch_us, segment.comm_us]
        assert all(map(_finite, numbers)), segment
    assert all(_finite(r) and all(abs(x) < MAX_US for x in r[2:]) for r in scanner.stage_ranges)
    assert all(abs(x) < MAX_US for _, start, end in scanner.steps for x in (start, end))


@settings(max_examples=500, deadline=None)
@given(base=st.integers(0, (1 << 62) - 1), start=_ANY_TIME, end=_ANY_TIME)
def test_a_range_is_made_integer_ns_only_when_a_clock_could_give_it(base: int, start: float, end: float) -> None:
    kept = _trace_spans._range(base, start, end)  # never OverflowError (round() of an infinite float)
    if kept is not None:
        lo, hi = kept
        assert -(1 << 62) < lo <= hi < 1 << 62
        assert _placed(start, 0) and _placed(end, 0) and start <= end
    if not (_placed(start, 0) and _placed(end, 0)) or not start <= end:
        assert kept is None


@settings(max_examples=300, deadline=None)
@given(events=_events())
def test_compares_op_reader_leaves_out_the_same_events(events: list[dict[str, Any]]) -> None:
    seen = _ops._Seen(frozenset({"update_actor"}))
    seen.feed(events)
    kept = [r for ops in seen.ops.values() for r in ops] + [(k[1], k[1] + k[2]) for k in seen.kernels]
    kept += [r for ranges in seen.cpu_ranges.values() for r in ranges] + [s[1:] for s in seen.steps]
    assert all(_finite(r) and all(abs(x) < MAX_US for x in r if isinstance(x, float)) for r in kept)
    placed = [e for e in events if _placed(e["ts"], e["dur"])]
    assert len(seen.ops.get((1, 1), [])) == sum(e["cat"] == "cpu_op" for e in placed)
    _ops._self_times(seen)  # the columns compare reads: no failure on what is left
