"""Request spans (``instrument.request``) in the step timeline: the stage and step they belong to, their tokens,
from sync code, threads and asyncio; bad counts and misplaced requests named once; the free path."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
import instrument.testing
from instrument import cli
from instrument.naming import TIMELINE_SUFFIX
from instrument.run._state import STATE
from instrument.timeline import Timeline, read_timeline


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="instrument"):
        yield caplog


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("instrument")]


def _configure(tmp_path: Path, **settings: Any) -> None:
    ins.configure(ins.ProfilerConfig(save_path=str(tmp_path), steps=(99,), **settings), role="rollout", rank=0)


def _timeline(tmp_path: Path) -> Timeline:
    ins.finish()
    (path,) = tmp_path.glob("*" + TIMELINE_SUFFIX)
    return read_timeline(path)


def _rows(timeline: Timeline) -> list[tuple[Any, ...]]:
    return list(timeline.requests.rows())


def test_the_with_form_records_stage_step_thread_and_tokens(tmp_path: Path) -> None:
    _configure(tmp_path)
    generate = ins.profiled_stage("generate_sequences")
    with ins.profile_step(1), generate:
        for n in (3, 5):
            with ins.request(prompt_tokens=n) as r:
                r.output_tokens = 10 * n
    timeline = _timeline(tmp_path)
    rows = _rows(timeline)
    assert [(stage, step, p, o) for stage, step, _, _, _, p, o in rows] == [
        ("generate_sequences", 1, 3, 30),
        ("generate_sequences", 1, 5, 50),
    ]
    (stage_span,) = [s for s in timeline.spans if s.kind == "stage"]
    for _, _, start, end, thread, _, _ in rows:
        assert stage_span.start_ns <= start <= end <= stage_span.end_ns
        assert timeline.threads[thread] == threading.get_ident()


def test_hundreds_of_concurrent_asyncio_requests_take_their_stage_and_counts(tmp_path: Path) -> None:
    _configure(tmp_path)

    @ins.request(prompt_tokens=lambda n: n + 1, output_tokens=len)
    async def generate(n: int) -> list[int]:
        await asyncio.sleep(0)  # every request is open at once before any ends
        return [0] * n

    @ins.profiled_stage("generate_sequences")
    async def rollout() -> list[list[int]]:
        return await asyncio.gather(*(generate(n) for n in range(300)))

    for step in (1, 2):
        with ins.profile_step(step):
            assert [len(r) for r in asyncio.run(rollout())] == list(range(300))
    rows = _rows(_timeline(tmp_path))
    assert len(rows) == 600
    assert {(stage, step) for stage, step, *_ in rows} == {("generate_sequences", 1), ("generate_sequences", 2)}
    assert sorted((p, o) for _, step, _, _, _, p, o in rows if step == 1) == [(n + 1, n) for n in range(300)]
    first_end = min(end for _, step, _, end, *_ in rows if step == 1)
    assert max(start for _, step, start, *_ in rows if step == 1) < first_end  # they ran concurrently


def test_requests_in_threads_belong_to_the_stage_running_them(tmp_path: Path) -> None:
    # A decorated stage on an unprofiled step pushes nothing on the stage stack, and pool threads have their own
    # context: the writer places each request in the stage span that contains it (any thread's).
    _configure(tmp_path)

    def call(n: int) -> int:
        with ins.request(prompt_tokens=n, output_tokens=n):
            return n

    @ins.profiled_stage("generate_sequences")
    def rollout() -> list[int]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(call, range(40)))

    with ins.profile_step(1):
        rollout()
    timeline = _timeline(tmp_path)
    rows = _rows(timeline)
    assert len(rows) == 40
    assert {stage for stage, *_ in rows} == {"generate_sequences"}
    assert threading.get_ident() not in {timeline.threads[thread] for _, _, _, _, thread, _, _ in rows}


def test_a_request_in_no_stage_is_named_once_counted_and_kept_in_its_step(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    _configure(tmp_path)
    for step in (1, 2):
        with ins.profile_step(step):
            for _ in range(3):
                with ins.request(prompt_tokens=1):
                    pass
    run = ins.current_run()
    assert run is not None
    timeline = _timeline(tmp_path)
    assert [(stage, step) for stage, step, *_ in _rows(timeline)] == [(None, 1)] * 3 + [(None, 2)] * 3
    outside = [m for m in _warned(warnings) if "outside any stage" in m]
    assert len(outside) == 1 and "3 request(s)" in outside[0] and "rank 0" in outside[0]
    assert run.failures == 2  # one per step's batch of strays


def test_a_request_outside_any_step_is_named_once_and_recorded_at_step_0(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    _configure(tmp_path)
    with ins.profile_step(1):
        pass
    stage = ins.profiled_stage("generate_sequences")
    with stage:
        for _ in range(2):
            with ins.request(output_tokens=4):
                pass
    rows = _rows(_timeline(tmp_path))
    assert [(s, step, o) for s, step, _, _, _, _, o in rows] == [("generate_sequences", 0, 4)] * 2
    assert len([m for m in _warned(warnings) if "a request ran outside any step" in m]) == 1


@pytest.mark.parametrize("bad", [-1, float("nan"), 2.0, "3", True, 10**15 + 1, [1]])
def test_a_count_that_is_no_count_is_refused_with_one_warning(
    tmp_path: Path, warnings: pytest.LogCaptureFixture, bad: Any
) -> None:
    _configure(tmp_path)
    with ins.profile_step(1), ins.profiled_stage("generate_sequences"):
        for _ in range(3):
            with ins.request(prompt_tokens=bad) as r:
                r.output_tokens = bad
    rows = _rows(_timeline(tmp_path))
    assert [(p, o) for *_, p, o in rows] == [(-1, -1)] * 3
    (message,) = [m for m in _warned(warnings) if "is not a token count" in m]
    assert "prompt_tokens=" in message and "0 to 10^15" in message


def test_integer_types_and_the_bounds_are_counts(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    _configure(tmp_path)
    with ins.profile_step(1), ins.profiled_stage("generate_sequences"):
        for p, o in ((0, 10**15), (numpy.int64(7), numpy.int32(8))):
            with ins.request(prompt_tokens=p, output_tokens=o):
                pass
    assert [(p, o) for *_, p, o in _rows(_timeline(tmp_path))] == [(0, 10**15), (7, 8)]


def test_a_reader_that_raises_is_named_and_the_call_goes_on(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    _configure(tmp_path)

    @ins.request(output_tokens=lambda result: result["usage"])
    def call() -> dict[str, int]:
        return {}

    with ins.profile_step(1), ins.profiled_stage("generate_sequences"):
        assert call() == {}
        assert call() == {}
    assert [o for *_, o in _rows(_timeline(tmp_path))] == [-1, -1]
    assert len([m for m in _warned(warnings) if "could not be read" in m and "KeyError" in m]) == 1


def test_a_request_that_raises_is_recorded_and_the_error_goes_on(tmp_path: Path) -> None:
    _configure(tmp_path)

    @ins.request(prompt_tokens=5, output_tokens=len)
    def call() -> list[int]:
        raise ConnectionError("engine gone")

    with ins.profile_step(1), ins.profiled_stage("generate_sequences"):
        with pytest.raises(ConnectionError, match="engine gone"):
            call()
        with pytest.raises(ValueError, match="bad"), ins.request(prompt_tokens=2):
            raise ValueError("bad")
    assert [(p, o) for *_, p, o in _rows(_timeline(tmp_path))] == [(5, -1), (2, -1)]


def test_before_configure_and_with_the_timeline_off_nothing_is_checked(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    @ins.request(output_tokens=len)
    def call() -> list[int]:
        return [1]

    with ins.request(prompt_tokens=-5):  # before configure
        assert call() == [1]
    assert STATE.session is None and STATE.early == 0
    _configure(tmp_path, timeline=False)
    with ins.profile_step(1), ins.request(prompt_tokens=float("nan")):
        assert call() == [1]
    ins.finish()
    assert _warned(warnings) == []
    assert list(tmp_path.glob("*" + TIMELINE_SUFFIX)) == []


def test_an_async_generator_is_refused_at_decoration_with_the_fix() -> None:
    async def stream() -> Any:
        yield 1

    with pytest.raises(TypeError, match=r"consumes it in `with instrument\.request"):
        ins.request()(stream)
    with pytest.raises(TypeError, match="decorates a callable"):
        ins.request()(3)  # type: ignore[type-var]


def test_analyze_reads_a_run_with_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _configure(tmp_path)

    @ins.profiled_stage("generate_sequences")
    def rollout() -> None:
        for n in range(5):
            with ins.request(prompt_tokens=n, output_tokens=n):
                pass

    for step in (1, 2, 3):
        with ins.profile_step(step):
            rollout()
    assert len(_timeline(tmp_path).requests) == 15
    assert cli.main(["analyze", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["timeline"]["steps"]) == 3


class _Completions(http.server.BaseHTTPRequestHandler):
    """A stand-in for an OpenAI-compatible server (stdlib HTTP, real sockets): ``/v1/completions`` answers
    ``max_tokens`` tokens and says so in ``usage``, as vLLM's server does. The real server is vLLM's, which
    tests/rollout/ starts (slow); this checks the call-site form, not the engine."""

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(
            {
                "choices": [{"text": "x" * asked["max_tokens"]}],
                "usage": {"prompt_tokens": len(asked["prompt"].split()), "completion_tokens": asked["max_tokens"]},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_openai_compatible_call_records_the_usage_it_reports(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"

    @ins.request(output_tokens=lambda response: response["usage"]["completion_tokens"])
    def complete(prompt: str, max_tokens: int) -> dict[str, Any]:
        data = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    _configure(tmp_path)
    try:
        with ins.profile_step(1), ins.profiled_stage("generate_sequences"), ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda n: complete("a b c", n), [1, 64, 7, 300]))
    finally:
        server.shutdown()
        server.server_close()
    assert [len(a["choices"][0]["text"]) for a in answers] == [1, 64, 7, 300]
    rows = _rows(_timeline(tmp_path))
    assert sorted(o for *_, o in rows) == [1, 7, 64, 300]
    assert {stage for stage, *_ in rows} == {"generate_sequences"}


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    instrument.testing.reset()
    yield
    instrument.testing.reset()
