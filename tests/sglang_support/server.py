"""A stand-in SGLang server and a stand-in SGLang gateway (sgl-router), on 127.0.0.1.

They stand in because a real SGLang server cannot run on this CPU machine: the ``sglang`` wheels on
the registry are CUDA builds (0.5.23 pins torch 2.14.1, CUDA torchvision / torchaudio / torchcodec),
and its CPU engine needs ``sgl_kernel``'s CPU build, which is not on the registry (SGLang builds it
from source for Xeon CPUs); docs/sglang.md shows where it stops. The server is a real HTTP server
from the standard library that answers as SGLang's own code does, read from the release wheels
(``sglang/srt/entrypoints/http_server.py``: ``/start_profile`` and ``/stop_profile`` accept GET and
POST and answer 200 with a text line, an exception becomes a bare 500; ``/server_info`` from 0.5.8,
``/get_server_info`` before, with ``"version"``; the scheduler's profiler
(``managers/scheduler_components/profiler_manager.py`` in 0.5.23) refuses a second start and a stop
without a start, and writes ``[{prefix}-]{profile_id}-TP-{t}.trace.json.gz`` once per TP rank at the
stop, into the body's ``output_dir`` or else the launch's ``SGLANG_TORCH_PROFILER_DIR``). The
gateway answers ``GET /workers`` in the shape of sgl-router's ``WorkerListResponse``
(``sgl-router/src/protocols/worker_spec.rs``: ``{"workers": [{"id", "url", "model_id",
"worker_type", "is_healthy", ...}], "total", "stats"}``).
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

HANG_GUARD_S = 30.0  # how long a held stand-in request waits for the test's release (a guard, never asserted)

Request = tuple[str, str, str | None, Any]  # method, path, content type, JSON body


class SGLangStandIn(http.server.BaseHTTPRequestHandler):
    """SGLang's profiling routes as its source answers them (see the module docstring)."""

    version: ClassVar[str]
    tp_size: ClassVar[int]
    requests: ClassVar[list[Request]]
    state: ClassVar[dict[str, Any]]  # "env_dir": the launch's SGLANG_TORCH_PROFILER_DIR; "profiling", ...
    overrides: ClassVar[dict[str, int]]  # path -> status answered instead (0: held until released)
    release: ClassVar[threading.Event]
    url: ClassVar[str]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        self.requests.append((self.command, self.path, self.headers.get("Content-Type"), body))
        status, text = self._route(body)
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, body: Any) -> tuple[int, str]:
        override = self.overrides.get(self.path)
        if override == 0:
            self.release.wait(HANG_GUARD_S)  # a flush that does not end until the test says so
            return 200, "Stop profiling. This will take some time.\n"
        if override is not None:
            return override, "Internal Server Error" if override == 500 else "no"
        info_route = "/server_info" if tuple(map(int, self.version.split(".")[:3])) >= (0, 5, 8) else "/get_server_info"
        if self.path == info_route:
            return 200, json.dumps({"version": self.version, "tp_size": self.tp_size})
        if self.path == "/health":
            return 200, ""
        if self.path == "/start_profile":
            if self.state.get("profiling"):
                return 500, "Internal Server Error"  # "Profiling is already in progress", in the log only
            self.state.update(profiling=True, body=body or {}, profile_id=str(time.time()))
            return 200, "Start profiling.\n"
        if self.path == "/stop_profile":
            if not self.state.get("profiling"):
                return 500, "Internal Server Error"  # "Profiling is not in progress"
            started = self.state["body"]
            out = Path(started.get("output_dir") or self.state["env_dir"])
            out.mkdir(parents=True, exist_ok=True)
            prefix = f"{started['profile_prefix']}-" if started.get("profile_prefix") else ""
            for tp in range(self.tp_size):
                with gzip.open(out / f"{prefix}{self.state['profile_id']}-TP-{tp}.trace.json.gz", "wt") as f:
                    json.dump({"traceEvents": [{"name": "run_batch", "ph": "X", "ts": 1, "dur": 2}]}, f)
            self.state["profiling"] = False
            return 200, "Stop profiling. This will take some time.\n"
        return 404, '{"detail":"Not Found"}'

    do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up at its deadline (a still-flushing test)


@contextlib.contextmanager
def serve_sglang(env_dir: str | Path, *, version: str = "0.5.23", tp_size: int = 2) -> Iterator[type[SGLangStandIn]]:
    """A stand-in SGLang server launched with ``SGLANG_TORCH_PROFILER_DIR=env_dir``; its handler class
    (``url``, ``requests``, ``state``, ``overrides``, ``release``; ``version`` and ``tp_size`` may be changed)."""

    class Handler(SGLangStandIn):
        requests: ClassVar[list[Request]] = []
        state: ClassVar[dict[str, Any]] = {"env_dir": str(env_dir)}
        overrides: ClassVar[dict[str, int]] = {}
        release = threading.Event()

    Handler.version, Handler.tp_size = version, tp_size
    server = _QuietServer(("127.0.0.1", 0), Handler)
    Handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Handler
    finally:
        Handler.release.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serve_gateway(workers: list[tuple[str, bool]]) -> Iterator[str]:
    """A stand-in sgl-router listing ``(url, healthy)`` workers at ``GET /workers``; yields its URL."""
    listing = {
        "workers": [
            {
                "id": f"worker-{index}",
                "url": url,
                "model_id": "tiny",
                "priority": 50,
                "cost": 1.0,
                "worker_type": "regular",
                "is_healthy": healthy,
                "load": 0,
                "connection_mode": "http",
            }
            for index, (url, healthy) in enumerate(workers)
        ],
        "total": len(workers),
        "stats": {"total_workers": len(workers), "healthy_workers": sum(ok for _, ok in workers)},
    }
    data = json.dumps(listing).encode()

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = (200, data) if self.path == "/workers" else (404, b'{"error":"not found"}')
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
