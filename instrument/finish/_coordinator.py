"""When and where the finish hook runs: once per run, on the chosen ranks, after every trace is on disk."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

from instrument.config import ProfilerConfig
from instrument.finish._hook import hook_environment, run_finish_hook

__all__ = ["PEER_TIMEOUT_S", "FinishCoordinator"]

logger = logging.getLogger(__name__)

PEER_TIMEOUT_S = 120.0
"""How long ranks wait for each other before the finish hook runs anyway."""


class FinishCoordinator:
    """The finish hook of one process's run: decides, waits for peers, runs it once."""

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        role: str,
        rank: int,
        world_size: int,
        fail: Callable[[str, BaseException], None],
    ) -> None:
        self.config = config
        self.role, self.rank, self.world_size = role, rank, world_size
        self.ran = False
        self.automatic = True  # False when a controller decides when and where the hook runs
        # verl 0.9.1's rollout servers never run the finish command: the training workers' run uploads the
        # same save_path. In verl's dialect the rollout role still meets its peers, then leaves the hook to them.
        self.declined = config.dialect == "verl" and role == "rollout"
        self._fail = fail
        self._lock = threading.Lock()
        self._interrupted: str | None = None  # how the process was interrupted (interrupt)

    @property
    def pending(self) -> bool:
        """Whether a hook is configured and has not run yet."""
        return not self.ran and self.config.finish_hook is not None and self.config.active

    def interrupt(self, how: str) -> None:
        """The process is being interrupted (``how``: e.g. ``"Ctrl-C (SIGINT)"``): from now on the hook never
        starts and no peer is waited for, so the process ends as promptly as it would without the SDK (its
        files are still saved). Only sets a flag: safe in a signal handler."""
        self._interrupted = how

    @property
    def interrupted(self) -> bool:
        """Whether :meth:`interrupt` was called."""
        return self._interrupted is not None

    def meet_peers(self) -> None:
        """Wait (bounded) for the other torch.distributed ranks, so the hook sees their traces on disk too."""
        if self._interrupted is not None:  # the other ranks are being interrupted too, or were never coming
            return
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return
            timeout = timedelta(seconds=PEER_TIMEOUT_S)
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timeout)
            else:
                dist.barrier(async_op=True).wait(timeout=timeout)
        except Exception as exc:  # a dead or late rank: run the hook on what is there
            self._fail("ranks did not meet before the finish hook", exc)

    def run(self, *, steps: Sequence[int], manifest: str, wait_for_exports: Callable[[], None]) -> None:
        """Run the finish command once, if this rank is one of its ranks, after ``wait_for_exports()``.

        Never on a ``rollout`` process in verl's dialect (``config.dialect``), as verl's rollout servers, and
        never once the process is interrupted (:meth:`interrupt`: one warning says so).
        """
        hook = self.config.finish_hook
        with self._lock:
            if self.ran or hook is None or not self.config.active:
                return
            self.ran = True
        if not (hook.all_ranks or self.rank in hook.ranks):
            return
        if self.declined:
            logger.info(
                "instrument: rank %d (role rollout) leaves the finish hook to the other roles, as verl", self.rank
            )
            return
        if self._interrupted is not None:  # a hook may run for minutes: an interrupted process must end now
            logger.warning(
                "instrument: %s: the finish hook does not run, so the process ends now; the traces are saved "
                "in %s (run finish_hook.cmd yourself to upload them)",
                self._interrupted,
                os.path.abspath(self.config.save_path),
            )
            return
        wait_for_exports()
        try:
            env = hook_environment(
                save_path=self.config.save_path,
                tool=self.config.tool,
                role=self.role,
                rank=self.rank,
                world_size=self.world_size,
                pid=os.getpid(),
                steps=sorted(set(steps)),
                manifest=manifest,
            )
            run_finish_hook(
                hook.cmd,
                env=env,
                timeout_s=hook.timeout_s,
                log_prefix=f"[instrument {self.role} rank {self.rank}]",
                output=hook.output,
                rank=self.rank,
            )
        except Exception as exc:
            self._fail("could not run the finish hook", exc)
