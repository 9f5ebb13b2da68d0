"""The run id: one name shared by every rank and process of a job, stamped on each manifest line.

Several runs into one ``save_path`` are told apart by it (``instrument analyze`` shows the newest).
It is agreed, in this order, through:

1. ``$INSTRUMENT_RUN_ID``, set by the user or the launcher for every process;
2. torchrun's ``$TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``; torchrun's default ``none`` does not count);
3. the torch.distributed store, when the default group is up at ``configure()``: rank 0 sets a key, the
   others wait for it at most :data:`STORE_WAIT_S` seconds (then fall through, with one warning: the
   analysis joins such a rank's ``time`` run to the store's run of its world size started within a minute);
4. the Ray job, when ``ray`` is imported and initialised in this process (the controller and its actors
   share it): the cluster's session name and the job id, as job ids restart on a fresh cluster;
5. the launcher's environment: ``$SLURM_JOB_ID`` and ``$SLURM_STEP_ID`` (one ``srun`` each);
6. none of these: with more than one rank, the UTC minute of the start and the world size
   (``t20261201-1940-w8``, source ``time``: processes started together share it, and the analysis
   also joins ``time`` runs of one world size started less than a minute apart, so a minute boundary
   does not split a job); with one rank, this process (``host-pid123-20261201-194004``, source
   ``process``), reused by every later ``configure()`` of the process.

An id given by a launcher is trusted: two launches under one id are one run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from instrument import naming
from instrument.manifest import MANIFEST_GLOB, RunStamp

__all__ = ["RUN_ID_ENV", "STORE_WAIT_S", "older_runs", "resolve_run_id"]

logger = logging.getLogger(__name__)

RUN_ID_ENV = "INSTRUMENT_RUN_ID"
"""The environment variable that names the run for every process of a job (wins over every other source)."""

STORE_WAIT_S = 2.0
"""How long a rank other than 0 waits at ``configure()`` for rank 0's run id in the torch.distributed store."""

_MAX_LEN = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9.=+-]+")
_ABSENT = frozenset({"", "none", "null"})  # torchrun writes "none" when no --rdzv-id was given
_lock = threading.Lock()
_store_round = 0  # one key per configure() of this process: every rank configures as often
_this_process: dict[int, RunStamp] = {}  # world size -> the fallback id of this process


def _clean(raw: object) -> str | None:
    """``raw`` as an id (labels' characters, at most 80), or ``None`` when it names no run."""
    text = str(raw).strip()
    if text.lower() in _ABSENT:
        return None
    return _UNSAFE.sub("-", text)[:_MAX_LEN].strip("-.") or None


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def resolve_run_id(*, rank: int, world_size: int, environ: Mapping[str, str] | None = None) -> RunStamp:
    """This process's run: its id agreed with the job's other processes (see the module), never raising."""
    started = time.time()
    try:
        return _resolve(rank, world_size, os.environ if environ is None else environ, started)
    except Exception as exc:  # an odd host name, an environment that raises: this process names the run
        logger.warning(
            "instrument: cannot name the run (%s: %s); this process names it by itself", type(exc).__name__, exc
        )
        return RunStamp(f"pid{os.getpid()}-{int(started)}", "process", started)


def _resolve(rank: int, world_size: int, env: Mapping[str, str], started: float) -> RunStamp:
    for name, source in ((RUN_ID_ENV, "env"), ("TORCHELASTIC_RUN_ID", "torchelastic")):
        found = _clean(env.get(name, ""))
        if found is not None:
            return RunStamp(found, source, started)
    later = _from_ray() or _from_launcher(env)
    shared = _from_store(rank, world_size, later or RunStamp(_process_id(started), "store", started))
    if shared is not None:
        return shared
    if later is not None:
        return later
    return _fallback(world_size, started)


def _from_store(rank: int, world_size: int, offer: RunStamp) -> RunStamp | None:
    """Rank 0's id through the default store of torch.distributed, if it is up; ``None`` otherwise."""
    global _store_round
    dist = sys.modules.get("torch.distributed")  # never imported here: only a job that uses it has one
    if dist is None or world_size < 2:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        from datetime import timedelta

        store = dist.distributed_c10d._get_default_store()
        with _lock:
            _store_round += 1
            key = f"instrument/run-id/{_store_round}"
        if dist.get_rank() == 0:
            store.set(key, f"{offer.source}:{offer.id}")
            return offer
        store.wait([key], timedelta(seconds=STORE_WAIT_S))
        source, _, found = store.get(key).decode("utf-8", "replace").partition(":")
        run_id = _clean(found)
        return None if run_id is None else RunStamp(run_id, source or "store", offer.started)
    except Exception as exc:  # a timeout (rank 0 configures later), a store that went away
        logger.warning(
            "instrument: rank %d could not agree on the run id with rank 0 through the torch.distributed store "
            "(waited at most %.0f s; %s: %s); it names its run by itself, and `instrument analyze` joins its files "
            "to rank 0's run if rank 0 started within a minute of it (set %s for every process to agree)",
            rank,
            STORE_WAIT_S,
            type(exc).__name__,
            exc,
            RUN_ID_ENV,
        )
        return None


def _from_ray() -> RunStamp | None:
    """The Ray job's id (with the cluster's session, as job ids restart on a new cluster), if Ray is up here."""
    ray: Any = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        session = str(context.get_session_name()).removeprefix("session_")
        job = _clean(f"ray-{session}-job{context.get_job_id()}")
    except Exception:  # an older Ray without one of these: the next source
        return None
    return None if job is None else RunStamp(job, "ray", time.time())


def _from_launcher(env: Mapping[str, str]) -> RunStamp | None:
    job = _clean(env.get("SLURM_JOB_ID", ""))
    if job is None:
        return None
    step = _clean(env.get("SLURM_STEP_ID", ""))
    return RunStamp(f"slurm-{job}" if step is None else f"slurm-{job}.{step}", "slurm", time.time())


def _process_id(started: float) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
    return _clean(f"{naming.short_hostname()}-pid{os.getpid()}-{stamp}") or f"pid{os.getpid()}-{stamp}"


def _fallback(world_size: int, started: float) -> RunStamp:
    with _lock:
        known = _this_process.get(world_size)
        if known is None:
            if world_size > 1:
                minute = time.strftime("%Y%m%d-%H%M", time.gmtime(started))
                known = RunStamp(f"t{minute}-w{world_size}", "time", started)
            else:
                known = RunStamp(_process_id(started), "process", started)
            _this_process[world_size] = known
        return known


def older_runs(save_path: str | os.PathLike[str], run_id: str) -> int:
    """How many manifests in ``save_path`` another run wrote (their first line names another run, or none).

    Reads one line of each manifest; a directory that cannot be read counts none.
    """
    count = 0
    try:
        manifests = sorted(Path(save_path).glob(MANIFEST_GLOB))
    except OSError:
        return 0
    ours = f'"run":{json.dumps(run_id, ensure_ascii=False)}'
    for manifest in manifests:
        first = _first_line(manifest)
        if first.strip() and ours not in first:
            count += 1
    return count


def _first_line(path: Path) -> str:
    """The first line of a regular file (``O_NONBLOCK``: a FIFO under a manifest's name never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, 4096).split(b"\n", 1)[0].decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
