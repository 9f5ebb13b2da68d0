"""A real vLLM OpenAI-compatible server for tests, driven from the project's environment.

Standard library only: the tests run in the project's virtual environment, while vLLM lives in its own one,
named by ``INSTRUMENT_VLLM_PYTHON`` (the interpreter of that environment). Everything binds to 127.0.0.1.

    with VllmServer(python, model_dir, port=free_port(), log_path=tmp_path / "server.log") as server:
        server.completion("Hello world")

The server runs in its own process group (API server, engine core and workers): leaving the block sends
SIGTERM to the whole group, then SIGKILL to whatever is still alive after the grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO, Any

PYTHON_ENV_VAR = "INSTRUMENT_VLLM_PYTHON"
HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "launcher.py"
TINY_MODEL_SCRIPT = HERE / "tiny_model.py"

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 10.0
MODEL_BUILD_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 50

# No hub, no telemetry, loopback only, a small KV cache (GiB).
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": HOST,
    "VLLM_LOOPBACK_IP": HOST,
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
}

# Never send loopback requests through a proxy configured in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def vllm_python() -> str | None:
    """The vLLM environment's interpreter, from ``INSTRUMENT_VLLM_PYTHON``; None when unset or empty."""
    value = os.environ.get(PYTHON_ENV_VAR, "").strip()
    return value or None


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BASE_ENV)
    if extra:
        env.update(extra)
    return env


def build_tiny_model(python: str, out_dir: Path) -> Path:
    """Write the tiny random Llama into ``out_dir`` with the vLLM environment's interpreter; returns ``out_dir``."""
    out_dir = Path(out_dir)
    result = subprocess.run(
        [python, str(TINY_MODEL_SCRIPT), str(out_dir)],
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0 or not (out_dir / "config.json").is_file():
        raise RuntimeError(
            f"building the tiny model failed (exit {result.returncode}):\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )
    return out_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Process ids still running (zombies excluded) in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the best the standard library can say
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
            members.append(int(entry.name))
    return sorted(members)


def http_request(
    url: str, method: str = "GET", body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S
) -> tuple[int, bytes]:
    """``(status, body)`` of one request; HTTP error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


class VllmServer:
    """``vllm serve`` on the tiny model, as a context manager that waits for ``/health`` and cleans up after."""

    def __init__(
        self,
        python: str,
        model_dir: Path,
        *,
        port: int,
        tp: int = 1,
        profiler_config: dict[str, Any] | None = None,
        extra_env: dict[str, str] | None = None,
        log_path: Path,
        ready_timeout: float = READY_TIMEOUT_S,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        self.python = python
        self.model = str(model_dir)
        self.port = port
        self.tp = tp
        self.profiler_config = profiler_config
        self.extra_env = dict(extra_env or {})
        self.log_path = Path(log_path)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.url = f"http://{HOST}:{port}"
        self.pgid: int | None = None
        self.ready_s: float | None = None
        self.stop_s: float | None = None
        self.leftover: list[int] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- launch -------------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        command = [
            self.python,
            str(LAUNCHER),
            "serve",
            self.model,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--max-model-len",
            "256",
            "--max-num-seqs",
            "4",
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "-tp",
            str(self.tp),
        ]
        if self.profiler_config is not None:
            command += ["--profiler-config", json.dumps(self.profiler_config)]
        return command

    def env(self) -> dict[str, str]:
        # One core per tensor-parallel rank: "0", "0|1", ...
        bind = {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(core) for core in range(self.tp))}
        return _child_env({**bind, **self.extra_env})

    def start(self) -> VllmServer:
        if self._process is not None:
            raise RuntimeError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        started = time.monotonic()
        self._process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,  # its own session and process group: pgid == pid
        )
        self.pgid = self._process.pid
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise RuntimeError(
                    f"vLLM server exited with {code} before it was healthy; last lines of {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                status, _ = http_request(f"{self.url}/health", timeout=2.0)
            except (urllib.error.URLError, OSError):
                status = 0
            if status == 200:
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"vLLM server not healthy after {self.ready_timeout:.0f} s; last lines of {self.log_path}:\n"
            + self.log_tail()
        )

    # -- shutdown -----------------------------------------------------------------------------------------------
    def _signal_group(self, signum: signal.Signals) -> None:
        assert self.pgid is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signum)

    def _wait_group(self, deadline: float) -> list[int]:
        assert self._process is not None and self.pgid is not None
        while True:
            exited = self._process.poll() is not None  # reaps the leader once it is gone
            members = group_members(self.pgid)
            if (exited and not members) or time.monotonic() >= deadline:
                return members
            time.sleep(0.1)

    def stop(self) -> list[int]:
        """SIGTERM to the group, SIGKILL after ``stop_timeout``; returns the process ids that survived both."""
        if self._process is None or self.pgid is None:
            return []
        started = time.monotonic()
        try:
            if self._process.poll() is None or group_members(self.pgid):
                self._signal_group(signal.SIGTERM)
                if self._wait_group(time.monotonic() + self.stop_timeout):
                    self._signal_group(signal.SIGKILL)
                    self._wait_group(time.monotonic() + KILL_TIMEOUT_S)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait(timeout=KILL_TIMEOUT_S)
            self.leftover = group_members(self.pgid)
            self.stop_s = time.monotonic() - started
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return self.leftover

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        leftover = self.stop()
        if leftover and exc_type is None:
            raise RuntimeError(f"vLLM processes survived SIGKILL in group {self.pgid}: {leftover}")

    # -- requests -----------------------------------------------------------------------------------------------
    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S
    ) -> tuple[int, bytes]:
        return http_request(f"{self.url}{path}", method=method, body=body, timeout=timeout)

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S) -> int:
        """POST ``path`` (JSON body if given) and return the HTTP status."""
        status, _ = self.request("POST", path, body, timeout)
        return status

    def completion(self, prompt: str, max_tokens: int = 8) -> str:
        """Text of one greedy ``/v1/completions`` choice."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        status, raw = self.request("POST", "/v1/completions", body)
        if status != 200:
            raise RuntimeError(f"/v1/completions returned {status}: {raw[:2000]!r}")
        return str(json.loads(raw)["choices"][0]["text"])

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as handle:
                return "".join(deque(handle, maxlen=lines))
        except OSError as error:
            return f"<no log: {error}>"
