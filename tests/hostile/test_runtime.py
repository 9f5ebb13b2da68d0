"""Hostile cases for the runtime (issue 15): threads, signals, fork, full disks, planted links, labels.

Cases that crashed the process before run in a subprocess, so a regression fails the test
instead of killing pytest.  No assertion is about time.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import instrument as ins
import instrument.testing
from instrument.manifest import manifest_name, read_manifests
from instrument.naming import SCRATCH_PREFIX, TIMELINE_SUFFIX, parse_trace_name
from instrument.timeline import read_timeline
from tests.conftest import without_timeline

_CRASH_SIGNS = ("Segmentation fault", "INTERNAL ASSERT", "already enabled", "Traceback", "core dumped")


def _run_script(body: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=timeout, check=False
    )


def _traces(save: Path) -> list[Path]:
    return sorted(p for p in save.iterdir() if p.name.endswith((".pt.trace.json.gz", ".pt.trace.json")))


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def _visible_files(save: Path) -> list[str]:
    return sorted(p.name for p in save.iterdir() if not p.name.startswith("."))


# ---------------------------------------------------------------------- threads (P3, P4)


def test_threads_entering_stages_on_profiled_steps_never_crash(tmp_path: Path) -> None:
    """P3/P4: 8 threads on decorated functions, 6 threads sharing one ``with`` object, 5 profiled steps."""
    done = _run_script(
        f"""
        import threading, torch, instrument as ins
        cfg = ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1, 2, 3, 4, 5))
        session = ins.configure(cfg, role="actor", rank=0, world_size=1)

        @ins.profiled_stage("work")
        def work():
            for _ in range(20):
                torch.randn(16, 16) @ torch.randn(16, 16)

        shared = ins.profiled_stage("shared")

        def shared_use():
            for _ in range(5):
                with shared:
                    torch.randn(8, 8) @ torch.randn(8, 8)

        for step in range(1, 6):
            with ins.profile_step(step):
                threads = [threading.Thread(target=work) for _ in range(8)]
                threads += [threading.Thread(target=shared_use) for _ in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        print("files", len(ins.finish()), "failures", session.failures)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [sign for sign in _CRASH_SIGNS if sign in done.stderr], done.stderr[-3000:]
    assert "failures 0" in done.stdout, done.stdout + done.stderr[-3000:]
    traces = _traces(tmp_path)
    assert len(traces) >= 5  # at least one trace per step, never two profilers at once
    steps = {parse_trace_name(t.name).step for t in traces}  # type: ignore[union-attr]
    assert steps == {1, 2, 3, 4, 5}
    names_and_threads: set[tuple[str, object]] = set()
    for trace in traces:
        events = _load(trace)["traceEvents"]
        assert isinstance(events, list)
        names_and_threads |= {(e.get("name"), e.get("tid")) for e in events if e.get("name") in ("work", "shared")}
    assert len({tid for name, tid in names_and_threads if name == "work"}) > 1  # other threads are ranges in it


def test_a_stage_in_another_thread_is_a_range_in_the_open_trace(tmp_path: Path) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,)), role="actor", rank=0)
    import threading

    inside, release = threading.Event(), threading.Event()

    @ins.profiled_stage("generate_sequences")
    def generate() -> None:
        inside.set()
        release.wait(60)

    @ins.profiled_stage("compute_log_prob")
    def log_prob() -> None:
        torch.randn(4, 4) @ torch.randn(4, 4)

    with ins.profile_step(1):
        worker = threading.Thread(target=generate)
        worker.start()
        inside.wait(60)
        log_prob()  # the worker's trace is open: a range in it, not a second profiler
        release.set()
        worker.join()
    files = [Path(p) for p in without_timeline(ins.finish())]
    assert [parse_trace_name(f.name).stage for f in files] == ["generate-sequences"]  # type: ignore[union-attr]
    names = {e.get("name") for e in _load(files[0])["traceEvents"]}
    assert {"generate_sequences", "compute_log_prob"} <= names


def test_scheduled_async_stage_beside_another_keeps_its_windows(tmp_path: Path) -> None:
    """Each asyncio task has its own stage stack: windows belong to their own stage."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), schedule=ins.Schedule(active=2))
    ins.configure(cfg, role="actor", rank=0)

    @ins.profiled_stage("update_actor", scheduled=True)
    async def update() -> None:
        for i in range(4):
            with ins.profile_window(mini_batch=i):
                torch.randn(8, 8) @ torch.randn(8, 8)
                await asyncio.sleep(0)

    @ins.profiled_stage("compute_values")
    async def values() -> None:
        for _ in range(4):
            await asyncio.sleep(0)

    async def both() -> None:
        await asyncio.gather(update(), values())

    with ins.profile_step(1):
        asyncio.run(both())
    names = sorted(Path(p).name for p in without_timeline(ins.finish()))
    assert len(names) == 1 and "_mb0-1_" in names[0], names


# ---------------------------------------------------------------------- signals (K4)


def test_sigterm_storm_with_a_user_handler_never_crashes(tmp_path: Path) -> None:
    """K4: the user's handler only sets a flag; SIGTERM every 20 ms during 200 profiled steps."""
    done = _run_script(
        f"""
        import os, signal, threading, time, torch, instrument as ins
        received = []
        signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
        cfg = ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",),
                                 schedule=ins.Schedule(active=1, repeat=0))
        session = ins.configure(cfg, role="actor", rank=0, world_size=1)

        @ins.profiled_stage("update_actor", scheduled=True)
        def update():
            for i in range(2):
                with ins.profile_window(mini_batch=i):
                    torch.randn(32, 32) @ torch.randn(32, 32)

        stop = threading.Event()
        def storm():
            while not stop.is_set():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.02)
        threading.Thread(target=storm, daemon=True).start()
        for step in range(1, 201):
            with ins.profile_step(step):
                update()
        stop.set()
        files = ins.finish()
        timelines = [f for f in files if f.endswith({TIMELINE_SUFFIX!r})]
        print("signals", len(received) > 0, "files", len(files) - len(timelines), "timelines", len(timelines),
              "failures", session.failures)
        """,
        timeout=500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "signals True files 400 timelines 1 failures 0" in done.stdout, done.stdout + done.stderr[-2000:]
    for trace in _traces(tmp_path)[::40]:
        _load(trace)


def test_sigterm_inside_our_own_profiler_call_is_deferred_then_flushes_and_dies(tmp_path: Path) -> None:
    """The signal lands while the session stops the profiler: handled when that call returns."""
    done = _run_script(
        f"""
        import os, signal, torch, instrument as ins
        from instrument.recorders import torch as backend
        real_stop = backend.TorchBackend.stop
        def stop_with_a_signal(self):
            if self.tracing:
                os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode: inside our own call
            real_stop(self)
            print("stop completed", flush=True)
        backend.TorchBackend.stop = stop_with_a_signal
        cfg = ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",))
        ins.configure(cfg, role="actor", rank=0, world_size=1)

        @ins.profiled_stage("compute_log_prob")
        def forward():
            torch.randn(8, 8) @ torch.randn(8, 8)

        with ins.profile_step(1):
            forward()
        print("survived", flush=True)
        """
    )
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith("stop completed") and "survived" not in done.stdout
    traces = _traces(tmp_path)
    assert len(traces) == 1 and traces[0].name.endswith(".pt.trace.json.gz")
    _load(traces[0])


def test_ctrl_c_inside_our_own_profiler_call_is_raised_when_it_returns_and_the_hook_never_starts(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the session stops the profiler: the stop and its export finish, then KeyboardInterrupt;
    the run ends without its finish hook (before, the hook ran whole at exit), one warning says so."""
    hook_ran = tmp_path / "hook-ran"
    done = _run_script(
        f"""
        import os, signal, torch, instrument as ins
        from instrument.recorders import torch as backend
        real_stop = backend.TorchBackend.stop
        def stop_with_a_signal(self):
            if self.tracing:
                os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode: inside our own call
            real_stop(self)
            print("stop completed", flush=True)
        backend.TorchBackend.stop = stop_with_a_signal
        hook = ins.FinishHook(cmd="touch {hook_ran}; sleep 60", timeout_s=90)
        cfg = ins.ProfilerConfig(save_path={str(tmp_path / "profile")!r}, contents=("cpu",), finish_hook=hook)
        ins.configure(cfg, role="actor", rank=0, world_size=1)

        @ins.profiled_stage("compute_log_prob")
        def forward():
            torch.randn(8, 8) @ torch.randn(8, 8)

        with ins.profile_step(1, last=True):
            forward()
            print("after the stage", flush=True)
        print("survived", flush=True)
        """
    )
    assert done.returncode == -signal.SIGINT, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith("stop completed") and "after the stage" not in done.stdout, done.stdout
    assert "KeyboardInterrupt" in done.stderr and "the finish hook does not run" in done.stderr, done.stderr
    assert not hook_ran.exists()
    traces = _traces(tmp_path / "profile")
    assert len(traces) == 1 and traces[0].name.endswith(".pt.trace.json.gz")
    _load(traces[0])
    assert not list((tmp_path / "profile").glob(f"{SCRATCH_PREFIX}*"))


def test_ctrl_c_handler_is_installed_only_over_pythons_own(tmp_path: Path) -> None:
    """configure() takes SIGINT only from Python's default handler; a program's own stays its own."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    ours = signal.getsignal(signal.SIGINT)
    assert ours is not signal.default_int_handler
    instrument.testing.reset()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def mine(signum: int, frame: object) -> None: ...

    signal.signal(signal.SIGINT, mine)
    try:
        ins.configure(cfg, role="actor", rank=0, world_size=1)
        assert signal.getsignal(signal.SIGINT) is mine
        instrument.testing.reset()
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------------- fork (P6)


def test_a_forked_child_starts_clean(tmp_path: Path) -> None:
    """P6: no second finish hook, no writes into the parent's manifest, no inherited exports.

    The fork happens inside a profiled step with the parent's export queue busy. The child leaves
    with ``os._exit`` as multiprocessing does: once torch.profiler ran in a process, a forked
    child hangs in torch's own interpreter-exit code (plain torch does the same).
    """
    hook_log = tmp_path / "hook.log"
    save = tmp_path / "profile"
    done = _run_script(
        f"""
        import atexit, os, torch, instrument as ins
        cfg = ins.ProfilerConfig(save_path={str(save)!r}, contents=("cpu",), steps=(1, 2),
                                 finish_hook=ins.FinishHook(cmd='echo "hook $INSTRUMENT_PROFILE_PID" >> {hook_log}'))
        ins.configure(cfg, role="actor", rank=0, world_size=1)

        @ins.profiled_stage("compute_log_prob")
        def forward():
            torch.randn(8, 8) @ torch.randn(8, 8)

        with ins.profile_step(1):
            forward()
            if os.fork() == 0:  # inside the parent's step 1, its trace still being exported
                for step in (1, 2, 3):
                    with ins.profile_step(step, last=(step == 3)):
                        forward()
                print("child files", len(ins.finish()), flush=True)
                atexit._run_exitfuncs()  # what a normal exit runs (our finish() among them), then
                os._exit(0)  # leave as multiprocessing does: after torch.profiler, torch's own exit hangs a child
        os.wait()
        with ins.profile_step(2):
            forward()
        print("parent files", len(ins.finish()), "pid", os.getpid())
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parent_pid = int(done.stdout.split("pid")[-1])
    assert "child files 0" in done.stdout and "parent files 3" in done.stdout  # two traces and the step timeline
    assert hook_log.read_text().splitlines() == [f"hook {parent_pid}"]
    manifests = sorted(p.name for p in save.glob("instrument-manifest-*.jsonl"))
    assert len(manifests) == 1 and f"-pid{parent_pid}" in manifests[0]
    records = list(read_manifests(save))
    assert len(records) == 3 and len(without_timeline(records)) == 2
    assert {parse_trace_name(t.name).pid for t in _traces(save)} == {parent_pid}  # type: ignore[union-attr]
    (timeline,) = save.glob(f"*{TIMELINE_SUFFIX}")  # the parent's alone, without the child's steps
    assert read_timeline(timeline).pid == parent_pid
    assert {span.step for span in read_timeline(timeline).spans} == {1, 2}


def test_a_forked_child_can_configure_its_own_run(tmp_path: Path) -> None:
    done = _run_script(
        f"""
        import os, torch, instrument as ins
        ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1,)), role="actor",
                      rank=0, world_size=1)
        if os.fork() == 0:
            ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1,)),
                          role="worker", rank=0, world_size=1)
            with ins.profile_step(1), ins.profiled_stage("compute_values"):
                torch.randn(8, 8) @ torch.randn(8, 8)
            ins.finish()
            os._exit(0)
        os.wait()
        with ins.profile_step(1), ins.profiled_stage("compute_log_prob"):
            torch.randn(8, 8) @ torch.randn(8, 8)
        ins.finish()
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = sorted((r.role, r.stage) for r in read_manifests(tmp_path))
    assert records == [
        ("actor", "compute_log_prob"),
        ("actor", "timeline"),
        ("worker", "compute_values"),
        ("worker", "timeline"),
    ]
    assert len(list(tmp_path.glob("instrument-manifest-*.jsonl"))) == 2


# ---------------------------------------------------------------------- files (F5, F6, F8, traceName, manifest)


def test_full_disk_never_leaves_a_truncated_trace_under_a_visible_name(tmp_path: Path) -> None:
    """F5: RLIMIT_FSIZE (a real EFBIG on write) cuts the JSON export of a big stage short."""
    done = _run_script(
        f"""
        import logging, resource, signal, torch
        import instrument as ins, instrument.testing
        logging.basicConfig(level=logging.WARNING)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        session = ins.configure(ins.ProfilerConfig(save_path={str(tmp_path)!r}, contents=("cpu",), steps=(1, 2)),
                                role="actor", rank=0, world_size=1)

        @ins.profiled_stage("small")
        def small():
            torch.randn(4, 4) @ torch.randn(4, 4)

        @ins.profiled_stage("big")
        def big():
            for _ in range(3000):
                torch.randn(4, 4) @ torch.randn(4, 4)

        with ins.profile_step(1):
            small()
        ins.testing.wait_for_exports()
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # the big trace is ~MBs
        with ins.profile_step(2):
            big()
        ins.finish()
        print("failures", session.failures)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "failures 0" not in done.stdout
    for name in _visible_files(tmp_path):
        path = tmp_path / name
        if name.endswith(".jsonl"):
            lines = path.read_text().splitlines()
            assert all(json.loads(line) for line in lines)
        elif name.endswith(TIMELINE_SUFFIX):
            assert not read_timeline(path).torn  # a few spans: far below the limit
        else:
            _load(path)  # every visible trace is complete
    stages = {parse_trace_name(t.name).stage for t in _traces(tmp_path)}  # type: ignore[union-attr]
    assert stages == {"small"}


def test_a_symlink_planted_at_the_manifest_name_is_never_followed(tmp_path: Path) -> None:
    """F6: the manifest moves to a fresh name; the link's target is untouched."""
    save = tmp_path / "profile"
    save.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (save / manifest_name()).symlink_to(victim)
    ins.configure(ins.ProfilerConfig(save_path=str(save), contents=("cpu",), steps=(1,)), role="actor", rank=0)
    with ins.profile_step(1), ins.profiled_stage("compute_log_prob"):
        torch.randn(4, 4) @ torch.randn(4, 4)
    files = ins.finish()
    assert victim.read_text() == "precious\n"
    manifests = [p for p in save.glob("instrument-manifest-*.jsonl") if not p.is_symlink()]
    assert len(manifests) == 1 and stat.S_ISREG(manifests[0].lstat().st_mode)
    assert [str(save / r.path) for r in read_manifests(save)] == files


def test_unfinished_files_live_only_in_a_private_folder(tmp_path: Path) -> None:
    """F8: torch's temporaries go to a 0700 mkdtemp folder, removed at the end; nothing else is left."""
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,), schedule=ins.Schedule(active=1))
    session = ins.configure(cfg, role="actor", rank=0)
    seen: list[Path] = []
    with ins.profile_step(1):
        with ins.profiled_stage("update_actor", scheduled=True):
            for i in range(2):
                with ins.profile_window(mini_batch=i):
                    torch.randn(4, 4) @ torch.randn(4, 4)
        seen = [p for p in tmp_path.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    assert len(seen) == 1 and stat.S_IMODE(seen[0].stat().st_mode) == 0o700
    ins.finish()
    assert session.failures == 0
    left = without_timeline(sorted(p.name for p in tmp_path.iterdir()))
    assert all(n.endswith(".pt.trace.json.gz") or n.startswith("instrument-manifest-") for n in left), left


def test_trace_name_and_manifest_path_point_at_the_published_file(tmp_path: Path) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,)), role="actor", rank=0)
    with ins.profile_step(1), ins.profiled_stage("compute_log_prob"):
        torch.randn(4, 4) @ torch.randn(4, 4)
    (path,) = without_timeline(ins.finish())
    assert _load(Path(path))["traceName"] == str(Path(path).absolute())
    (record,) = without_timeline(read_manifests(tmp_path))
    assert record.path == Path(path).name  # relative to save_path, whoever writes it
    assert record.bytes == os.path.getsize(path)


# ---------------------------------------------------------------------- labels (N3, C4)


@pytest.mark.parametrize("label", ['a"b', "a\\b", "a\nb", "a\x00b"])
def test_labels_that_would_corrupt_trace_metadata_are_refused_at_once(tmp_path: Path, label: str) -> None:
    with pytest.raises(ValueError, match="'role' must not contain quotes, backslashes or control characters"):
        ins.configure(ins.ProfilerConfig(save_path=str(tmp_path)), role=label, rank=0)
    with pytest.raises(ValueError, match="'name' must not contain"):
        ins.profiled_stage(label)


def test_unicode_labels_stay_valid_json_in_every_trace(tmp_path: Path) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(1,)), role="acteur-é", rank=0)
    with ins.profile_step(1), ins.profiled_stage("mise_à_jour"):
        torch.randn(4, 4) @ torch.randn(4, 4)
    (path,) = without_timeline(ins.finish())
    assert _load(Path(path))["instrument"] == {"role": "acteur-é", "stage": "mise_à_jour", "step": 1, "rank": 0}
