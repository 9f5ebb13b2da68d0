"""The real ``vllm-router`` (the registry package ``vllm-router``, a Rust binary) in front of test servers.

It is installed into the vLLM environment (``make test`` does), so its binary sits next to that
environment's interpreter. Standard library only; everything binds to 127.0.0.1.

    with VllmRouter(python, [server_a.url, server_b.url], log_path=tmp / "router.log") as router:
        router.url  # GET /workers lists both

The router waits for its workers to be healthy before it serves, so start it after them. Two
routers on one host need their own ``--prometheus-port`` (the second one panics otherwise): each
gets a free one here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO

from tests.vllm_support.server import HOST, free_port, http_request

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def router_binary(python: str) -> Path:
    """``vllm-router`` next to the vLLM environment's interpreter; ``FileNotFoundError`` naming the fix."""
    binary = Path(python).parent / "vllm-router"
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"{binary} is missing: pip install vllm-router==0.1.17 into that environment")
    return binary


class VllmRouter:
    """``vllm-router --worker-urls ...`` as a context manager that waits for ``GET /workers`` and stops it after."""

    def __init__(self, python: str, workers: list[str], *, log_path: Path) -> None:
        self.binary = router_binary(python)
        self.workers = list(workers)
        self.port = free_port()
        self.prometheus_port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = Path(log_path)
        self.ready_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(self.prometheus_port),
            "--worker-urls",
            *self.workers,
        ]

    def start(self) -> VllmRouter:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        started = time.monotonic()
        self._process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self._process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                status, body = http_request(f"{self.url}/workers", timeout=2.0)
                if status == 200 and len(json.loads(body).get("workers", [])) == len(self.workers):
                    return
            time.sleep(0.2)
        raise TimeoutError(f"vllm-router not serving /workers after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as handle:
                return "".join(deque(handle, maxlen=lines))
        except OSError as error:
            return f"<no log: {error}>"

    def __enter__(self) -> VllmRouter:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
