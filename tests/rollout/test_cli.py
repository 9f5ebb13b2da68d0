"""``instrument rollout`` in-process: launch-args, honest states, markers, bad input before any call.

The engines here are :class:`_Engine`, a loopback HTTP stand-in answering as vLLM 0.32 does (a
stop without a start answers 200, a second start 409). It is used for the shapes a real server
cannot be made to show on demand (a flush that outlasts its deadline while ``/health`` answers) and
to keep this file fast; tests/rollout/test_vllm_server.py runs the same commands against real vLLM
servers behind the real vllm-router.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from instrument import cli
from instrument.rollout._markers import MarkerStore

GUARD_S = 60.0  # a held request is answered after this at the latest, so a broken test cannot hang


class _Engine(http.server.BaseHTTPRequestHandler):
    """vLLM's profiling routes: 409 for a start while profiling; a stop is held while ``hold`` is clear."""

    profiling: ClassVar[bool] = False
    calls: ClassVar[list[str]]
    hold: ClassVar[threading.Event]
    health: ClassVar[int] = 200

    def _send(self, status: int, body: bytes = b"{}") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        cls.calls.append(self.path)
        if self.path == "/start_profile":
            if cls.profiling:
                self._send(409, b'{"error": {"code": 409}}')
                return
            cls.profiling = True
            self._send(200)
        elif self.path == "/stop_profile":
            cls.hold.wait(GUARD_S)
            cls.profiling = False
            self._send(200)
        else:
            self._send(404)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(type(self).health, b"")
        elif self.path == "/openapi.json":
            self._send(200, json.dumps({"paths": {"/start_profile": {}, "/stop_profile": {}}}).encode())
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up at its deadline (the point of the still-flushing test)


@pytest.fixture
def engine() -> Iterator[type[_Engine]]:
    class Engine(_Engine):
        calls: ClassVar[list[str]] = []
        hold: ClassVar[threading.Event] = threading.Event()

    Engine.hold.set()
    server = _QuietServer(("127.0.0.1", 0), Engine)
    Engine.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Engine
    Engine.hold.set()
    server.shutdown()
    server.server_close()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(["rollout", *args, "--quiet"] if args[0] != "launch-args" else ["rollout", *args])
    out, err = capsys.readouterr()
    return status, out, err


# --------------------------------------------------------------------------- launch-args


def test_launch_args_prints_shell_words_for_the_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, err = _run(capsys, "launch-args", "--profiler-dir", str(tmp_path), "--replica", "2",
                            "--vllm-version", "0.32.0", "contents=[cpu,shapes]")  # fmt: skip
    assert status == 0
    assert out.startswith("--profiler-config '{") and out.endswith("}'\n")
    config = json.loads(out.split(" ", 1)[1].strip().strip("'"))
    assert config["torch_profiler_dir"] == str(tmp_path / "replica2")
    assert config["torch_profiler_record_shapes"] is True and config["torch_profiler_with_stack"] is False
    assert "vLLM 0.32.0 (given)" in err and "at the end of the server's command line" in err


def test_launch_args_for_an_old_vllm_are_environment_assignments(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = _run(capsys, "launch-args", "--profiler-dir", str(tmp_path), "--vllm-version", "0.11.0")
    assert status == 0 and out.startswith(f"VLLM_TORCH_PROFILER_DIR={tmp_path / 'replica0'} ")
    assert "before the command" in err
    status, out, _ = _run(capsys, "launch-args", "--profiler-dir", str(tmp_path), "--vllm-version", "0.11.0", "--json")
    launch = json.loads(out)
    assert launch["args"] == [] and launch["env"]["VLLM_TORCH_PROFILER_DIR"] == str(tmp_path / "replica0")
    assert launch["version_source"] == "given"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vllm-version", "latest"], "'vllm_version' must look like '0.13.0'"),
        (["--replica", "-1"], "'replica' must be an int >= 0"),
        (["steps=[0]"], "steps"),
    ],
)
def test_launch_args_bad_input_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    status, out, err = _run(capsys, "launch-args", "--profiler-dir", str(tmp_path), *args)
    assert status == 2 and out == "" and message in err and err.startswith("instrument rollout: error: ")


# --------------------------------------------------------------------------- honest states


def test_start_twice_says_restarted_and_stop_without_start_says_not_profiling(
    capsys: pytest.CaptureFixture[str], engine: type[_Engine], tmp_path: Path
) -> None:
    url, state = engine.url, ["--state-dir", str(tmp_path)]  # type: ignore[attr-defined]
    status, out, _ = _run(capsys, "stop", "--worker-url", url, *state)
    assert status == 0 and "not profiling: nothing flushed (no start recorded for it)" in out
    status, out, _ = _run(capsys, "start", "--worker-url", url, "--step", "2", *state)
    assert status == 0 and out.splitlines()[1].endswith("  profiling")
    assert MarkerStore(tmp_path).read(url).prefix == "step2"  # type: ignore[union-attr]
    status, out, _ = _run(capsys, "start", "--worker-url", url, "--step", "3", *state, "--json")
    [row] = json.loads(out)["workers"]
    assert row["state"] == "restarted" and row["ok"] is True
    assert "was profiling since" in row["detail"] and "earlier traces flushed as step2_*" in row["detail"]
    assert engine.calls == ["/stop_profile", "/start_profile", "/start_profile", "/stop_profile", "/start_profile"]
    status, out, _ = _run(capsys, "status", "--worker-url", url, *state)
    assert "profiling routes present; started here at" in out and "prefix step3" in out
    status, out, _ = _run(capsys, "stop", "--worker-url", url, *state)
    assert status == 0 and "stopped, traces flushed" in out
    assert MarkerStore(tmp_path).read(url) is None  # the start is over


def test_a_start_not_made_here_is_restarted_and_said_so(
    capsys: pytest.CaptureFixture[str], engine: type[_Engine], tmp_path: Path
) -> None:
    engine.profiling = True  # started by someone else (a trainer, curl)
    status, out, _ = _run(capsys, "start", "--worker-url", engine.url, "--state-dir", str(tmp_path))  # type: ignore[attr-defined]
    assert status == 0 and "was profiling (not started from here): restarted" in out


def test_a_stop_past_its_timeout_on_a_live_server_is_still_flushing(
    capsys: pytest.CaptureFixture[str], engine: type[_Engine], tmp_path: Path
) -> None:
    url, state = engine.url, ["--state-dir", str(tmp_path)]  # type: ignore[attr-defined]
    save, base = tmp_path / "save", tmp_path / "prof"
    assert _run(capsys, "start", "--worker-url", url, "--step", "1", *state)[0] == 0
    engine.hold.clear()  # the flush outlasts the stop's deadline; /health still answers
    status, out, _ = _run(capsys, "stop", "--worker-url", url, "--stop-timeout", "0.5", "--step", "1",
                          "--save-path", str(save), "--profiler-dir", str(base), *state)  # fmt: skip
    assert status == 1
    assert "still flushing after 0.5 s (the server answers /health)" in out
    assert "relocation skipped: 1 worker(s) still flushing; run the same stop again" in out
    assert MarkerStore(tmp_path).read(url) is not None  # kept for the stop that collects
    assert not save.exists()
    engine.hold.set()
    engine.health = 503
    engine.hold.clear()
    status, out, _ = _run(capsys, "stop", "--worker-url", url, "--stop-timeout", "0.5", *state)
    assert status == 1 and "timed out after 0.5 s" in out and "still flushing" not in out  # not answering: not said
    engine.hold.set()


# --------------------------------------------------------------------------- bad input, before any call


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--save-path", "S"], "--save-path needs --step and --profiler-dir"),
        (["--save-path", "S", "--step", "0", "--profiler-dir", "P"], "--step must be >= 1"),
        (["--save-path", "S", "--step", "1", "--profiler-dir", "P", "--gpus-per-replica", "0"], "--gpus-per-replica"),
        (
            ["--save-path", "S", "--step", "1", "--profiler-dir", "P", "--world-size", "3", "--gpus-per-replica", "2"],
            "--world-size must be a positive multiple of --gpus-per-replica",
        ),
        (["--profiler-dir", "P"], "--profiler-dir is only used with --save-path"),
        (["--save-path", "S", "--step", "1", "--profiler-dir", "P", "ranks=[5]"], "'ranks' selects rank 5"),
    ],
)
def test_a_bad_stop_exits_2_before_any_worker_is_stopped(
    capsys: pytest.CaptureFixture[str], engine: type[_Engine], tmp_path: Path, args: list[str], message: str
) -> None:
    status, out, err = _run(capsys, "stop", "--worker-url", engine.url, "--state-dir", str(tmp_path), *args)  # type: ignore[attr-defined]
    assert status == 2 and out == "" and message in err, err
    assert engine.calls == []


@pytest.mark.parametrize(
    ("flag", "url", "message"),
    [
        (
            "--router-url",
            "127.0.0.1:30000",
            "router URL must be http(s)://host:port: '127.0.0.1:30000' (no scheme: did you mean "
            "'http://127.0.0.1:30000'?)",
        ),
        ("--worker-url", "10.0.0.5:8000", "worker URL must be http(s)://host:port: '10.0.0.5:8000' (no scheme"),
        ("--worker-url", "ftp://host:1", "worker URL must be http(s)://host:port: 'ftp://host:1'"),
    ],
)
def test_urls_are_named_for_what_they_are(
    capsys: pytest.CaptureFixture[str], flag: str, url: str, message: str
) -> None:
    status, out, err = _run(capsys, "status", flag, url)
    assert status == 2 and out == "" and message in err


def test_a_server_that_is_not_a_router_says_so(capsys: pytest.CaptureFixture[str], engine: type[_Engine]) -> None:
    status, _, err = _run(capsys, "status", "--router-url", engine.url)  # type: ignore[attr-defined]
    assert status == 2
    assert f"{engine.url} is not a router (no /workers, no /list_workers" in err and "--worker-url" in err  # type: ignore[attr-defined]


def test_relocation_of_a_missing_profiler_dir_is_a_failure_naming_it(
    capsys: pytest.CaptureFixture[str], engine: type[_Engine], tmp_path: Path
) -> None:
    url, state = engine.url, ["--state-dir", str(tmp_path / "state")]  # type: ignore[attr-defined]
    assert _run(capsys, "start", "--worker-url", url, "--step", "1", *state)[0] == 0
    status, out, _ = _run(capsys, "stop", "--worker-url", url, "--step", "1", "--save-path", str(tmp_path / "save"),
                          "--profiler-dir", str(tmp_path / "nowhere"), *state)  # fmt: skip
    assert status == 1 and f"relocation FAILED: {tmp_path / 'nowhere'} does not exist" in out
    assert MarkerStore(tmp_path / "state").read(url) is not None  # kept: the same stop, rerun, retries it
