"""Clock estimates for the step timeline: the round trip's bound, and torch.distributed's store exchange.

A second host cannot run here, and processes of one machine share one clock. So two of the four gloo
ranks pretend to be on another host (``INSTRUMENT_TIMELINE_HOST``, the documented stand-in): the
exchange then measures their clock against rank 0's, whose true offset is zero, and the check is
truthful — zero within the estimate's own uncertainty — with no bound on how fast anything ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument.analyze.traces._timelines import align, find_timelines
from instrument.run._clock import HOST_ENV, Sample, best, relative, reported_host, round_trip
from tests.conftest import spawn_ranks

NS = st.integers(min_value=-(1 << 60), max_value=1 << 60)
DELAY = st.integers(min_value=0, max_value=1 << 40)


@given(t_send=NS, offset=NS, there=DELAY, back=DELAY)
def test_a_round_trip_bounds_the_true_offset_however_the_delays_split(
    t_send: int, offset: int, there: int, back: int
) -> None:
    stamp = t_send + there - offset  # the reference's clock reads this clock minus the offset
    sample = round_trip(t_send, stamp, t_send + there + back)
    assert abs(sample.offset_ns - offset) <= sample.uncertainty_ns
    assert sample.uncertainty_ns * 2 >= there + back


@given(a=NS, b=NS, ua=DELAY, ub=DELAY, ea=DELAY, eb=DELAY, sa=st.booleans(), sb=st.booleans())
def test_relative_keeps_the_bound(a: int, b: int, ua: int, ub: int, ea: int, eb: int, sa: bool, sb: bool) -> None:
    # a and b: the true offsets of two clocks to a base clock; the samples are off by at most their uncertainty.
    err_a, err_b = min(ea, ua) * (1 if sa else -1), min(eb, ub) * (1 if sb else -1)
    shifted = relative(Sample(ua, a + err_a), Sample(ub, b + err_b))
    assert abs(shifted.offset_ns - (a - b)) <= shifted.uncertainty_ns


@given(st.lists(st.tuples(DELAY, NS), min_size=1))
def test_best_is_the_least_uncertain(pairs: list[tuple[int, int]]) -> None:
    samples = [Sample(u, o) for u, o in pairs]
    chosen = best(samples)
    assert chosen is not None and chosen.uncertainty_ns == min(u for u, _ in pairs)
    assert best([]) is None


def test_a_round_trip_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        round_trip(10, 0, 5)


def test_the_reported_host_is_the_stand_in_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ENV, "other host/1")
    assert reported_host() == "other-host-1"  # sanitised like every label in a name
    monkeypatch.setenv(HOST_ENV, "")
    assert reported_host() != "other-host-1"


# ---------------------------------------------------------------------- real gloo ranks

WORLD = 4
STEPS = 2
PRETEND = {2: "pretend-host-b", 3: "pretend-host-b"}  # ranks 2 and 3 stand in for a second host
GENEROUS_NS = 2_000_000_000  # an uncertainty beyond 2 s would be no estimate worth having


def _rank(rank: int, save: str, rendezvous: str) -> None:
    import os

    import torch.distributed as dist

    import instrument as ins

    if rank in PRETEND:
        os.environ[HOST_ENV] = PRETEND[rank]
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    ins.configure(ins.ProfilerConfig(save_path=save, tool="none"), role="actor" if rank < 2 else "rollout")

    @ins.profiled_stage("work")
    def work() -> None:
        time.sleep(0.01)

    for step in range(1, STEPS + 1):
        with ins.profile_step(step):
            work()
            dist.barrier()
    ins.finish()
    dist.barrier()  # rank 0 keeps the store until every rank has finished measuring
    dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_on_another_host_measure_their_clock_and_the_axis_is_aligned(tmp_path: Path) -> None:
    save = tmp_path / "profile"
    spawn_ranks(_rank, (str(save), str(tmp_path / "rendezvous")), nprocs=WORLD)

    timelines, skipped = find_timelines(save)
    assert skipped == []
    by_rank = {t.rank: t for t in timelines}
    measured: dict[int, int] = {}  # rank: the uncertainty of its best estimate
    assert sorted(by_rank) == list(range(WORLD))
    assert {by_rank[r].host for r in PRETEND} == set(PRETEND.values())
    for rank, timeline in by_rank.items():
        assert timeline.clocks, f"rank {rank} recorded no clock estimate"
        estimate = timeline.clock
        assert estimate is not None
        if rank in PRETEND:  # measured: one clock in truth, so zero within the estimate's own uncertainty
            assert abs(estimate.offset_ns) <= estimate.uncertainty_ns, estimate
            assert 0 < estimate.uncertainty_ns < GENEROUS_NS, estimate
            assert "torch.distributed" in estimate.source
            measured[rank] = estimate.uncertainty_ns
            # At configure and at finish, measured by one of the two and shared with the other.
            assert len(timeline.clocks) == 2, timeline.clocks
        else:  # rank 0's host: the reference clock itself, recorded once
            assert [(c.offset_ns, c.uncertainty_ns) for c in timeline.clocks] == [(0, 0)]
    print("pretend host:", [(c.offset_ns, c.uncertainty_ns, c.source) for r in PRETEND for c in by_rank[r].clocks])
    sources = {c.source for r in PRETEND for c in by_rank[r].clocks}
    assert any("by a process of this host" in s for s in sources), sources

    shown = subprocess.run(
        [sys.executable, "-m", "instrument", "analyze", str(save), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    clock = json.loads(shown.stdout)["timeline"]["clock"]
    assert clock["aligned"] is True
    assert isinstance(clock["max_uncertainty_ms"], float)
    assert clock["max_uncertainty_ms"] == pytest.approx(max(measured.values()) / 1e6, abs=1e-3)
    # Without the estimates the pretend host would leave the axis unaligned.
    assert align([replace(t, clocks=()) for t in timelines]).aligned is False
