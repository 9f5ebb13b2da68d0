"""Hostile HTTP peers for the rollout tools: drips, non-HTTP bytes, short bodies, silence.

Every peer is a real socket server on 127.0.0.1 that misbehaves on purpose; nothing is mocked.
The CLI runs in a subprocess with a generous ``timeout`` that only guards against a hang: a run
that returns at all, against a drip that would take minutes to finish, proves the deadline held.
The assertions are about what was said and the exit status, never about how long it took.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import instrument as ins
from instrument.manifest import Manifest
from instrument.rollout import RolloutProfiler, _http
from instrument.rollout._fanout import fan_out, list_router_workers
from instrument.rollout._markers import MarkerStore
from instrument.rollout.vllm import HttpEngineDriver

T = TypeVar("T")
Behaviour = Callable[[socket.socket, str, threading.Event], None]

HANG_GUARD_S = 60  # only against a hang; no assertion depends on it
DRIP_BYTES = 120  # at one byte a second: two minutes, far past any deadline used here
OPENAPI = json.dumps({"paths": {"/start_profile": {}, "/stop_profile": {}}}).encode()


def _vllm(url: str, timeout_s: float, stop_timeout_s: float) -> HttpEngineDriver:
    return HttpEngineDriver(url, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)


# --------------------------------------------------------------------------- peers


def _read_request(conn: socket.socket) -> str:
    """The request's path, after reading the whole request (so closing never resets the peer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return ""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return head.split(b" ")[1].decode()


def _answer(conn: socket.socket, status: int, body: bytes) -> None:
    conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, len(body), body))


def vllm_like(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """A well-behaved vLLM server with profiling routes."""
    _answer(conn, 200, OPENAPI if path == "/openapi.json" else b"{}")


def drip_body(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """Headers at once, then the body one byte a second (``/start_profile`` answers normally)."""
    if path == "/start_profile":
        _answer(conn, 200, b"{}")
        return
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % DRIP_BYTES)
    for _ in range(DRIP_BYTES):
        if stop.wait(1.0):
            return
        conn.sendall(b" ")


def drip_headers(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """The status line itself, one byte a second."""
    for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * DRIP_BYTES:
        if stop.wait(1.0):
            return
        conn.sendall(bytes([byte]))


def garbage(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """Not HTTP at all (another service on the port)."""
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")


def short_body(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """Promises 1000 bytes, sends 10, closes."""
    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"workers"')


def short_chunked(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """A chunked body cut in the middle of a chunk."""
    conn.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n["http://a:1"')


def hang_up(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """Reads the request and closes without a word."""


def silent(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """Reads the request and never answers."""
    stop.wait(HANG_GUARD_S * 2)


def big_body(conn: socket.socket, path: str, stop: threading.Event) -> None:
    """A well-formed answer far larger than anything a profiler route returns."""
    _answer(conn, 200, b"x" * 5000)


def router_of(urls: list[str]) -> Behaviour:
    """A router listing ``urls`` under ``GET /workers``."""
    listing = json.dumps({"workers": [{"url": u, "is_healthy": True} for u in urls]}).encode()

    def behave(conn: socket.socket, path: str, stop: threading.Event) -> None:
        _answer(conn, 200 if path == "/workers" else 404, listing if path == "/workers" else b"")

    return behave


class Peer:
    """A threaded TCP server on 127.0.0.1 answering every connection with ``behaviour``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client gave up: the point of most of these peers
            self.behaviour(conn, _read_request(conn), self.stop)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def peer() -> Iterator[Callable[[Behaviour], str]]:
    """Start peers by behaviour; all are closed after the test."""
    started: list[Peer] = []

    def start(behaviour: Behaviour) -> str:
        started.append(Peer(behaviour))
        return started[-1].url

    yield start
    for p in started:
        p.close()


_STATE = tempfile.mkdtemp(prefix="instrument-rollout-state-")  # start markers stay out of the user's home


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``instrument rollout ...`` in a subprocess; returning before the hang guard proves the bound."""
    return subprocess.run(
        [sys.executable, "-m", "instrument", "rollout", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": _STATE},
    )


def _rows(stdout: str) -> dict[str, str]:
    """Table rows by worker URL."""
    return {line.split()[0]: line for line in stdout.splitlines() if line.startswith("http://")}


# --------------------------------------------------------------------------- R3/R4: overall deadlines


def test_status_against_a_drip_ends_at_its_deadline(peer: Callable[[Behaviour], str]) -> None:
    drip, good = peer(drip_body), peer(vllm_like)
    result = _cli("status", "--worker-url", drip, "--worker-url", good, "--timeout", "2")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    rows = _rows(result.stdout)
    assert "FAILED" in rows[drip] and "timed out after 2 s" in rows[drip]
    assert set(rows) == {drip, good}  # the other worker keeps its row (its outcome is the table test's)


def test_stop_against_a_drip_ends_at_the_stop_timeout(peer: Callable[[Behaviour], str]) -> None:
    drip = peer(drip_body)
    result = _cli("stop", "--worker-url", drip, "--stop-timeout", "3", "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    [outcome] = json.loads(result.stdout)["workers"]
    assert outcome["ok"] is False
    assert "/stop_profile timed out after 3 s" in outcome["detail"]


def test_a_status_line_dripped_byte_by_byte_is_bounded_too(peer: Callable[[Behaviour], str]) -> None:
    drip = peer(drip_headers)
    outcomes = _in_thread(lambda: fan_out("status", [drip], timeout_s=2, driver_for=_vllm))
    assert [(o.ok, "timed out after 2 s" in o.detail) for o in outcomes] == [(False, True)]


def test_a_silent_worker_times_out(peer: Callable[[Behaviour], str]) -> None:
    url = peer(silent)
    with pytest.raises(_http.HttpError, match="/start_profile timed out after 1 s"):
        _in_thread(lambda: HttpEngineDriver(url, timeout_s=1).start())


def test_rollout_profiler_stop_during_training_is_bounded(
    peer: Callable[[Behaviour], str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = peer(drip_body)  # /start_profile answers; /stop_profile drips
    cfg = ins.ProfilerConfig(save_path=str(tmp_path / "save"), steps=(1,))
    profiler = RolloutProfiler(
        cfg,
        HttpEngineDriver(url, stop_timeout_s=2),
        rank=0,
        world_size=1,
        gpus_per_replica=1,
        profiler_base=tmp_path / "prof",
        manifest=Manifest(cfg.save_path),
    )
    assert profiler.start(1) is True
    with caplog.at_level(logging.WARNING, logger="instrument"):
        assert _in_thread(lambda: profiler.stop(1)) == []
    assert profiler.failures == 1
    assert "timed out after 2 s" in caplog.text


def _in_thread(call: Callable[[], T]) -> T:
    """Run ``call`` in a daemon thread, guarded against a hang; re-raise what it raised."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "the call never returned"
    error = box.get("error")
    if isinstance(error, BaseException):
        raise error
    return box["value"]  # type: ignore[return-value]


# --------------------------------------------------------------------------- R1/R2: broken peers are rows or one line


def test_every_broken_worker_is_a_row_of_the_table(peer: Callable[[Behaviour], str]) -> None:
    good = [peer(vllm_like) for _ in range(4)]
    bad = {"garbage": peer(garbage), "short": peer(short_body)}
    with socket.create_server(("127.0.0.1", 0)) as closed:  # a port nobody listens on once closed
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}"
    router = peer(router_of([*good, bad["garbage"], bad["short"], refused]))
    result = _cli("start", "--router-url", router, "--prefix", "step1", "--timeout", "30")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    rows = _rows(result.stdout)
    assert len(rows) == 7
    assert all(" ok " in rows[u] for u in good)
    assert "did not answer HTTP" in rows[bad["garbage"]]
    assert "closed the connection after 10 of 1000 body bytes" in rows[bad["short"]]
    assert "unreachable (cannot connect" in rows[refused]
    assert result.stdout.splitlines()[-1] == "4 of 7 workers ok, 3 failed"


@pytest.mark.parametrize(
    ("behaviour", "timeout", "message"),
    [  # a generous deadline where the peer answers at once, so load cannot turn it into a timeout
        (garbage, "30", "did not answer HTTP"),
        (short_body, "30", "closed the connection after 10 of 1000 body bytes"),
        (drip_body, "2", "timed out after 2 s"),
        (big_body, "30", "did not answer JSON"),
    ],
)
def test_a_broken_router_is_one_line_and_exit_2(
    peer: Callable[[Behaviour], str], behaviour: Behaviour, timeout: str, message: str
) -> None:
    router = peer(behaviour)
    result = _cli("status", "--router-url", router, "--timeout", timeout)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("instrument rollout: error: ")
    assert router in line
    assert message in line


def test_the_router_listing_in_process_says_what_went_wrong(peer: Callable[[Behaviour], str]) -> None:
    for behaviour, message in [
        (garbage, "did not answer HTTP"),
        (short_body, "closed the connection after 10 of 1000 body bytes"),
        (short_chunked, "closed the connection before the end of its chunked body"),
        (hang_up, "closed the connection without answering"),
    ]:
        router = peer(behaviour)
        with pytest.raises(ValueError, match=message):
            list_router_workers(router, timeout_s=30)


def test_answers_are_bounded_in_size(peer: Callable[[Behaviour], str]) -> None:
    url = peer(big_body)
    with pytest.raises(_http.HttpError, match="larger than 1000 bytes"):
        _http.request(f"{url}/openapi.json", timeout_s=30, max_bytes=1000)
    assert _http.request(f"{url}/openapi.json", timeout_s=30) == (200, b"x" * 5000)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_deadlines_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="'timeout_s' must be a finite number of seconds > 0"):
        _http.request("http://127.0.0.1:1/", timeout_s=bad)
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        HttpEngineDriver("http://127.0.0.1:1", stop_timeout_s=bad)
    with pytest.raises(ValueError, match="'timeout_s' must be a finite number of seconds > 0"):
        fan_out("status", ["http://127.0.0.1:1"], timeout_s=bad, driver_for=_vllm)


@pytest.mark.parametrize("bad", [True, "5", None])
def test_a_deadline_that_is_not_a_number_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=f"'stop_timeout_s' must be a number of seconds > 0: {bad!r}"):
        HttpEngineDriver("http://127.0.0.1:1", stop_timeout_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("started", [float("inf"), float("-inf"), float("nan"), "soon", None])
def test_a_start_marker_whose_time_no_clock_gives_is_no_marker(tmp_path: Path, started: object) -> None:
    """A marker's ``started_ns`` that is no integer (``Infinity`` once raised OverflowError out of ``read``)."""
    store, url = MarkerStore(tmp_path), "http://127.0.0.1:8000"
    store.path(url).write_text(json.dumps({"url": url, "started_ns": started}), encoding="utf-8")
    assert store.read(url) is None
    store.path(url).write_text(json.dumps({"url": url, "started_ns": 5}), encoding="utf-8")
    assert store.read(url) is not None  # the same file with a time is one
