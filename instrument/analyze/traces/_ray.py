"""Reading trace files as Ray tasks across a cluster: ``instrument analyze DIR --ray [ADDRESS]``.

The files are read where they are: every node must see ``DIR`` at the same absolute path (a shared
filesystem: NFS, Lustre, a FUSE-mounted bucket). The driver lists and filters the files as a local
run does, hands them out in batches (largest first, balanced by bytes, a few batches per CPU of the
cluster so a slow node does not hold the end back), and folds the per-file summaries that come back
in the same order as a local run: the report is the same, number for number.

When this module connects to the cluster itself, the tasks run this very ``instrument`` package
(shipped to the workers in the job's ``runtime_env``), so a node with another version installed
cannot change the numbers; a Ray the caller initialised is used with the caller's environment.

Ray is optional: it is imported only when asked for, and :class:`RayUnavailableError` says how to
get it. Standard library only at import time.
"""

from __future__ import annotations

import heapq
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import instrument
from instrument.analyze.model import Skipped, TraceFile
from instrument.analyze.traces._reader import FileScan, TraceError, scan_file

__all__ = ["BATCHES_PER_CPU", "RayUnavailableError", "scan_on_ray"]

BATCHES_PER_CPU = 4
"""Batches handed out per CPU of the cluster: enough that a slow node does not hold the end back, few
enough that each task reads for long against its ~ms of scheduling."""


class RayUnavailableError(RuntimeError):
    """Ray is not installed, or no cluster could be reached at the address given."""


class _Progress(Protocol):
    def file_done(self, path: str, size: int, seconds: float) -> None: ...


def _scan_batch(traces: list[TraceFile], wanted: frozenset[str] | None) -> list[tuple[FileScan | str, float]]:
    """Runs on a Ray worker: each file's summary (or why it could not be read) and its reading time."""
    out: list[tuple[FileScan | str, float]] = []
    for trace in traces:
        started = time.perf_counter()
        result: FileScan | str
        if not os.path.lexists(trace.path):
            result = (
                f"not found on Ray node {socket.gethostname()}: every node must see the directory at the same "
                "path (a shared filesystem)"
            )
        else:
            try:
                result = scan_file(trace, wanted)
            except TraceError as exc:
                result = str(exc)
        out.append((result, time.perf_counter() - started))
    return out


def _batches(sizes: Sequence[int], count: int) -> list[list[int]]:
    """Indices of ``sizes`` in ``count`` batches of about equal bytes: largest first onto the lightest batch."""
    heap = [(0, k) for k in range(count)]
    batches: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        load, k = heapq.heappop(heap)
        batches[k].append(i)
        heapq.heappush(heap, (load + max(sizes[i], 1), k))
    return [batch for batch in batches if batch]


def _connect(address: str | bool) -> tuple[Any, bool]:
    """The ``ray`` module, connected; whether this call connected it (and so must disconnect)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("--ray needs Ray: pip install 'instrument-rl[ray]'") from None
    if ray.is_initialized():
        return ray, False
    try:
        # address None: RAY_ADDRESS, else the cluster `ray start` left on this machine, else a new local one
        # the driver's own package on every worker: the numbers cannot depend on what a node has installed
        package = str(Path(instrument.__file__).resolve().parent)
        ray.init(
            address=None if address is True else str(address),
            logging_level=logging.ERROR,
            log_to_driver=False,
            runtime_env={"py_modules": [package]},
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailableError(f"cannot reach a Ray cluster at {address!r}: {exc}") from exc
    return ray, True


def scan_on_ray(
    traces: list[TraceFile],
    wanted: frozenset[str] | None,
    progress: _Progress | None,
    sizes: Sequence[int],
    address: str | bool = True,
) -> tuple[list[FileScan | Skipped], int]:
    """Read ``traces`` as Ray tasks; their results in the same order, and the cluster's CPUs (the jobs).

    ``address``: ``True`` for :func:`ray.init`'s own choice, else a cluster address (``auto``,
    ``ray://head:10001``, ``10.0.0.1:6379``). A Ray already initialised in this process is used as
    it is and left up. Raises :class:`RayUnavailableError` when Ray is missing or unreachable.
    """
    ray, connected = _connect(address)
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        batches = _batches(sizes, min(len(traces), cpus * BATCHES_PER_CPU)) if traces else []
        task = ray.remote(_scan_batch).options(num_cpus=1)
        absolute = [replace(t, path=os.path.abspath(t.path)) for t in traces]
        pending = {task.remote([absolute[i] for i in batch], wanted): batch for batch in batches}
        results: list[FileScan | Skipped | None] = [None] * len(traces)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                batch = pending.pop(ref)
                for i, (result, seconds) in zip(batch, ray.get(ref), strict=True):
                    results[i] = Skipped(traces[i].path, result) if isinstance(result, str) else result
                    if progress is not None:
                        progress.file_done(traces[i].path, sizes[i], seconds)
    finally:
        if connected:
            ray.shutdown()
    if any(r is None for r in results):  # pragma: no cover - every batch answers for its files
        raise RuntimeError("a Ray task returned no result for some file")
    return [r for r in results if r is not None], cpus
