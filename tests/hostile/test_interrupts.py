"""Ctrl-C or SIGTERM at any moment of a profiled run, both cores busy: the process ends promptly, its files whole.

A real training process (:mod:`tests.hostile._interrupted_child`: real torch.profiler, a real ``/bin/sh``
finish hook that sleeps 60 s) is signalled at each place it marks — inside the profiler's first start,
inside the stage's work, inside the first export, between steps, while the finish hook runs — with two
busy-loop processes holding both cores. Before, a Ctrl-C anywhere in a profiled step ran the whole finish
hook at exit (the full sleep, or the hook's timeout). Each run must end (:data:`HANG_GUARD_S` only detects
a hang: no assertion is about time), as the signal ends a Python process (``KeyboardInterrupt``: exit by
SIGINT; SIGTERM: death by SIGTERM), with every file in save_path complete: each trace valid gzip'd JSON,
each manifest line JSON naming a file that is there, each step timeline readable, no unfinished file or
private folder left, and the hook never started (or, signalled while it ran, its processes gone).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from instrument import naming
from instrument.timeline import read_timeline

pytestmark = pytest.mark.slow

HANG_GUARD_S = 45.0  # only detects a hang (the bug held the process for the hook's 60 s, or its 90 s timeout)
CHILD = Path(__file__).with_name("_interrupted_child.py")
PLACES = ("start", "step", "export", "between", "hook")
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
TOOK: dict[str, float] = {}  # seconds from the signal to the exit, by case: printed at the end (-s)


@pytest.fixture(scope="module", autouse=True)
def busy_cores() -> Iterator[None]:
    """Both cores of the test machine held by busy loops for the whole module."""
    loads = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for load in loads:
            load.kill()
            load.wait()
        if TOOK:
            print("\nseconds from the signal to the exit:", json.dumps(TOOK, indent=1))


class _Child:
    """The training process, its output read as it comes (a thread: the pipe never fills)."""

    def __init__(self, save: Path, control: Path, at: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(save), str(control), at],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, ready: Callable[[], bool]) -> None:
        """Until ``ready()`` holds; fails if the child ended first or past the hang guard."""
        deadline = time.monotonic() + 4 * HANG_GUARD_S  # torch's import and first start, on busy cores
        while not ready():
            assert self.proc.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.01)

    def output(self) -> str:
        self._reader.join(HANG_GUARD_S)
        return "".join(self.lines)


def _assert_complete(save: Path) -> None:
    """Every file in ``save`` whole: traces, manifests and the lines they hold, step timelines; nothing unfinished."""
    leftovers = [p for p in save.rglob("*") if p.name.startswith(naming.SCRATCH_PREFIX) or p.suffix == ".tmp"]
    assert not leftovers, leftovers
    listed = []
    for manifest in save.glob("instrument-manifest-*.jsonl"):
        text = manifest.read_text(encoding="utf-8")
        assert text.endswith("\n") or not text, text  # no line cut short
        listed += [json.loads(line)["path"] for line in text.splitlines()]
    assert all((save / path).is_file() for path in listed), listed
    traces = list(save.glob("*.pt.trace.json.gz"))
    assert {p.name for p in traces} <= set(listed)
    for trace in traces:
        assert isinstance(json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"], list)
    for timeline in save.glob(f"*{naming.TIMELINE_SUFFIX}"):
        read_timeline(timeline)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("name", list(SIGNALS))
@pytest.mark.parametrize("at", PLACES)
def test_a_signal_anywhere_ends_the_run_promptly_with_its_files_complete(tmp_path: Path, at: str, name: str) -> None:
    save, control = tmp_path / "profile", tmp_path / "control"
    control.mkdir()
    child = _Child(save, control, at)
    if at == "hook":
        child.wait_for((control / "hook-started").exists)
    else:
        child.wait_for(lambda: f"MARK {at}\n" in child.lines)

    sent = time.monotonic()
    child.proc.send_signal(SIGNALS[name])
    (control / "sent").touch()  # the child goes on from its mark: the signal is pending or handled by now
    try:
        returncode = child.proc.wait(HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        child.proc.kill()
        pytest.fail(f"still running {HANG_GUARD_S:g} s after {name} at {at}:\n{child.output()}")
    TOOK[f"{name} at {at}"] = round(time.monotonic() - sent, 1)
    out = child.output()

    assert returncode == -SIGNALS[name], out
    assert "MARK done" not in out, out
    _assert_complete(save)
    if at == "hook":  # the hook's group ends with the process (its watchdog's doing)
        hook = int((control / "hook.pid").read_text())
        deadline = time.monotonic() + HANG_GUARD_S
        while not _gone(hook):
            assert time.monotonic() < deadline, f"the hook (pid {hook}) outlived the training process"
            time.sleep(0.05)
    else:
        assert not (control / "hook-started").exists(), out  # an interrupted run does not start its hook
        if name == "SIGINT":
            assert "the finish hook does not run" in out, out
    if at != "start":  # the first trace was under way: it is saved
        assert list(save.glob("*.pt.trace.json.gz")), out
