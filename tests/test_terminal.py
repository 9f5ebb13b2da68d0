"""Progress on long work is drawn on a terminal only (issue 18 item 2).

Each command runs under a real pseudo-terminal (``pty.fork``) and again with pipes: the terminal
shows the progress, the pipes carry none.  No assertion is about time: a hook "running long" is one
that waits until the test has seen its progress, with the threshold passed in as ``progress_after_s``.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from instrument._terminal import Display, wanted

pytest.importorskip("rich")

GUARD_S = 120.0  # only ever hit when something hangs
TRACES = Path(__file__).parent / "data" / "hta" / "trace_filter"  # two real traces, read-only here
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-9]m")  # a foreground colour
PROGRESS = re.compile(r"reading \d+/\d+ files|read \d+ files, .*; slowest ")  # the display and its last line


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR", "TERM", "COLUMNS")}
    env.update(TERM="xterm-256color", COLUMNS="160", **extra)
    return env


def _in_pty(argv: Sequence[str], env: Mapping[str, str], until: str | None = None, then: Path | None = None) -> str:
    """Run ``argv`` with stdin, stdout and stderr on a pseudo-terminal; everything it wrote.

    With ``until``: once that text has appeared, ``then`` is created (the child waits for it).
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec, or leave at once
        try:
            os.execve(argv[0], list(argv), dict(env))
        finally:
            os._exit(127)
    chunks: list[bytes] = []
    deadline = time.monotonic() + GUARD_S
    ended = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child has closed the terminal
                data = b""
            if not data:
                ended = True
                break
            chunks.append(data)
            if until is not None and then is not None and until in b"".join(chunks).decode("utf-8", "replace"):
                then.touch()
    finally:
        if not ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    assert ended, f"{argv} did not end within {GUARD_S} s"
    return b"".join(chunks).decode("utf-8", "replace")


def _instrument(*args: str) -> list[str]:
    return [sys.executable, "-m", "instrument", *args]


# --------------------------------------------------------------------------- instrument analyze


def test_analyze_on_a_terminal_shows_files_and_bytes_then_names_the_slowest_file() -> None:
    out = _in_pty(_instrument("analyze", str(TRACES), "--no-png"), _env())
    assert "reading 0/2 files" in out or "reading 1/2 files" in out
    assert "reading 2/2 files" in out
    assert "kB" in out  # bytes read against bytes on disk
    plain = ESCAPE.sub("", out)
    slowest = [line for line in plain.splitlines() if line.startswith("read 2 files, ")]
    assert len(slowest) == 1, plain
    assert re.search(r"; slowest .*sampled_rank-[01]\.json\.gz \(\d+\.\d s\)", slowest[0])
    assert "instrument analyze:" in plain  # the table follows


def test_analyze_quiet_and_json_on_a_terminal_show_no_progress() -> None:
    for flag in ("--quiet", "--json"):
        out = _in_pty(_instrument("analyze", str(TRACES), "--no-png", flag), _env())
        assert not PROGRESS.search(out), flag
        assert "\x1b[?25l" not in out, flag  # rich hides the cursor while it draws


def test_analyze_piped_carries_no_progress() -> None:
    done = subprocess.run(
        _instrument("analyze", str(TRACES), "--no-png"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not PROGRESS.search(done.stdout + done.stderr)
    assert "\x1b[" not in done.stdout + done.stderr


def test_analyze_in_ci_shows_no_progress_even_on_a_terminal() -> None:
    out = _in_pty(_instrument("analyze", str(TRACES), "--no-png"), _env(CI="true"))
    assert not PROGRESS.search(out)


def test_no_color_keeps_the_progress_without_colour() -> None:
    coloured = _in_pty(_instrument("analyze", str(TRACES), "--no-png"), _env())
    plain = _in_pty(_instrument("analyze", str(TRACES), "--no-png"), _env(NO_COLOR="1"))
    assert "reading 2/2 files" in plain
    assert COLOUR.search(coloured) and not COLOUR.search(plain)


# --------------------------------------------------------------------------- the finish hook

HOOK_TRAINER = """
import sys
from instrument.finish._hook import run_finish_hook
result = run_finish_hook(
    sys.argv[1], env={"GO": sys.argv[2]}, timeout_s=90, log_prefix="[t]", output="stderr", rank=0,
    progress_after_s=float(sys.argv[3]),
)
print("returned", result.returncode, flush=True)
"""

WAITS = 'echo started; while [ ! -e "$GO" ]; do sleep 0.05; done; echo uploaded'


def test_a_long_hook_on_a_terminal_shows_elapsed_against_its_timeout(tmp_path: Path) -> None:
    go = tmp_path / "go"
    argv = [sys.executable, "-c", HOOK_TRAINER, WAITS, str(go), "0.2"]
    out = _in_pty(argv, _env(), until="of 90 s", then=go)  # the hook ends only once its progress was seen
    plain = ESCAPE.sub("", out)
    assert "[hook rank 0] running" in plain
    assert "[hook rank 0] started" in plain and "[hook rank 0] uploaded" in plain
    assert "[hook rank 0] exit 0 after" in plain
    assert "returned 0" in plain


def test_a_hook_piped_shows_no_progress(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.touch()  # the hook ends at once; the threshold is 0, so only the pipe keeps the progress away
    done = subprocess.run(
        [sys.executable, "-c", HOOK_TRAINER, WAITS, str(go), "0"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "of 90 s" not in done.stderr and "\x1b[" not in done.stderr
    assert done.stderr.splitlines()[:2] == ["[hook rank 0] started", "[hook rank 0] uploaded"]


# --------------------------------------------------------------------------- instrument rollout stop


@contextlib.contextmanager
def _flushing_engine(release: Path) -> Iterator[str]:
    """A vLLM-like server on loopback whose ``/stop_profile`` answers once ``release`` exists."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            deadline = time.monotonic() + GUARD_S
            while self.path == "/stop_profile" and not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.touch()
        server.shutdown()
        server.server_close()


def test_rollout_stop_on_a_terminal_shows_each_engine_waiting_for_its_flush(tmp_path: Path) -> None:
    release = tmp_path / "flushed"
    with _flushing_engine(release) as url:
        argv = _instrument("rollout", "stop", "--worker-url", url)
        out = _in_pty(argv, _env(), until=f"{url}: waiting for flush", then=release)
    plain = ESCAPE.sub("", out)
    assert f"{url}: waiting for flush" in plain  # seen before the engine answered: the stop waited for it
    assert "1 of 1 workers ok" in plain


def test_rollout_stop_piped_or_quiet_shows_no_progress(tmp_path: Path) -> None:
    release = tmp_path / "flushed"
    release.touch()
    with _flushing_engine(release) as url:
        done = subprocess.run(
            _instrument("rollout", "stop", "--worker-url", url),
            capture_output=True,
            text=True,
            env=_env(),
            timeout=GUARD_S,
            check=False,
        )
        quiet = _in_pty(_instrument("rollout", "stop", "--worker-url", url, "--quiet"), _env())
    assert done.returncode == 0, done.stderr
    assert "waiting for flush" not in done.stdout + done.stderr and "\x1b[" not in done.stderr
    assert "waiting for flush" not in quiet and "1 of 1 workers ok" in quiet


# --------------------------------------------------------------------------- the display itself


def test_display_off_the_terminal_does_nothing_and_never_raises(tmp_path: Path) -> None:
    with (tmp_path / "file").open("w") as stream:
        assert not wanted(stream)
        with Display(stream) as display:
            assert not display.live
            assert display.add("x", total=1) is None
            display.update(None, advance=1)
            assert display.print("line") is False
    assert (tmp_path / "file").read_text() == ""


def test_a_closed_stream_is_not_a_terminal(tmp_path: Path) -> None:
    stream = (tmp_path / "f").open("w")
    stream.close()
    assert not wanted(stream)
