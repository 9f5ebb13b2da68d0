"""pytest fixtures for NVTX tests: the logging tool, built once, and a runner for scenario scripts.

Use them in a test module with ``nvtx_tool = fixtures.nvtx_tool`` (a module-level name is
enough for pytest to find the fixture) and ``from tests.nvtx_support.fixtures import run_with_tool``.

NVTX decides once per process, at its first call, whether a tool is attached (and the ``nvtx``
package caches a do-nothing domain otherwise), so every scenario runs in a fresh interpreter
with ``NVTX_INJECTION64_PATH`` set from the start.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.nvtx_support.build import build_injection_library, headers_dir

__all__ = ["ToolEvents", "nvtx_tool", "run_with_tool"]

_SCRIPT_TIMEOUT_S = 60
_runs = itertools.count()


class ToolEvents(list[dict[str, Any]]):
    """The events one scenario process logged, in order; ``stdout`` and ``stderr`` are its output."""

    def __init__(self, events: list[dict[str, Any]], *, stdout: str, stderr: str) -> None:
        super().__init__(events)
        self.stdout = stdout
        self.stderr = stderr


def _unavailable_on_ci(reason: str) -> None:
    pytest.fail(f"{reason} (CI must run the NVTX tests)")


@pytest.fixture(scope="session")
def nvtx_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logging NVTX tool, compiled once per test session.

    Skips when a prerequisite is missing (gcc, the ``nvtx`` package, the ``nvidia-nvtx``
    headers) — and fails instead on CI, where `make test` installs them; a compiler error fails
    with gcc's message.
    """
    missing = _unavailable_on_ci if os.environ.get("CI") else pytest.skip
    if shutil.which("gcc") is None:
        missing("gcc is not on PATH: cannot build the NVTX logging tool")
    if importlib.util.find_spec("nvtx") is None:
        missing("the nvtx package is not installed (dev dependency)")
    try:
        headers_dir()
    except FileNotFoundError as exc:
        missing(f"no NVTX headers: {exc}")
    return build_injection_library(tmp_path_factory.mktemp("nvtxlog"))


def run_with_tool(tool: Path, script: str, tmp: Path, env: dict[str, str] | None = None) -> ToolEvents:
    """Run Python source ``script`` in a fresh ``sys.executable`` with ``tool`` attached; return its events.

    The process runs in ``tmp`` and must exit 0. Its own log (not those of processes it forks)
    must begin with the tool's ``init`` line: without one the tool never loaded (a wrong path
    or a process that made no NVTX call), and an empty log would pass for "no ranges".
    ``env`` entries override the inherited environment.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    run = next(_runs)
    source = tmp / f"scenario{run}.py"
    source.write_text(script, encoding="utf-8")
    child_env = {key: value for key, value in os.environ.items() if key != "NVTX_DISABLE"}
    child_env.update(
        NVTX_INJECTION64_PATH=str(Path(tool).resolve()),
        NVTX_LOG=str(tmp / f"nvtx-run{run}-%p.jsonl"),
        NVTX_LOG_FLUSH="1",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
        ),
    )
    child_env.update(env or {})
    with subprocess.Popen(
        [sys.executable, str(source)],
        cwd=tmp,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=_SCRIPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(f"scenario timed out after {_SCRIPT_TIMEOUT_S} s\n{stdout}\n{stderr}") from None
    assert process.returncode == 0, f"scenario exited {process.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    log = Path(child_env["NVTX_LOG"].replace("%p", str(process.pid)))
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    events = [json.loads(line) for line in lines if line.strip()]
    assert events and events[0]["ev"] == "init", (
        f"the NVTX tool did not initialise in the scenario process (log {log}): check NVTX_INJECTION64_PATH "
        f"and that the script makes an NVTX call\nstderr:\n{stderr}"
    )
    return ToolEvents(events, stdout=stdout, stderr=stderr)
