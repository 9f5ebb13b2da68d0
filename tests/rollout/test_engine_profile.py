"""An engine added through public registration alone: ``toyllm``, end to end (launch, start, stop, relocation).

``toyllm`` is not a real engine: :class:`_ToyServer` is a small real HTTP server on 127.0.0.1, in a
thread, standing in for an engine that cannot run here (any new engine's server on a CPU machine).
It answers as such an engine might: ``POST /profile/start`` (409 while profiling), ``POST
/profile/stop`` (400 when idle; otherwise it writes one trace per GPU and one for its API server
into the directory its launch arguments named, then answers), ``GET /profiler``. Everything that
reads it is the library's own: ``register_engine``, ``instrument rollout launch-args|start|stop
--engine toyllm``, the markers, relocation of real files by global rank, the manifest, and
``instrument.ranks`` reading its names. Nothing here waits on the clock.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import instrument as ins
from instrument import cli, ranks
from instrument.manifest import Manifest, read_manifests
from instrument.rollout import (
    EngineDriver,
    EngineProfile,
    EngineProfilerError,
    LaunchArgs,
    NotProfilingError,
    RolloutProfiler,
    ServerDriver,
    TraceNames,
    engine_of,
    engine_profile,
    engine_profiles,
    register_engine,
    unregister_engine,
)

# --------------------------------------------------------------------------- the engine, as its author writes it

TOY_TRACES = TraceNames(
    engine="toyllm",
    # "[{prefix}.]toy[-dp{d}]-gpu{g}.trace.json.gz": g counts within DP rank d
    workers=(r"(?:^|\.)toy(?:-dp(?P<dp>\d+))?-gpu(?P<rank>\d+)\.trace\.json\.gz$",),
    frontend=r"(?:^|\.)toy-api-pid(?P<pid>\d+)\.trace\.json\.gz$",
    prefix_joint=".",
)


class ToyDriver:
    """One toyllm server over HTTP: a :class:`ServerDriver` for ``instrument rollout`` and an
    :class:`EngineDriver` for :class:`RolloutProfiler`."""

    traces = TOY_TRACES
    refuses_idle_stop = True  # its stop answers 400 when idle: a stop it accepts flushed something

    def __init__(self, url: str, *, timeout_s: float = 10.0, stop_timeout_s: float = 60.0) -> None:
        self.url, self.timeout_s, self.stop_timeout_s = url.rstrip("/"), timeout_s, stop_timeout_s

    def _call(self, method: str, route: str, body: Any = None, timeout_s: float | None = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{route}", data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def has_profiler_routes(self) -> bool:
        """Whether the server was launched with a trace directory."""
        return self._call("GET", "/profiler") == 200

    def start_profile(self, prefix: str | None = None) -> bool:
        """Start profiling; ``True`` when it was profiling already (flushed, then started again)."""
        status = self._call("POST", "/profile/start", {"prefix": prefix})
        restarted = status == 409
        if restarted:
            self.stop()
            status = self._call("POST", "/profile/start", {"prefix": prefix})
        if status != 200:
            raise EngineProfilerError(f"{self.url}/profile/start answered {status}")
        return restarted

    def start(self, prefix: str | None = None) -> None:
        """Start profiling (:class:`EngineDriver`)."""
        self.start_profile(prefix)

    def stop(self) -> float:
        """Stop once the traces are written; :class:`NotProfilingError` when it was idle."""
        started = time.monotonic()
        status = self._call("POST", "/profile/stop", timeout_s=self.stop_timeout_s)
        if status == 400:
            raise NotProfilingError("not profiling: nothing flushed (toyllm answered 400)")
        if status != 200:
            raise EngineProfilerError(f"{self.url}/profile/stop answered {status}")
        return time.monotonic() - started


def toy_launch_args(config: ins.ProfilerConfig, *, profiler_dir: str, version: str | None) -> LaunchArgs:
    # toyllm 2 takes a flag; 1.x read an environment variable.
    if version is not None and int(version.split(".")[0]) < 2:
        return LaunchArgs(args=(), env={"TOYLLM_TRACE_DIR": profiler_dir})
    return LaunchArgs(args=("--trace-dir", profiler_dir), env={})


def toy_http_driver(
    url: str,
    config: ins.ProfilerConfig,
    *,
    timeout_s: float,
    stop_timeout_s: float,
    started_here: bool,
    stops_by_itself: bool,
) -> ToyDriver:
    return ToyDriver(url, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)


TOY = EngineProfile(
    name="toyllm",
    label="ToyLLM",
    traces=TOY_TRACES,
    launch_args=toy_launch_args,
    http_driver=toy_http_driver,
    version_example="2.0",
    launch_command="toyllm serve MODEL",
    launch_summary="'--trace-dir DIR' (toyllm >= 2), else TOYLLM_TRACE_DIR=DIR",
)


@pytest.fixture
def toyllm() -> Iterator[EngineProfile]:
    """``toyllm`` registered for the test, and forgotten after it."""
    register_engine(TOY)
    try:
        yield TOY
    finally:
        unregister_engine("toyllm")


# --------------------------------------------------------------------------- its stand-in server


class _ToyServer(http.server.BaseHTTPRequestHandler):
    trace_dir: ClassVar[Path]
    gpus: ClassVar[int]
    prefix: ClassVar[str | None]
    profiling: ClassVar[bool]
    calls: ClassVar[list[str]]

    def _send(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._send(200 if self.path == "/profiler" else 404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        cls.calls.append(self.path)
        if self.path == "/profile/start":
            if cls.profiling:
                self._send(409)
                return
            cls.profiling, cls.prefix = True, json.loads(body or b"{}").get("prefix")
            self._send(200)
        elif self.path == "/profile/stop":
            if not cls.profiling:
                self._send(400)
                return
            cls.trace_dir.mkdir(parents=True, exist_ok=True)
            lead = f"{cls.prefix}." if cls.prefix else ""
            names = [f"toy-gpu{g}" for g in range(cls.gpus)] + [f"toy-api-pid{os.getpid()}"]
            for name in names:  # written before the answer: the stop waits for the flush
                trace = {"traceEvents": [{"name": name, "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}
                (cls.trace_dir / f"{lead}{name}.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
            cls.profiling = False
            self._send(200)
        else:
            self._send(404)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_toyllm(launch: list[str], gpus: int = 2) -> Iterator[str]:
    """A toyllm server launched with ``launch`` (its launch arguments: ``--trace-dir DIR``); its URL."""
    assert launch[0] == "--trace-dir", launch

    class Server(_ToyServer):
        trace_dir = Path(launch[1])
        prefix = None
        profiling = False
        calls: ClassVar[list[str]] = []

    Server.gpus = gpus
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = cli.main(["rollout", *args] if args[0] == "launch-args" else ["rollout", *args, "--quiet"])
    out, _ = capsys.readouterr()
    return status, out


# --------------------------------------------------------------------------- registration


def test_registration_makes_it_an_engine_like_the_built_ins(toyllm: EngineProfile) -> None:
    assert [p.name for p in engine_profiles()] == ["vllm", "sglang", "toyllm"]
    assert engine_profile("toyllm") is toyllm
    assert register_engine(TOY) is TOY  # the same profile again: nothing to do
    assert engine_of("/x/step3.toy-gpu1.trace.json.gz") is toyllm
    assert engine_of("step3_rank1.1764409212123.pt.trace.json.gz") is engine_profile("vllm")
    assert engine_of("step3-1712.5-TP-1.trace.json.gz") is engine_profile("sglang")
    assert engine_of("notes.txt") is None
    assert isinstance(ToyDriver("http://127.0.0.1:1"), ServerDriver)
    assert isinstance(ToyDriver("http://127.0.0.1:1"), EngineDriver)


def test_instrument_ranks_reads_its_names(toyllm: EngineProfile) -> None:
    assert ranks.engine_trace_local_rank("step3.toy-gpu1.trace.json.gz") == 1
    assert ranks.engine_trace_local_rank("toy-dp1-gpu0.trace.json.gz") is None  # counted within DP rank 1
    assert ranks.engine_trace_local_rank("toy-dp1-gpu0.trace.json.gz", ranks_per_dp_rank=2) == 2
    assert ranks.engine_trace_local_rank("step3.toy-api-pid42.trace.json.gz") is None  # its API server
    parsed = ranks.parse_engine_trace_name("step3.toy-api-pid42.trace.json.gz")
    assert parsed is not None and (parsed.engine, parsed.frontend, parsed.pid, parsed.step) == ("toyllm", True, 42, 3)
    unregister_engine("toyllm")
    assert ranks.engine_trace_local_rank("step3.toy-gpu1.trace.json.gz") is None  # forgotten with its profile
    assert engine_of("step3.toy-gpu1.trace.json.gz") is None


def test_another_profile_under_a_taken_name_is_refused(toyllm: EngineProfile) -> None:
    other = EngineProfile(
        name="toyllm", label="Other", traces=TOY_TRACES, launch_args=toy_launch_args, http_driver=toy_http_driver
    )
    with pytest.raises(ValueError, match="an engine named 'toyllm' is registered already"):
        register_engine(other)
    vllm_names = TraceNames(engine="vllm", workers=(r"gpu(?P<rank>\d+)",))
    with pytest.raises(ValueError, match="'vllm' is registered already"):
        register_engine(EngineProfile(name="vllm", label="x", traces=vllm_names, launch_args=toy_launch_args,
                                      http_driver=toy_http_driver))  # fmt: skip
    assert engine_profile("vllm").label == "vLLM"


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"name": "other"}, ValueError, "'name' must be the engine of its 'traces' \\('toyllm'\\)"),
        ({"launch_args": "no"}, TypeError, "'launch_args' must be callable"),
        ({"label": " "}, ValueError, "'label' must not be empty"),
        ({"start_sends_config": 1}, TypeError, "'start_sends_config' must be a bool"),
        ({"traces": "toy"}, TypeError, "'traces' must be a TraceNames"),
    ],
)
def test_a_bad_profile_names_its_field(change: dict[str, Any], error: type[Exception], message: str) -> None:
    fields: dict[str, Any] = {"name": "toyllm", "label": "ToyLLM", "traces": TOY_TRACES}
    fields.update(launch_args=toy_launch_args, http_driver=toy_http_driver)
    with pytest.raises(error, match=message):
        EngineProfile(**{**fields, **change})


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"engine": "Toy LLM"}, ValueError, "'engine' must be 1-32 of"),
        ({"workers": r"gpu(?P<rank>\d+)"}, TypeError, "'workers' must be a tuple of regular expressions"),
        ({"workers": ()}, ValueError, "'workers' must hold at least one pattern"),
        ({"workers": ("gpu(",)}, ValueError, "'workers' pattern 0 is not a regular expression"),
        ({"workers": (r"tp(?P<tp>\d+)",)}, ValueError, r"'workers' pattern 0 has groups \['tp'\]"),
        ({"workers": (r"dp(?P<dp>\d+)",)}, ValueError, "a 'dp' group without a 'rank' group"),
        ({"frontend": r"api(?P<rank>\d+)"}, ValueError, r"'frontend' pattern 0 has groups \['rank'\]"),
        ({"prefix_joint": "x"}, ValueError, "'prefix_joint' must be one character that is not a letter or digit"),
    ],
)
def test_a_bad_grammar_names_its_field(change: dict[str, Any], error: type[Exception], message: str) -> None:
    fields: dict[str, Any] = {"engine": "toyllm", "workers": (r"gpu(?P<rank>\d+)",)}
    with pytest.raises(error, match=message):
        TraceNames(**{**fields, **change})


# --------------------------------------------------------------------------- end to end, through the CLI


def test_launch_start_stop_and_relocate_through_the_command_line(
    toyllm: EngineProfile, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two replicas of TP 2 (global ranks 0-3), ranks 1 and 2 profiled: each keeps one GPU's trace."""
    base, save, state = tmp_path / "prof", tmp_path / "save", ("--state-dir", str(tmp_path / "state"))
    status, out = _run(capsys, "launch-args", "--engine", "toyllm", "--profiler-dir", str(base), "--json")
    assert status == 0 and json.loads(out)["args"] == ["--trace-dir", str(base / "replica0")]
    status, out = _run(capsys, "launch-args", "--engine", "toyllm", "--profiler-dir", str(base), "--toyllm-version",
                       "1.4", "--json")  # fmt: skip
    assert json.loads(out)["env"] == {"TOYLLM_TRACE_DIR": str(base / "replica0")}
    assert json.loads(out)["toyllm_version"] == "1.4"
    launches = []
    for replica in (0, 1):
        status, out = _run(capsys, "launch-args", "--engine", "toyllm", "--profiler-dir", str(base), "--replica",
                           str(replica), "--toyllm-version", "2.0", "--json")  # fmt: skip
        launches.append(json.loads(out)["args"])
    with serve_toyllm(launches[0]) as first, serve_toyllm(launches[1]) as second:
        where = ["--engine", "toyllm", "--worker-url", first, "--worker-url", second, *state]
        status, out = _run(capsys, "status", *where)
        assert status == 0 and out.count("profiling routes present") == 2
        status, out = _run(capsys, "start", *where, "--step", "3")
        assert status == 0, out
        status, out = _run(capsys, "stop", *where, "--step", "3", "--save-path", str(save), "--profiler-dir",
                           str(base), "--gpus-per-replica", "2", "ranks=[1,2]", "--json")  # fmt: skip
    assert status == 0, out
    result = json.loads(out)
    assert [w["state"] for w in result["workers"]] == ["flushed", "flushed"]
    moved = sorted(name for replica in result["relocation"]["replicas"] for name in replica["moved"])
    pid = os.getpid()
    assert moved == sorted(
        [
            "rollout_engine_step3_rank1-of-4_replica0_step3.toy-gpu1.trace.json.gz",
            "rollout_engine_step3_rank2-of-4_replica1_step3.toy-gpu0.trace.json.gz",
            f"rollout_frontend_step3_replica0_step3.toy-api-pid{pid}.trace.json.gz",
            f"rollout_frontend_step3_replica1_step3.toy-api-pid{pid}.trace.json.gz",
        ]
    )
    assert sorted((r.path, r.tool, r.stage, r.rank) for r in read_manifests(save)) == sorted(
        [
            (moved[0], "toyllm", "engine", 1),
            (moved[1], "toyllm", "engine", 2),
            (moved[2], "toyllm", "frontend", -1),
            (moved[3], "toyllm", "frontend", -1),
        ]
    )
    assert sorted(p.name for p in (base / "replica0").iterdir()) == ["step3.toy-gpu0.trace.json.gz"]  # TP peers stay
    assert sorted(p.name for p in (base / "replica1").iterdir()) == ["step3.toy-gpu1.trace.json.gz"]


def test_a_stop_it_refuses_is_not_profiling_and_a_second_start_restarts(
    toyllm: EngineProfile, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    launch = ["--trace-dir", str(tmp_path / "prof" / "replica0")]
    with serve_toyllm(launch) as url:
        where = ["--engine", "toyllm", "--worker-url", url, "--state-dir", str(tmp_path / "state")]
        status, out = _run(capsys, "stop", *where)
        assert status == 0 and "not profiling: nothing flushed (toyllm answered 400)" in out
        assert _run(capsys, "start", *where, "--step", "1")[0] == 0
        status, out = _run(capsys, "start", *where, "--step", "2")
        assert status == 0 and "restarted; earlier traces flushed as step1.*" in out  # its own prefix joint
        assert cli.main(["rollout", "start", *where, "--step", "3", "all_ranks=true", "--quiet"]) == 2
    err = capsys.readouterr().err  # its start carries no configuration: refused before any call
    assert "start takes --config and KEY=VALUE only with --engine sglang: ToyLLM reads its profiler" in err


def test_a_stop_with_another_engine_than_its_start_is_refused(
    toyllm: EngineProfile, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with serve_toyllm(["--trace-dir", str(tmp_path / "prof" / "replica0")]) as url:
        where = ["--worker-url", url, "--state-dir", str(tmp_path / "state")]
        assert _run(capsys, "start", "--engine", "toyllm", *where)[0] == 0
        assert cli.main(["rollout", "stop", "--engine", "vllm", *where, "--quiet"]) == 2
    assert "was started here with --engine toyllm" in capsys.readouterr().err


# --------------------------------------------------------------------------- end to end, in process


def test_a_rollout_profiler_drives_it_and_relocates_by_global_rank(toyllm: EngineProfile, tmp_path: Path) -> None:
    """Global rank 2 drives replica 1 (TP 2) on step 2; rank 3 is profiled, so its GPU's trace moves."""
    save, base = tmp_path / "save", tmp_path / "prof"
    cfg = ins.ProfilerConfig(save_path=str(save), steps=(2,), ranks=(3,))
    launch = toyllm.launch_args(cfg, profiler_dir=str(base / "replica1"), version=None)
    with serve_toyllm(list(launch.args)) as url:
        rollout = RolloutProfiler(
            cfg, ToyDriver(url), rank=2, world_size=4, gpus_per_replica=2, profiler_base=base, manifest=Manifest(save)
        )
        assert rollout.start(1) is False  # not a profiled step
        assert rollout.start(2) is True
        records = rollout.stop(2)
    assert rollout.failures == 0
    assert sorted((r.rank, r.stage, r.tool) for r in records) == [(-1, "frontend", "toyllm"), (3, "engine", "toyllm")]
    engine = next(r for r in records if r.stage == "engine")
    assert engine.path == "rollout_engine_step2_rank3-of-4_replica1_step2.toy-gpu1.trace.json.gz"
    assert sorted(r.path for r in read_manifests(save)) == sorted(r.path for r in records)
    assert [p.name for p in (base / "replica1").iterdir()] == ["step2.toy-gpu0.trace.json.gz"]  # rank 2: not profiled
