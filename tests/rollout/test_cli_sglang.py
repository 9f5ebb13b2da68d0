"""``instrument rollout --engine sglang``: launch environment, start / status / stop, honest states, relocation.

A real SGLang server cannot run on this CPU machine (the sglang 0.5.23 wheel needs ``sgl_kernel``,
whose CPU build is not on the registry; docs/sglang.md), so the engines here are the stand-in of
tests/sglang_support/server.py: a real HTTP server answering as SGLang's source does (bare 500
refusals, ``/server_info``, files ``{prefix}-{id}-TP-{t}.trace.json.gz`` written per TP rank at the
stop into the launch's ``SGLANG_TORCH_PROFILER_DIR``), behind a stand-in sgl-router ``/workers``.
Everything else is real: the CLI, its markers, relocation of real files.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from instrument import cli
from instrument.manifest import read_manifests
from instrument.rollout._fanout import list_router_workers
from instrument.rollout._markers import MarkerStore
from tests.sglang_support.server import SGLangStandIn, serve_gateway, serve_sglang

SGLANG = ("--engine", "sglang")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(["rollout", *args, "--quiet"] if args[0] != "launch-args" else ["rollout", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def sglang(tmp_path: Path) -> Iterator[type[SGLangStandIn]]:
    """One stand-in SGLang 0.5.23 server, TP 2, launched for replica 0 of ``tmp_path / "prof"``."""
    with serve_sglang(tmp_path / "prof" / "replica0") as server:
        yield server


def _starts(server: type[SGLangStandIn]) -> list[object]:
    return [body for _, path, _, body in server.requests if path == "/start_profile"]


# --------------------------------------------------------------------------- launch-args


def test_launch_args_print_sglang_s_environment_for_the_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = _run(capsys, "launch-args", *SGLANG, "--profiler-dir", str(tmp_path), "--replica", "1",
                            "--sglang-version", "0.5.23", "contents=[cpu,shapes]")  # fmt: skip
    assert status == 0
    assert out.split() == [
        f"SGLANG_TORCH_PROFILER_DIR={tmp_path / 'replica1'}",
        "SGLANG_PROFILE_WITH_STACK=false",
        "SGLANG_PROFILE_RECORD_SHAPES=true",
    ]
    assert "SGLang 0.5.23 (given); put them before the command" in err
    status, out, _ = _run(capsys, "launch-args", *SGLANG, "--profiler-dir", str(tmp_path), "--sglang-version",
                          "0.4.7", "--json")  # fmt: skip
    launch = json.loads(out)
    assert launch["engine"] == "sglang" and launch["sglang_version"] == "0.4.7" and launch["args"] == []
    assert launch["env"] == {
        "SGLANG_TORCH_PROFILER_DIR": str(tmp_path / "replica0"),
        "SGLANG_PROFILE_WITH_STACK": "false",
    }
    assert launch["dropped"] == ["SGLANG_PROFILE_RECORD_SHAPES"]  # read from 0.5.5 on


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sglang-version", "latest"], "'sglang_version' must look like '0.5.23'"),
        (["--vllm-version", "0.32.0"], "--vllm-version is for --engine vllm (this is --engine sglang)"),
    ],
)
def test_launch_args_bad_input_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    status, out, err = _run(capsys, "launch-args", *SGLANG, "--profiler-dir", str(tmp_path), *args)
    assert status == 2 and out == "" and message in err


# --------------------------------------------------------------------------- end to end behind sgl-router


def test_start_status_stop_relocate_behind_the_gateway(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two replicas of TP 2 (world 4), ranks 0 and 3 profiled: each replica's other TP rank stays put,
    and so does an earlier step's trace."""
    base, save, state = tmp_path / "prof", tmp_path / "save", ["--state-dir", str(tmp_path / "state")]
    earlier = base / "replica0" / "step1-1700000000.5-TP-0.trace.json.gz"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"step 1's trace")
    os.utime(earlier, (1_700_000_000, 1_700_000_000))
    config = tmp_path / "profile.yaml"
    config.write_text("contents: [cpu, cuda]\nranks: [0, 3]\n")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(serve_sglang(base / f"replica{r}")) for r in range(2)]
        router = stack.enter_context(serve_gateway([(s.url, True) for s in servers]))
        where = [*SGLANG, "--router-url", router, *state]

        status, out, _ = _run(capsys, "start", *where, "--step", "2", "--config", str(config))
        assert status == 0, out
        assert [line.split()[-1] for line in out.splitlines()[1:3]] == ["profiling", "profiling"]
        for server in servers:
            assert _starts(server) == [
                {"activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False, "profile_prefix": "step2"}
            ]  # no output_dir: each server writes into its launch's directory
        marker = MarkerStore(tmp_path / "state").read(servers[1].url)
        assert marker is not None and (marker.engine, marker.prefix, marker.stops_by_itself) == (
            "sglang",
            "step2",
            False,
        )

        status, out, _ = _run(capsys, "status", *where)
        assert status == 0 and out.count("profiling routes present; started here at") == 2

        status, out, _ = _run(capsys, "stop", *where, "--step", "2", "--save-path", str(save), "--profiler-dir",
                              str(base), "--gpus-per-replica", "2", "--config", str(config), "--json")  # fmt: skip
    assert status == 0
    result = json.loads(out)
    assert [(w["state"], w["ok"]) for w in result["workers"]] == [("flushed", True)] * 2
    moved = sorted(name for replica in result["relocation"]["replicas"] for name in replica["moved"])
    assert len(moved) == 2
    assert moved[0].startswith("rollout_engine_step2_rank0-of-4_replica0_step2-") and moved[0].endswith(
        "-TP-0.trace.json.gz"
    )
    assert moved[1].startswith("rollout_engine_step2_rank3-of-4_replica1_step2-") and moved[1].endswith(
        "-TP-1.trace.json.gz"
    )
    for name in moved:
        assert json.loads(gzip.decompress((save / name).read_bytes()))["traceEvents"][0]["name"] == "run_batch"
    assert sorted((line.path, line.tool, line.rank) for line in read_manifests(save)) == [
        (moved[0], "sglang", 0),
        (moved[1], "sglang", 3),
    ]
    left0 = sorted(p.name for p in (base / "replica0").iterdir())
    left1 = sorted(p.name for p in (base / "replica1").iterdir())
    assert earlier.name in left0 and earlier.read_bytes() == b"step 1's trace"  # another step's: never relabelled
    [peer0] = [n for n in left0 if n != earlier.name]
    assert peer0.endswith("-TP-1.trace.json.gz")  # rank 1: a TP peer
    assert len(left1) == 1 and left1[0].endswith("-TP-0.trace.json.gz")  # rank 2: a TP peer
    assert (
        "left in place: 2 of ranks not profiled (TP peers), 1 of another step or an earlier start"
        in (result["relocation"]["notes"])
    )
    assert MarkerStore(tmp_path / "state").read(servers[0].url) is None  # the start is over


def test_the_gateway_s_dp_aware_entries_are_one_server_each() -> None:
    with serve_gateway([("http://10.0.0.5:30000@0", False), ("http://10.0.0.5:30000@1", True),
                        ("http://10.0.0.6:30000@0", False)]) as router:  # fmt: skip
        assert list_router_workers(router, timeout_s=10) == [
            ("http://10.0.0.5:30000", True),
            ("http://10.0.0.6:30000", False),
        ]


# --------------------------------------------------------------------------- honest states


def test_stop_without_start_restart_and_a_start_made_elsewhere(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    where = [*SGLANG, "--worker-url", sglang.url, "--state-dir", str(tmp_path / "state")]
    status, out, _ = _run(capsys, "stop", *where)
    assert status == 0 and "ok" in out and "not profiling: nothing flushed (SGLang refused the stop" in out

    assert _run(capsys, "start", *where, "--step", "2")[0] == 0
    status, out, _ = _run(capsys, "start", *where, "--step", "3", "--json")
    [row] = json.loads(out)["workers"]
    assert row["state"] == "restarted" and row["ok"] is True
    assert "was profiling since" in row["detail"] and "earlier traces flushed as step2-*" in row["detail"]
    flushed = sorted(p.name for p in (tmp_path / "prof" / "replica0").iterdir())
    assert len(flushed) == 2 and all(name.startswith("step2-") for name in flushed)  # the first session, both TP
    assert [p for _, p, _, _ in sglang.requests if p != "/server_info"] == [
        "/stop_profile", "/start_profile", "/stop_profile", "/start_profile",
    ]  # fmt: skip  # the second start is sent only once the first session is flushed
    assert _run(capsys, "stop", *where)[0] == 0

    sglang.state["profiling"] = True  # started by someone else (a trainer, curl)
    sglang.state["body"] = {}
    status, out, _ = _run(capsys, "start", *where, "--step", "4")
    assert status == 1 and "start_profile answered 500: most likely already profiling" in out
    status, out, _ = _run(capsys, "stop", *where)
    assert status == 0 and "was profiling (not started from here): stopped, traces flushed" in out


def test_a_start_with_num_steps_may_stop_by_itself(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    where = [*SGLANG, "--worker-url", sglang.url, "--state-dir", str(state)]
    assert _run(capsys, "start", *where, "--step", "1", "token_window=[0,3]")[0] == 0
    assert _starts(sglang)[0]["num_steps"] == 4  # type: ignore[index]
    assert MarkerStore(state).read(sglang.url).stops_by_itself is True  # type: ignore[union-attr]
    sglang.state["profiling"] = False  # SGLang stopped after 4 forward passes
    status, out, _ = _run(capsys, "stop", *where)
    assert status == 0 and "stopped, traces flushed" in out
    assert MarkerStore(state).read(sglang.url) is None


def test_a_stop_past_its_timeout_is_still_flushing_and_relocation_waits(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    where = [*SGLANG, "--worker-url", sglang.url, "--state-dir", str(tmp_path / "state")]
    assert _run(capsys, "start", *where, "--step", "1")[0] == 0
    sglang.overrides["/stop_profile"] = 0  # the flush outlasts the stop's deadline; /health still answers
    status, out, _ = _run(capsys, "stop", *where, "--stop-timeout", "0.5", "--step", "1", "--save-path",
                          str(tmp_path / "save"), "--profiler-dir", str(tmp_path / "prof"))  # fmt: skip
    assert status == 1 and "still flushing after 0.5 s (the server answers /health)" in out
    assert "relocation skipped: 1 worker(s) still flushing" in out and not (tmp_path / "save").exists()
    assert MarkerStore(tmp_path / "state").read(sglang.url) is not None
    sglang.release.set()


def test_a_server_that_is_not_sglang_is_a_failed_row(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    sglang.overrides.update({"/server_info": 404, "/get_server_info": 404})  # a vLLM server, say
    for action in ("status", "stop"):
        status, out, _ = _run(capsys, action, *SGLANG, "--worker-url", sglang.url, "--state-dir", str(tmp_path))
        assert status == 1 and "FAILED" in out and "neither /server_info nor /get_server_info" in out
    assert all(path != "/stop_profile" for _, path, _, _ in sglang.requests)


def test_a_stop_that_fails_otherwise_is_a_failed_row_not_not_profiling(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    """Only SGLang's bare 500 means "not profiling"; any other answer is a failure, and the marker stays."""
    where = [*SGLANG, "--worker-url", sglang.url, "--state-dir", str(tmp_path / "state")]
    assert _run(capsys, "start", *where, "--step", "1")[0] == 0
    sglang.overrides["/stop_profile"] = 502  # a proxy in front of the engine, say
    status, out, _ = _run(capsys, "stop", *where)
    assert status == 1 and "FAILED" in out and "stop_profile answered 502" in out and "not profiling" not in out
    assert MarkerStore(tmp_path / "state").read(sglang.url) is not None


# --------------------------------------------------------------------------- bad input, before any call


@pytest.mark.parametrize(
    ("engine", "args", "message"),
    [
        (SGLANG, ["contents=[stack]"], "'contents' must hold cpu, cuda or memory"),
        (SGLANG, ["--prefix", "a/b"], "'prefix' must be 1-64 of"),
        ((), ["all_ranks=true"], "start takes --config and KEY=VALUE only with --engine sglang"),
    ],
)
def test_a_bad_start_exits_2_before_any_call(
    capsys: pytest.CaptureFixture[str],
    sglang: type[SGLangStandIn],
    tmp_path: Path,
    engine: tuple[str, ...],
    args: list[str],
    message: str,
) -> None:
    status, out, err = _run(capsys, "start", *engine, "--worker-url", sglang.url, "--state-dir", str(tmp_path), *args)
    assert status == 2 and out == "" and message in err, err
    assert sglang.requests == []


def test_a_stop_with_the_other_engine_exits_2(
    capsys: pytest.CaptureFixture[str], sglang: type[SGLangStandIn], tmp_path: Path
) -> None:
    state = ["--state-dir", str(tmp_path)]
    assert _run(capsys, "start", *SGLANG, "--worker-url", sglang.url, "--step", "1", *state)[0] == 0
    calls = len(sglang.requests)
    status, out, err = _run(capsys, "stop", "--worker-url", sglang.url, *state)
    assert status == 2 and out == "" and "was started here with --engine sglang" in err
    assert len(sglang.requests) == calls
