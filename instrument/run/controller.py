"""What a controller process (the Ray driver) needs from the run to drive the runs of other processes.

A controller (:class:`instrument.integrations.ray.ProfileController`) opens and closes steps in
its workers through remote calls. The workers answer with the functions here, each acting on the
worker's own run, if it has one (:func:`yield_finish_hook`, :func:`wait_for_exports`,
:func:`run_finish_hook`, :func:`record_clock`). The controller follows the run's step rules
(:func:`is_last_step`, :func:`sees_every_step`), measures the workers' clocks with the run's
round-trip arithmetic (:class:`Sample`, :func:`round_trip`, :func:`relative`, :func:`reported_host`,
:data:`ROUND_TRIPS`) and records a step timeline of its own (:class:`ControllerTimeline`).
Nothing here imports Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from instrument.config import ProfilerConfig
from instrument.manifest import Manifest
from instrument.run._clock import ROUND_TRIPS, Sample, relative, reported_host, round_trip
from instrument.run._run_id import resolve_run_id
from instrument.run._session import is_last_step
from instrument.run._stages import sees_every_step
from instrument.run._state import STATE
from instrument.run._timeline import TimelineWriter

__all__ = [
    "ROUND_TRIPS",
    "ControllerTimeline",
    "Sample",
    "is_last_step",
    "record_clock",
    "relative",
    "reported_host",
    "round_trip",
    "run_finish_hook",
    "sees_every_step",
    "wait_for_exports",
    "yield_finish_hook",
]

_STEP_SPAN = ("step", None, "step")  # the timeline's name of a step span, as a profile_step writes it

# ---------------------------------------------------------------------- in a driven worker


def yield_finish_hook() -> None:
    """Let a controller decide when and where this process's finish hook runs (nothing without a run)."""
    session = STATE.session
    if session is not None:
        session.hook.automatic = False


def wait_for_exports() -> None:
    """Block until this process's traces so far are on disk (nothing without a run)."""
    session = STATE.session
    if session is not None:
        session.wait_for_exports()


def run_finish_hook() -> None:
    """Run the finish hook now if this process's rank is one of its ranks (once per run; nothing without a run)."""
    session = STATE.session
    if session is not None:
        session.run_finish_hook()


def record_clock(offset_ns: int, uncertainty_ns: int, source: str) -> bool:
    """Record a clock estimate (this clock minus the reference's) in this run's timeline; whether there is one."""
    session = STATE.session
    timeline = None if session is None else session.timeline
    if timeline is None:
        return False
    timeline.add_clock(offset_ns, uncertainty_ns, source)
    return True


# ---------------------------------------------------------------------- in the controller


class ControllerTimeline:
    """The controller process's step timeline, chosen once at construction.

    If this process configured a run of its own (``instrument.configure`` in the driver), that run's
    timeline is the process's: it gets the clock estimate, and the controller records no steps. Otherwise,
    with the timeline on, the controller writes its own (``role``, rank 0 of 1) with its own manifest,
    under the run id the job's workers resolve too, so the analysis reads it with theirs. ``report``
    receives the writer's failures (it never raises into the controller).
    """

    def __init__(self, config: ProfilerConfig, *, role: str, report: Callable[[str, BaseException], None]) -> None:
        """Open the controller's own timeline and manifest when the process has no run and the timeline is on."""
        session = STATE.session
        self._run = session if session is not None and not session.finished else None
        self._writer: TimelineWriter | None = None
        self._manifest: Manifest | None = None
        if config.timeline and config.enable and self._run is None:
            self._manifest = Manifest(config.save_path, run=resolve_run_id(rank=0, world_size=1))
            self._writer = TimelineWriter(
                config.save_path, role=role, rank=0, world_size=1, publish=self._manifest.append, report=report
            )

    @property
    def manifest_path(self) -> Path | None:
        """The controller's own manifest (it lists the controller's timeline), once written; else ``None``."""
        manifest = self._manifest
        return manifest.path if manifest is not None and manifest.path.is_file() else None

    def add_step(self, step: int, start_ns: int, end_ns: int) -> None:
        """One step span of the controller's own timeline (``perf_counter_ns`` bounds); nothing without one."""
        writer = self._writer
        if writer is not None:
            writer.pending.append((_STEP_SPAN, step, start_ns, end_ns, threading.get_ident()))
            writer.wake()

    def write_now(self) -> None:
        """Write the controller's own pending spans now (before the finish hook archives them)."""
        if self._writer is not None:
            self._writer.write_now()

    def clock_rank(self) -> int | None:
        """The rank of this process's timeline (0: the controller's own; the run's rank), ``None`` without one."""
        if self._writer is not None:
            return 0
        run = self._run
        return run.rank if run is not None and run.timeline is not None else None

    def add_clock(self, offset_ns: int, uncertainty_ns: int, source: str) -> None:
        """Record this process's clock estimate in its timeline (nothing without one)."""
        writer = self._writer if self._writer is not None else None if self._run is None else self._run.timeline
        if writer is not None:
            writer.add_clock(offset_ns, uncertainty_ns, source)

    def close(self) -> str | None:
        """Close the controller's own timeline (bounded, never raises) and manifest; the timeline's path, if written."""
        path = None
        if self._writer is not None:
            self._writer.close()
            if self._writer.path is not None:
                path = str(self._writer.path)
        if self._manifest is not None:
            self._manifest.close()
        return path
