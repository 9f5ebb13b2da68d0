"""Stage metrics scraped over HTTP from a real prometheus_client registry, and on-demand profiling triggers."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

import instrument as ins
from instrument.metrics import serve
from instrument.naming import parse_trace_name
from tests.conftest import without_timeline


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def _value(text: str, name: str, **labels: str) -> float:
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match[1].split(","))) == selector:
            return float(match[2])
    raise AssertionError(f"{name}{{{selector}}} not in the scrape")


def test_stage_and_step_durations_are_scraped_over_http(tmp_path: Path) -> None:
    role = "metrics-actor"  # the default registry is process-wide: a role of its own keeps this test's series apart
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(2,), metrics=True)
    ins.configure(cfg, role=role, rank=0, world_size=1)

    @ins.profiled_stage("compute_log_prob")
    def forward() -> None:
        time.sleep(0.05)

    @ins.profiled_stage("update_actor", scheduled=True)
    def update() -> None:
        for i in range(2):
            with ins.profile_window(mini_batch=i):
                time.sleep(0.01)

    for step in (1, 2, 3):
        with ins.profile_step(step):
            forward()
            update()
    ins.finish()
    port = _free_port()
    server = serve(port)
    try:
        text = _scrape(port)
    finally:
        server.shutdown()
    assert _value(text, "instrument_stage_seconds_count", role=role, stage="compute_log_prob") == 3
    total = _value(text, "instrument_stage_seconds_sum", role=role, stage="compute_log_prob")
    assert total >= 0.149  # three 50 ms sleeps, on unprofiled steps too (a sleep is a lower bound, never a race)
    assert _value(text, "instrument_stage_seconds_count", role=role, stage="mini_batch") == 6
    assert _value(text, "instrument_steps_total", role=role) == 3
    assert _value(text, "instrument_step_seconds_count", role=role) == 3
    assert _value(text, "instrument_profile_windows_total", role=role) == 2  # step 2: two stage traces
    assert _value(text, "instrument_trace_bytes_total", role=role) > 0
    assert _value(text, "instrument_profile_failures_total", role=role) == 0
    assert 'rank="' not in "\n".join(line for line in text.splitlines() if role in line)


def test_a_stage_with_its_own_role_is_observed_under_that_role(tmp_path: Path) -> None:
    """As its traces are named: ``profiled_stage(name, role="critic")`` in an actor process is the critic's."""
    role = "metrics-fused"  # the default registry is process-wide: roles of their own keep these series apart
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), enable=False, metrics=True), role=role, rank=0)

    @ins.profiled_stage("compute_values", role="metrics-critic")
    def values() -> None:
        pass

    for step in (1, 2):
        with ins.profile_step(step), ins.profiled_stage("update_actor"):
            values()
    ins.finish()
    port = _free_port()
    server = serve(port)
    try:
        text = _scrape(port)
    finally:
        server.shutdown()
    assert _value(text, "instrument_stage_seconds_count", role="metrics-critic", stage="compute_values") == 2
    assert _value(text, "instrument_stage_seconds_count", role=role, stage="update_actor") == 2
    assert f'role="{role}",stage="compute_values"' not in text


def test_rank_label_only_when_asked(tmp_path: Path) -> None:
    """In a fresh process: the metric families (with or without rank) are registered once per process."""
    port = _free_port()
    script = textwrap.dedent(
        f"""
        import urllib.request
        import instrument as ins
        from instrument.metrics import serve
        cfg = ins.ProfilerConfig(save_path={str(tmp_path)!r}, metrics=True, metrics_rank_label=True, enable=False)
        ins.configure(cfg, role="actor", rank=3, world_size=4)
        with ins.profile_step(1), ins.profiled_stage("gen"):
            pass
        ins.finish()
        server = serve({port})
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode())
        server.shutdown()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert _value(done.stdout, "instrument_stage_seconds_count", role="actor", stage="gen", rank="3") == 1


def _trace_steps(files: list[str]) -> list[tuple[int, bool]]:
    names = [parse_trace_name(f) for f in without_timeline(files)]
    return sorted((n.step, n.triggered) for n in names if n)


@ins.profiled_stage("generate_sequences")
def _work(seconds: float = 0.0) -> None:
    time.sleep(seconds)


def test_slow_step_trigger_profiles_the_next_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = ins.ProfilerConfig(
        save_path=str(tmp_path),
        contents=("cpu",),
        steps=(99,),
        trigger=ins.SlowStep(factor=1.5, window=3, steps=1),
        max_triggered=1,  # step 4 is the first compared: a later step slowed by a busy machine cannot add a trace
    )
    ins.configure(cfg, role="rollout", rank=1, world_size=2)
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for step in range(1, 8):
            with ins.profile_step(step):
                _work(1.0 if step == 4 else 0.02)  # a sleep: step 4 is slow however loaded the machine is
    files = without_timeline(ins.finish())
    assert _trace_steps(files) == [(5, True)]
    assert all("_trig_" in Path(f).name for f in files)
    assert any("step 4 took" in r.getMessage() for r in caplog.records)


def test_sigusr1_profiles_the_next_step_of_this_process(tmp_path: Path) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(99,), on_demand=True)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    for step in (1, 2, 3):
        with ins.profile_step(step):
            _work()
        if step == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # a real signal to this process
    assert _trace_steps(ins.finish()) == [(2, True)]


def test_trigger_file_is_acted_on_once_per_file_and_capped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = ins.ProfilerConfig(save_path=str(tmp_path), contents=("cpu",), steps=(99,), on_demand=True, max_triggered=2)
    ins.configure(cfg, role="actor", rank=0, world_size=1)
    trigger = tmp_path / "PROFILE_NEXT_STEP"
    with caplog.at_level(logging.WARNING, logger="instrument"):
        for step in range(1, 9):
            if step in (2, 5, 7):
                trigger.unlink(missing_ok=True)
                trigger.write_text("")  # a new file each time
                os.utime(trigger, ns=(step, step))
            with ins.profile_step(step):
                _work()
    assert _trace_steps(ins.finish()) == [(2, True), (5, True)]  # step 7 is past max_triggered=2
    assert sum("max_triggered" in r.getMessage() for r in caplog.records) == 1


def test_metrics_in_forked_workers_are_scraped_together(tmp_path: Path) -> None:
    """prometheus_client's multiprocess mode: two forked workers, one scrape in the parent."""
    port = _free_port()
    script = textwrap.dedent(
        f"""
        import os, time, urllib.request
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = {str(tmp_path / "prom")!r}
        os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        import instrument as ins
        from instrument.metrics import serve
        children = []
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                ins.configure(ins.ProfilerConfig(enable=False, metrics=True, save_path={str(tmp_path)!r}),
                              role="worker", rank=rank, world_size=2)
                for step in (1, 2, 3):
                    with ins.profile_step(step), ins.profiled_stage("compute_values"):
                        time.sleep(0.01)
                ins.finish()
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        server = serve({port})
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode())
        server.shutdown()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert _value(done.stdout, "instrument_stage_seconds_count", role="worker", stage="compute_values") == 6
    assert _value(done.stdout, "instrument_steps_total", role="worker") == 6


@pytest.mark.slow  # the demo in a fresh interpreter importing torch: ~5 s
def test_the_documented_demo_scrape_has_the_documented_series(tmp_path: Path) -> None:
    """docs/metrics.md's command, run as written in a fresh folder: every series of its sample is in the real scrape,
    with the same labels and, for the counts, the same values (the sums are timings)."""
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = page[page.index("## A scrape of the demo") :]
    command = re.search(r"`(python examples/ppo_demo\.py [^`]*)`", section)
    sample = re.search(r"```text\n(.*?)```", section, re.S)
    assert command and sample
    script = Path(__file__).resolve().parents[1] / command[1].split()[1]
    args = command[1].split()[2:]
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "USDT:" not in done.stderr
    scraped = dict(line.strip().rsplit(" ", 1) for line in done.stdout.splitlines() if line.startswith("  instrument_"))
    documented = [line.strip().rsplit(" ", 1) for line in sample[1].splitlines() if line.startswith("  instrument_")]
    assert len(documented) >= 10
    for series, value in documented:
        assert series in scraped, f"{series} is documented but not scraped"
        if not series.startswith(("instrument_stage_seconds_sum", "instrument_step_seconds_sum", "instrument_trace_b")):
            assert float(scraped[series]) == float(value), series
