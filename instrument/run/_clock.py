"""How far this process's clock is from the reference clock (rank 0's), for the step timeline.

Processes of one host read one ``CLOCK_MONOTONIC`` (``time.perf_counter_ns``), so only a process on
another host needs an estimate. It is measured NTP-style: ask the reference for its clock at
``t_send``, get its stamp back at ``t_receive``; the stamp was taken between the two, so this
clock minus the reference's is ``(t_send + t_receive) / 2 - stamp`` within half the round trip.
Of a few round trips the one with the least uncertainty is kept (:func:`round_trip`, :func:`best`).

Under torch.distributed, :class:`StoreClock` does the round trips through the default process
group's store, off the training thread, at ``configure`` and again at ``finish``: rank 0 answers,
one process per other host asks (its host-mates take its answer), and every process hands its
estimate to its timeline writer (``add_clock``). Every wait is bounded; a failure is reported once
and the timeline stays unaligned. Inside a Ray actor the :class:`~instrument.integrations.ray.ProfileController`
measures the clocks instead (a Ray worker group's rank 0 need not be the run's reference).

:data:`HOST_ENV` overrides the host name the timeline and the exchange report: a stand-in for a
second host in tests, since processes of one machine cannot have different clocks.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from instrument import naming

__all__ = [
    "FINISH_WAIT_S",
    "HOST_ENV",
    "ROUND_TRIPS",
    "Sample",
    "StoreClock",
    "best",
    "relative",
    "reported_host",
    "round_trip",
]

logger = logging.getLogger(__name__)

HOST_ENV = "INSTRUMENT_TIMELINE_HOST"
"""When set, the host name this process's timeline and clock exchange report (tests: a pretend second host)."""
ROUND_TRIPS = 5
"""Round trips per estimate; the one with the least uncertainty is kept."""
CONFIGURE_WAIT_S = 120.0
"""The exchange started at ``configure`` gives up after this (it runs on a daemon thread)."""
FINISH_WAIT_S = 10.0
"""``finish`` waits at most this long for the exchange at the end of the run."""
_ROUND_TRIP_WAIT_S = 5.0  # one request or answer that takes longer: that peer is gone
# Rank 0 looks for a new asker this often, backing off: it never waits on a key that may not come, since a
# TCPStore logs a warning for every wait that times out.
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.2
_generations = itertools.count()  # runs of this process: keys of a reused store never mix

Report = Callable[[str, BaseException], None]
AddClock = Callable[[int, int, str], None]


@dataclass(frozen=True, order=True)
class Sample:
    """One estimate: this clock minus the reference's (``offset_ns``), within ``uncertainty_ns``."""

    uncertainty_ns: int
    offset_ns: int


def round_trip(t_send_ns: int, stamp_ns: int, t_receive_ns: int) -> Sample:
    """The estimate of one round trip: sent at ``t_send_ns``, the reference's ``stamp_ns``, back at ``t_receive_ns``.

    The true offset lies in ``[t_send - stamp, t_receive - stamp]`` however the delays split: the
    midpoint, within half the round trip (rounded up, so the bound holds in whole nanoseconds).
    """
    if t_receive_ns < t_send_ns:
        raise ValueError(f"a round trip ends before it starts: sent {t_send_ns}, received {t_receive_ns}")
    span = t_receive_ns - t_send_ns
    return Sample(uncertainty_ns=(span + 1) // 2, offset_ns=t_send_ns + span // 2 - stamp_ns)


def best(samples: Iterable[Sample]) -> Sample | None:
    """The sample with the least uncertainty (``None`` for none)."""
    return min(samples, default=None)


def relative(sample: Sample, reference: Sample) -> Sample:
    """``sample`` re-expressed against another clock that ``reference`` measured on the same base clock."""
    return Sample(
        uncertainty_ns=sample.uncertainty_ns + reference.uncertainty_ns,
        offset_ns=sample.offset_ns - reference.offset_ns,
    )


def reported_host() -> str:
    """This process's host as the timeline names it: :data:`HOST_ENV` when set, else the short host name."""
    override = os.environ.get(HOST_ENV, "").strip()
    if override:
        try:
            return naming.sanitize_label(override)
        except ValueError:
            pass
    return naming.short_hostname()


# ---------------------------------------------------------------------- torch.distributed


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id())
    except Exception:  # an older Ray, no context: not an actor we know of
        return False


def _default_store() -> tuple[Any, int, int] | None:
    """The default process group's store, this rank and the world size; ``None`` when there is none to use."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world < 2:
        return None
    return dist.distributed_c10d._get_default_store(), int(dist.get_rank()), world


class StoreClock:
    """The clock exchange of one run through torch.distributed's store, at ``configure`` and at ``finish``.

    Keys live under ``instrument/clock/{run}/{generation}/{phase}/``: ``run`` hashes the run's name (its id and
    ``save_path``),
    ``generation`` counts this process's runs, so a reused store or two runs in one job never mix.
    """

    def __init__(self, store: Any, *, rank: int, world_size: int, run: str, add_clock: AddClock,
                 report: Report) -> None:  # fmt: skip
        self._store, self._rank, self._world = store, rank, world_size
        self._add_clock, self._report = add_clock, report
        self._host = reported_host()
        run = hashlib.sha1(run.encode("utf-8", "replace")).hexdigest()[:12]
        self._prefix = f"instrument/clock/{run}/{next(_generations)}"
        self._measured = False  # some estimate was recorded (a later failure is then no news)
        self._one_clock = False  # on rank 0's clock (rank 0: every process is): nothing to measure at finish
        self._forgotten = False

    @classmethod
    def start(cls, *, run: str, add_clock: AddClock, report: Report) -> StoreClock | None:
        """Start the exchange at ``configure`` when torch.distributed runs with more than one rank; never raises."""
        try:
            found = _default_store()
            if found is None or _in_ray_actor():
                return None
            store, rank, world = found
            clock = cls(store, rank=rank, world_size=world, run=run, add_clock=add_clock, report=report)
            threading.Thread(
                target=clock._run, args=("configure", CONFIGURE_WAIT_S), name="instrument-clock", daemon=True
            ).start()
            return clock
        except Exception as exc:
            report("cannot measure the clock against rank 0's (the step timeline may stay unaligned)", exc)
            return None

    def at_finish(self) -> None:
        """Measure again at the end of the run; waits at most :data:`FINISH_WAIT_S` (never raises)."""
        if self._forgotten:
            return
        try:
            if _default_store() is None:  # the process group is gone: the estimate at configure stands
                return
            thread = threading.Thread(
                target=self._run, args=("finish", FINISH_WAIT_S), name="instrument-clock", daemon=True
            )
            thread.start()
            thread.join(FINISH_WAIT_S + 1.0)
        except Exception as exc:
            self._failed("finish", exc)

    def forget(self) -> None:
        """In a forked child: the parent's run; measure nothing from here."""
        self._forgotten = True

    # ------------------------------------------------------------------ the exchange (a daemon thread)

    def _run(self, phase: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        keys = _Keys(self._store, f"{self._prefix}/{phase}", deadline)
        try:
            if self._one_clock:  # only count this process in, so that rank 0 does not wait for it
                if self._rank != 0:
                    _arrive(keys, self._world)
                return
            if self._rank == 0:
                self._record(Sample(0, 0), "torch.distributed: the reference (rank 0)")
                self._one_clock = _serve(keys, self._host, self._world) == 0
            else:
                sample, how = _ask(keys, self._host, self._world)
                self._one_clock = sample == Sample(0, 0)
                self._record(sample, f"torch.distributed at {phase}: {how}")
        except Exception as exc:
            self._failed(phase, exc)

    def _record(self, sample: Sample, source: str) -> None:
        exact = sample == Sample(0, 0)  # one clock with the reference: once is enough
        if not self._forgotten and not (exact and self._measured):
            self._add_clock(sample.offset_ns, sample.uncertainty_ns, source)
        self._measured = True

    def _failed(self, phase: str, exc: BaseException) -> None:
        if self._measured or self._forgotten:  # the estimate of configure stands; the axis stays aligned
            logger.debug("instrument: the clock exchange at %s failed: %s", phase, exc)
            return
        self._report("cannot measure the clock against rank 0's (the step timeline may stay unaligned)", exc)


class _Keys:
    """The store under one phase's prefix, every wait bounded by the phase's deadline."""

    def __init__(self, store: Any, prefix: str, deadline: float) -> None:
        self.store, self.prefix, self.deadline = store, prefix, deadline

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def set(self, name: str, value: str) -> None:
        self.store.set(self.key(name), value)

    def add(self, name: str, amount: int) -> int:
        return int(self.store.add(self.key(name), amount))

    def wait(self, name: str, at_most_s: float | None = None) -> None:
        """Wait until ``name`` is set; ``TimeoutError`` past the deadline (or ``at_most_s``)."""
        left = self.deadline - time.monotonic()
        if at_most_s is not None:
            left = min(left, at_most_s)
        if left <= 0:
            raise TimeoutError(f"no {name!r} in the store in time")
        try:
            self.store.wait([self.key(name)], timedelta(seconds=left))
        except Exception as exc:  # the store says timeout in its own words (DistStoreError, RuntimeError)
            raise TimeoutError(f"no {name!r} in the store within {left:.1f} s ({type(exc).__name__}: {exc})") from exc

    def check(self, name: str) -> bool:
        """Whether ``name`` is set (never waits)."""
        return bool(self.store.check([self.key(name)]))

    def get(self, name: str) -> str:
        value = self.store.get(self.key(name))
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _serve(keys: _Keys, host: str, world: int) -> int | None:
    """Rank 0: answer each other host's round trips, one host at a time, until all have arrived or time is up.

    Returns how many hosts asked, once every process has arrived; ``None`` when time ran out first.
    """
    keys.set("host0", host)
    ticket, pause = 1, _POLL_FIRST_S
    while time.monotonic() < keys.deadline:
        if not keys.check(f"ticket/{ticket}"):
            # Askers take their ticket before they count themselves arrived: once all have, no ticket is to come.
            if keys.check("all") and keys.add("tickets", 0) < ticket:
                return ticket - 1
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)
            continue
        pause = _POLL_FIRST_S
        keys.set(f"go/{ticket}", "")
        try:
            for i in range(ROUND_TRIPS):
                keys.wait(f"req/{ticket}/{i}", _ROUND_TRIP_WAIT_S)
                keys.set(f"resp/{ticket}/{i}", str(time.perf_counter_ns()))
        except TimeoutError as exc:  # that host's asker is gone: it reports its own failure
            logger.debug("instrument: clock round trips of ticket %d stopped: %s", ticket, exc)
        ticket += 1
    return None


def _arrive(keys: _Keys, world: int) -> None:
    """Count this process in; the last of the other ranks says so (rank 0 stops looking for askers)."""
    if keys.add("arrived", 1) >= world - 1:
        keys.set("all", "")


def _ask(keys: _Keys, host: str, world: int) -> tuple[Sample, str]:
    """Another rank: this host's estimate (measured here or by a host-mate; zero on rank 0's host) and how."""
    keys.wait("host0")
    if keys.get("host0") == host:
        _arrive(keys, world)
        return Sample(0, 0), "same host as rank 0 (one clock)"
    if keys.add(f"on/{host}", 1) > 1:  # a host-mate measures for this host
        _arrive(keys, world)
        keys.wait(f"estimate/{host}")
        answer = keys.get(f"estimate/{host}")
        if answer == "failed":
            raise TimeoutError(f"the process measuring host {host}'s clock failed")
        offset, uncertainty = (int(part) for part in answer.split(","))
        return Sample(uncertainty, offset), "store round trip by a process of this host"
    ticket = keys.add("tickets", 1)
    keys.set(f"ticket/{ticket}", host)
    _arrive(keys, world)
    try:
        keys.wait(f"go/{ticket}")
        samples = []
        for i in range(ROUND_TRIPS):
            sent = time.perf_counter_ns()
            keys.set(f"req/{ticket}/{i}", "")
            keys.wait(f"resp/{ticket}/{i}", _ROUND_TRIP_WAIT_S)
            received = time.perf_counter_ns()  # the stamp was taken before its key was set: received bounds it
            samples.append(round_trip(sent, int(keys.get(f"resp/{ticket}/{i}")), received))
        sample = min(samples)
    except Exception:
        keys.set(f"estimate/{host}", "failed")  # host-mates stop waiting
        raise
    keys.set(f"estimate/{host}", f"{sample.offset_ns},{sample.uncertainty_ns}")
    return sample, f"store round trip, best of {ROUND_TRIPS}"
