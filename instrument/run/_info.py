"""``RunInfo``: the read-only description of a run that ``configure()`` returns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, final

from instrument.manifest import TraceRecord

__all__ = ["RunInfo"]


@final
class RunInfo:
    """What this process's run is: its place in the job, what it profiles and what it wrote so far.

    A live, read-only view: values change as the run goes on, but nothing here changes the run.
    """

    __slots__ = ("_session",)

    def __init__(self, session: Any) -> None:
        self._session = session

    def __repr__(self) -> str:
        return f"RunInfo(role={self.role!r}, rank={self.rank}, world_size={self.world_size}, tool={self.tool!r})"

    @property
    def role(self) -> str:
        """The role given to ``configure``."""
        return str(self._session.role)

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return int(self._session.rank)

    @property
    def world_size(self) -> int:
        """The number of ranks of the job."""
        return int(self._session.world_size)

    @property
    def run_id(self) -> str:
        """The run's id, the same in every process of the job (stamped on each manifest line; see docs/analyze.md)."""
        return str(self._session.run_id.id)

    @property
    def tool(self) -> str:
        """The tool as configured: a recorder name (``torch``, ``nvtx``, ...), several joined by ``+``, or ``none``."""
        return str(self._session.config.tool)

    @property
    def save_path(self) -> Path:
        """Where every file of the run goes."""
        return Path(self._session.config.save_path)

    def profiles(self, step: int) -> bool:
        """Whether this process records RL step ``step`` as configured (triggers aside)."""
        return bool(self._session.profiles(step))

    def records_step(self, step: int) -> bool:
        """Whether step ``step`` is recorded here: the open step's answer (triggers included), else :meth:`profiles`.

        What a :class:`~instrument.rollout.RolloutProfiler` in this process is given as ``profiles_step=``.
        """
        session = self._session
        return bool(session.step_profiled) if session.step == step else bool(session.profiles(step))

    def publish(self, record: TraceRecord) -> None:
        """List a complete file of ``save_path`` in this run's manifest and :attr:`files` (any thread).

        What a :class:`~instrument.rollout.RolloutProfiler` in this process is given as ``publish=``, so
        relocated engine traces are listed with the run's own.
        """
        self._session.publish(record)

    @property
    def step(self) -> int | None:
        """The open step, if any."""
        step: int | None = self._session.step
        return step

    @property
    def step_profiled(self) -> bool:
        """Whether the open step is being recorded here."""
        return bool(self._session.step_profiled)

    @property
    def step_triggered(self) -> bool:
        """Whether the open step is recorded because a trigger asked (slow step, SIGUSR1, trigger file)."""
        return bool(self._session.step_triggered)

    @property
    def profiled_steps(self) -> tuple[int, ...]:
        """Steps recorded in this process so far."""
        return tuple(self._session.profiled_steps)

    @property
    def triggered_steps(self) -> tuple[int, ...]:
        """Steps recorded on demand so far."""
        return tuple(self._session.triggered_steps)

    @property
    def failures(self) -> int:
        """SDK failures absorbed so far (each kind was warned about once)."""
        return int(self._session.failures)

    @property
    def manifest_path(self) -> Path:
        """This process's manifest (it exists once a file is saved)."""
        return Path(self._session.manifest_path)

    @property
    def files(self) -> tuple[str, ...]:
        """Files saved and listed so far, as absolute paths (exports still running are not yet here)."""
        root = os.path.abspath(self._session.config.save_path)
        return tuple(os.path.join(root, r.path) for r in self._session.records)

    @property
    def finished(self) -> bool:
        """Whether ``finish()`` has ended the run."""
        return bool(self._session.finished)
