"""GPU time per rank (``instrument.analyze.traces._gpu``), its kernels, idle split and launch delays
(``._kernels``), checked against HolisticTraceAnalysis on real traces, and shown in the table, the page and
the picture (none of it for CPU-only traces)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from instrument import cli
from instrument.analyze import analyze, render_text, write_html, write_png
from instrument.analyze.render import _html
from instrument.analyze.render import _png as picture
from instrument.analyze.render import _tables as tables
from instrument.analyze.traces import _reader as reader
from instrument.analyze.traces._gpu import GpuAccumulator, GpuRow, is_profiler_step
from tests.analyze.test_analyze import known_run

DATA = Path(__file__).parents[2] / "data" / "hta"
FIELDS = (
    "span_us",
    "busy_us",
    "idle_us",
    "compute_us",
    "non_compute_us",
    "communication_us",
    "memory_us",
    "comm_comp_overlap_pct",
)

# HolisticTraceAnalysis 0.5.0 (pip wheel, in a throwaway venv), run once on these files:
#   TraceAnalysis(trace_dir=D, include_last_profiler_step=True): get_temporal_breakdown() gives
#   span (kernel_time), idle, compute, non_compute; get_comm_comp_overlap() the overlap %.
#   Per step: the same two analyzers on each rank's frame cut to `iteration == N`.
#   communication / memory: HTA's merge_kernel_intervals over its get_kernel_type classes.
# Row: rank, step, span, idle, compute, non_compute, communication, memory, overlap %.
HTA: dict[str, list[tuple[int, int | None, float, float, float, float, float, float, float]]] = {
    "trace_filter": [
        (0, None, 1222847, 675191, 210320, 337336, 396199, 1325, 14.95),
        (0, 551, 600058, 321378, 106252, 172428, 195327, 662, 11.81),
        (0, 552, 615601, 346625, 104068, 164908, 200872, 663, 18.00),
        (1, None, 1231186, 651136, 271973, 308077, 379053, 16504, 19.93),
        (1, 551, 600674, 328671, 135548, 136455, 168027, 2667, 20.05),
        (1, 552, 623286, 315239, 136425, 171622, 211026, 13837, 19.83),
    ],
    "negative_queue": [
        (0, None, 1229072, 848216, 179676, 201180, 163138, 45030, 1.47),
        (0, 550, 368256, 292875, 35713, 39668, 31675, 9219, 1.46),
        (0, 551, 375129, 295659, 35891, 43579, 36190, 8876, 1.41),
        (0, 552, 375254, 300306, 36292, 38656, 30858, 9232, 1.41),
        (0, 553, 375134, 294174, 35940, 45020, 37767, 8742, 1.23),
        (0, 554, 372277, 302101, 35840, 34336, 26648, 9040, 2.00),
    ],
}


def _assert_agrees(rows: list[dict[str, Any]], expected: list[tuple[Any, ...]]) -> None:
    assert [(r["rank"], r["step"]) for r in rows] == [(e[0], e[1]) for e in expected]
    for row, (_, _, span, idle, compute, non_compute, comm, memory, overlap) in zip(rows, expected, strict=True):
        want = {
            "span_us": span,
            "busy_us": span - idle,
            "idle_us": idle,
            "compute_us": compute,
            "non_compute_us": non_compute,
            "communication_us": comm,
            "memory_us": memory,
        }
        for key, value in want.items():
            assert abs(row[key] - value) <= 0.01 * span, (row, key, value)
        # 1% of the span, said of the overlapping time
        assert abs(row["comm_comp_overlap_pct"] - overlap) / 100 * comm <= 0.01 * span, row


@pytest.mark.parametrize("name", sorted(HTA))
def test_gpu_breakdown_agrees_with_hta_on_real_traces(name: str) -> None:
    report = analyze(DATA / name, jobs=1)
    assert report.ok
    _assert_agrees(list(report.gpu), HTA[name])


def test_streamed_files_give_the_same_rows_as_files_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = analyze(DATA / "trace_filter", jobs=1).gpu
    monkeypatch.setattr(reader, "SMALL_FILE_BYTES", 0)  # every file through the ijson stream
    assert analyze(DATA / "trace_filter", jobs=1).gpu == whole


def test_json_has_a_gpu_list_with_the_contract_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a copy: the CLI writes its picture into the directory it reads
    shutil.copytree(DATA / "trace_filter", tmp_path / "traces")
    code = cli.main(["analyze", str(tmp_path / "traces"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert "stages" in out  # existing keys stay
    assert {(r["rank"], r["step"]) for r in out["gpu"]} >= {(0, None), (1, None)}
    for row in out["gpu"]:
        assert set(row) == {"rank", "step", *FIELDS}


def _write(path: Path, events: list[dict[str, Any]], rank: int = 0) -> None:
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}))


def _x(name: str, cat: str, ts: float, dur: float, corr: Any = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if corr is not None:
        ev["args"] = {"correlation": corr}
    return ev


def test_a_cpu_only_trace_gives_no_gpu_rows(tmp_path: Path) -> None:
    _write(tmp_path / "rank-0.json", [_x("aten::mm", "cpu_op", 10, 5), _x("ProfilerStep#1", "user_annotation", 0, 50)])
    report = analyze(tmp_path, jobs=1)
    assert report.ok
    assert report.gpu == ()
    assert report.stages  # the CPU analysis is unchanged


def _feed(events: list[dict[str, Any]]) -> list[GpuRow]:
    acc = GpuAccumulator()
    for ev in events:
        ts, end = ev["ts"], ev["ts"] + ev["dur"]
        step = is_profiler_step(ev["name"]) if isinstance(ev["name"], str) else None
        if step is not None:
            acc.add_step(step, ts, end)
        acc.add(ev, ev["cat"], ts, end)
    return acc.rows()


def test_kinds_unions_and_overlap_follow_hta_definitions() -> None:
    rows = _feed(
        [
            _x("ampere_sgemm", "kernel", 0, 10),
            _x("ampere_sgemm", "kernel", 5, 10),  # overlaps the first: compute is 0..15
            _x("ncclDevKernel_AllReduce", "kernel", 10, 10),  # comm 10..20, 5 of it under compute
            _x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 30, 4),
            _x("Memset (Device)", "gpu_memset", 40, 2),
            _x("cudaStreamSync_kernel", "kernel", 50, 10),  # HTA's "other": busy, not compute
        ]
    )
    assert [r.step for r in rows] == [None]
    got = rows[0].times.to_dict()
    assert got == {
        "span_us": 60.0,
        "busy_us": 36.0,
        "idle_us": 24.0,
        "compute_us": 15.0,
        "non_compute_us": 21.0,
        "communication_us": 10.0,
        "memory_us": 6.0,
        "comm_comp_overlap_pct": 50.0,
    }


def test_steps_take_gpu_events_by_their_launch_time_not_their_own() -> None:
    rows = _feed(
        [
            _x("ProfilerStep#3", "user_annotation", 0, 100),
            _x("ProfilerStep#4", "user_annotation", 100, 100),
            _x("cudaLaunchKernel", "cuda_runtime", 90, 2, corr=7),
            _x("k", "kernel", 150, 10, corr=7),  # runs in step 4's time, launched in step 3
            _x("cudaLaunchKernel", "cuda_runtime", 100, 2, corr=8),  # a step's start is inside it
            _x("k", "kernel", 170, 10, corr=8),
            _x("k", "kernel", 175, 10, corr=9),  # no launch seen: in no step, and HTA drops it
            _x("k", "kernel", 190, 10),  # no correlation at all
        ]
    )
    by_step = {r.step: r.times.to_dict() for r in rows}
    assert by_step[3]["busy_us"] == 10.0
    assert by_step[4]["busy_us"] == 10.0
    assert by_step[None]["span_us"] == 30.0  # two steps: only what was launched by the last one's end


@pytest.mark.parametrize(
    "event",
    [
        {"ph": "X", "name": None, "cat": "kernel", "ts": 0, "dur": 5, "args": "x"},
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 0, "dur": 5, "args": {"correlation": True}},
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 0, "dur": 5, "args": {"correlation": "7"}},
        {"ph": "X", "name": 3, "cat": "cuda_runtime", "ts": 0, "dur": 5, "args": {"correlation": [1]}},
    ],
)
def test_odd_event_fields_are_taken_without_error(tmp_path: Path, event: dict[str, Any]) -> None:
    _write(tmp_path / "rank-0.json", [event, _x("k2", "kernel", 10, 5)])
    report = analyze(tmp_path, jobs=1)
    assert report.ok
    assert [r["step"] for r in report.gpu] == [None]


def test_a_negative_duration_is_left_out_of_the_unions() -> None:
    rows = _feed([_x("k", "kernel", 0, 10), _x("k", "kernel", 50, -20)])
    assert rows[0].times.to_dict()["span_us"] == 10.0


def test_files_of_one_rank_add_up(tmp_path: Path) -> None:
    # the SDK writes one file per stage: two stages of rank 1
    _write(tmp_path / "actor_gen_step7_rank1-of-2_h_pid1_1.pt.trace.json", [_x("k", "kernel", 0, 10)], rank=1)
    _write(tmp_path / "actor_train_step7_rank1-of-2_h_pid1_2.pt.trace.json", [_x("k", "kernel", 100, 10)], rank=1)
    report = analyze(tmp_path, jobs=1)
    assert report.ok
    (row,) = report.gpu
    assert (row["rank"], row["span_us"], row["busy_us"], row["idle_us"]) == (1, 110.0, 20.0, 90.0)


# --------------------------------------------------------------------------- shown beside the stage rows


@pytest.fixture(scope="module")
def shown() -> Any:
    return analyze(DATA / "trace_filter", jobs=1)


def test_the_table_shows_gpu_time_per_rank_whole_trace_then_each_step(shown: Any) -> None:
    rows = tables.gpu_rows(shown)
    assert [(r[0], r[1]) for r in rows] == [(rank, step) for step in ("all", "551", "552") for rank in ("0", "1")]
    # rank 0, whole trace: HTA's figures above (span 1,222.8 ms, compute 210.3 ms = 17.2 %, ...)
    assert rows[0] == ("0", "all", "1,222.8", "210.3 (17.2%)", "396.2 (32.4%)", "1.32 (0.1%)", "675.2 (55.2%)", "14.9%")
    text = render_text(shown, width=200)
    assert "GPU time per rank" in text and "HTA's definitions" in text
    for row in rows:
        assert re.search(r"[\s│]+".join(re.escape(c) for c in row), text), row


def test_the_page_has_a_gpu_section_with_the_same_numbers(shown: Any, tmp_path: Path) -> None:
    page = write_html(shown, tmp_path / "gpu.html").read_text(encoding="utf-8")
    assert "<h2>GPU time per rank</h2>" in page
    for row in tables.gpu_rows(shown):
        assert "".join(_html._td(c, h) for c, h in zip(row, tables.GPU_HEADERS, strict=True)) in page


def test_the_picture_stacks_each_ranks_gpu_span(shown: Any) -> None:
    fig = picture._figure(shown)
    gpu_ax = next(ax for ax in fig.axes if ax.get_title().startswith("(c) GPU time per rank"))
    whole = [g for g in shown.gpu if g["step"] is None]
    assert len(gpu_ax.patches) == 4 * len(whole)  # compute, exposed communication, memory and other, idle
    for i, g in enumerate(whole):
        bars = [p for p in gpu_ax.patches if round(p.get_x() + p.get_width() / 2) == i]
        assert sum(p.get_height() for p in bars) == pytest.approx(g["span_us"] / 1000, rel=1e-6)
        assert bars[0].get_height() == pytest.approx(g["compute_us"] / 1000)
        assert bars[3].get_height() == pytest.approx(g["idle_us"] / 1000)
    assert [t.get_text() for t in gpu_ax.texts] == ["overlap 15%", "overlap 20%"]
    assert picture.png_bytes(shown)[:4] == b"\x89PNG"


def test_one_rank_with_steps_gets_gpu_rows_and_a_bar(tmp_path: Path) -> None:
    report = analyze(DATA / "negative_queue", jobs=1)
    rows = tables.gpu_rows(report)
    assert [r[1] for r in rows] == ["all", "550", "551", "552", "553", "554"]
    fig = picture._figure(report)
    titles = [ax.get_title()[:3] for ax in fig.axes if "step timeline" not in ax.get_title()]  # (f): its traces'
    assert "one rank" in fig.axes[0].get_title() and titles[-3:] == ["(c)", "(d)", "(e)"]  # the GPU panels last
    assert write_png(report, tmp_path / "one.png").stat().st_size > 10_000


def test_without_rich_the_plain_table_has_the_gpu_rows_too(shown: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)  # import rich.console raises ImportError
    text = render_text(shown)
    assert "┃" not in text  # the plain fallback
    assert "GPU time per rank" in text
    for row in tables.gpu_rows(shown):
        assert re.search(r"[\s│]+".join(re.escape(c) for c in row), text), row


def test_cpu_only_sdk_traces_show_no_gpu_section(tmp_path: Path) -> None:
    report = analyze(known_run(tmp_path / "sdk"), jobs=1)
    assert report.ok and report.gpu == () and tables.gpu_rows(report) == []
    assert "GPU" not in render_text(report)
    assert "GPU time per rank" not in write_html(report, tmp_path / "a.html").read_text(encoding="utf-8")
    assert not any(ax.get_title().startswith("(c)") for ax in picture._figure(report).axes)


# --------------------------------------------------------------------------- kernels, idle split, launch delay

# HolisticTraceAnalysis 0.5.0's kernel breakdown, idle breakdown and launch stats on the same traces, derived
# once in a throwaway venv (how: the file's "about"); HTA is no test dependency.
HTA_KERNELS = json.loads((DATA / "hta-0.5.0-kernels.json").read_text(encoding="utf-8"))["traces"]


def _close(ours: float, theirs: float, scale: float) -> bool:
    return abs(ours - theirs) <= 0.01 * scale


@pytest.mark.parametrize("name", sorted(HTA_KERNELS))
def test_kernels_idle_split_and_launch_delay_agree_with_hta(name: str) -> None:
    report = analyze(DATA / name, jobs=1)
    kernels = {row["rank"]: row for row in report.gpu_kernels}
    idle = {row["rank"]: row for row in report.gpu_idle}
    assert sorted(kernels) == sorted(idle) == sorted(int(r) for r in HTA_KERNELS[name])
    for rank_text, hta in HTA_KERNELS[name].items():
        ours, split = kernels[int(rank_text)], idle[int(rank_text)]
        total = ours["total_us"]
        for kind, spent in hta["by_type_us"].items():
            assert _close(ours["by_type"][kind]["total_us"], spent, total), (rank_text, kind)
        assert [k["name"] for k in ours["top"]] == [k["name"] for k in hta["top"]]
        for mine, theirs in zip(ours["top"], hta["top"], strict=True):
            assert mine["type"] == theirs["type"].lower().replace("computation", "compute")
            assert _close(mine["total_us"], theirs["total_us"], theirs["total_us"]), mine["name"]
            assert _close(mine["mean_us"], theirs["mean_us"], theirs["mean_us"]), mine["name"]
        whole = sum(hta["idle_us"].values())
        assert _close(split["idle_us"], whole, whole)
        for cause in ("host_wait", "kernel_wait", "other"):
            assert _close(split[f"{cause}_us"], hta["idle_us"][cause], whole), (rank_text, cause)
        delay, theirs_delay = ours["launch_delay_us"], hta["launch_delay_us"]
        assert delay["count"] == theirs_delay["count"]
        for key in ("median", "p95"):
            assert _close(delay[key], theirs_delay[key], theirs_delay[key]), (rank_text, key)


def _launch(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return _x(name, "cuda_runtime", ts, dur, corr=corr)


def _kernel(ts: float, dur: float, corr: int, stream: int = 7, name: str = "gemm") -> dict[str, Any]:
    ev = _x(name, "kernel", ts, dur, corr=corr)
    ev["args"]["stream"] = stream
    return ev


def _one_rank(tmp_path: Path, events: list[dict[str, Any]]) -> Any:
    _write(tmp_path / "rank-0.json", events)
    report = analyze(tmp_path, jobs=1)
    assert report.ok
    (kernels,) = report.gpu_kernels
    (idle,) = report.gpu_idle
    return kernels, idle


def test_the_idle_split_and_the_launch_delay_follow_hta_definitions(tmp_path: Path) -> None:
    kernels, idle = _one_rank(
        tmp_path,
        [
            _launch("cudaLaunchKernel", 0, 5, 1),
            _kernel(10, 10, 1),  # ends at 20; launched 5 us before it ran
            _launch("cudaLaunchKernel", 30, 5, 2),
            _kernel(40, 10, 2),  # launched at 30, after the stream went idle at 20: 20 us of host wait
            _launch("cudaLaunchKernel", 36, 2, 3),
            _kernel(60, 10, 3),  # queued before 50: a 10 us gap is kernel wait (under 30 us)
            _launch("cudaLaunchKernelExC", 39, 1, 4),
            _kernel(150, 10, 4),  # queued long before: an 80 us gap is other (waiting on something else)
            _launch("cudaGraphLaunch", 1, 1, 5),
            _kernel(5, 100, 5, stream=9, name="ncclDevKernel_AllReduce"),  # graph launches have no delay measured
            _launch("cudaMemcpyAsync", 100, 10, 6),
            _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 105, 5, corr=6),  # ran before its call ended: 0
        ],
    )
    assert (idle["host_wait_us"], idle["kernel_wait_us"], idle["other_us"], idle["idle_us"]) == (
        20.0,
        10.0,
        80.0,
        110.0,
    )
    assert [s["stream"] for s in idle["streams"]] == [-1, 7, 9]  # the memcpy says no stream
    assert idle["host_wait_pct"] == round(100 * 20 / 110, 2)
    # GPU start minus launch end: 10-5, 40-35, 60-38, 150-40 and 0 (clipped): 0, 5, 5, 22, 110; the p95 is
    # interpolated 80% of the way from 22 to 110 (numpy's and pandas' default)
    assert kernels["launch_delay_us"] == {"count": 5, "median": 5.0, "p95": 92.4}
    assert kernels["by_type"]["compute"] == {"count": 4, "total_us": 40.0, "share_pct": round(100 * 40 / 145, 2)}
    assert kernels["by_type"]["communication"]["total_us"] == 100.0
    assert kernels["by_type"]["memory"] == {"count": 1, "total_us": 5.0, "share_pct": round(100 * 5 / 145, 2)}
    assert [(k["name"], k["count"], k["total_us"], k["mean_us"]) for k in kernels["top"]] == [
        ("ncclDevKernel_AllReduce", 1, 100.0, 100.0),
        ("gemm", 4, 40.0, 10.0),
        ("Memcpy HtoD (Pinned -> Device)", 1, 5.0, 5.0),
    ]
    assert sum(k["share_pct"] for k in kernels["top"]) == pytest.approx(100.0, abs=0.02)


def test_the_json_shape_of_gpu_kernels_and_gpu_idle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(DATA / "trace_filter", tmp_path / "traces")
    assert cli.main(["analyze", str(tmp_path / "traces"), "--json", "--no-png"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "gpu" in out and "stages" in out  # the keys there were stay
    for row in out["gpu_kernels"]:
        assert set(row) == {"rank", "events", "total_us", "by_type", "top", "launch_delay_us"}
        assert set(row["by_type"]) == {"compute", "communication", "memory", "other"}
        assert all(set(v) == {"count", "total_us", "share_pct"} for v in row["by_type"].values())
        assert len(row["top"]) == 10
        assert all(set(k) == {"name", "type", "count", "total_us", "mean_us", "share_pct"} for k in row["top"])
        assert set(row["launch_delay_us"]) == {"count", "median", "p95"}
    for row in out["gpu_idle"]:
        assert set(row) == {
            "rank", "idle_us", "host_wait_us", "kernel_wait_us", "other_us",
            "host_wait_pct", "kernel_wait_pct", "other_pct", "streams",
        }  # fmt: skip
        assert all(
            set(s) == {"stream", "idle_us", "host_wait_us", "kernel_wait_us", "other_us"} for s in row["streams"]
        )
    assert [r["rank"] for r in out["gpu_kernels"]] == [r["rank"] for r in out["gpu_idle"]] == [0, 1]


def test_files_of_one_rank_add_their_kernels_up(tmp_path: Path) -> None:
    _write(tmp_path / "actor_gen_step7_rank1-of-2_h_pid1_1.pt.trace.json", [_kernel(0, 10, 1)], rank=1)
    _write(tmp_path / "actor_train_step7_rank1-of-2_h_pid1_2.pt.trace.json", [_kernel(100, 30, 2)], rank=1)
    report = analyze(tmp_path, jobs=1)
    (row,) = report.gpu_kernels
    assert (row["rank"], row["events"], row["top"][0]["count"], row["top"][0]["mean_us"]) == (1, 2, 2, 20.0)


def test_the_table_page_and_picture_show_kernels_and_the_idle_split(shown: Any, tmp_path: Path) -> None:
    kernel_rows, idle_rows = tables.kernel_rows(shown), tables.idle_rows(shown)
    assert [r[0] for r in idle_rows] == ["0", "1"]
    assert [r[0] for r in kernel_rows] == ["0"] * tables.TABLE_KERNELS + ["1"] * tables.TABLE_KERNELS
    # rank 0: HTA's 3,525.8 ms of host wait, its busiest kernel NCCL's send/recv
    assert idle_rows[0][5] == "3,525.8 (83.3%)" and idle_rows[0][8] == "10,835.0"
    assert kernel_rows[0][:4] == ("0", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "communication", "10")
    text = render_text(shown, width=220)
    assert "Top kernels per rank" in text and "host wait" in text
    for row in kernel_rows + idle_rows:
        assert re.search(r"[\s│]+".join(re.escape(c) for c in row), text), row
    page = write_html(shown, tmp_path / "k.html").read_text(encoding="utf-8")
    for row, headers in [(r, tables.KERNEL_HEADERS) for r in kernel_rows] + [
        (r, tables.IDLE_HEADERS) for r in idle_rows
    ]:
        assert "".join(_html._td(c, h) for c, h in zip(row, headers, strict=True)) in page
    fig = picture._figure(shown)
    idle_ax = next(ax for ax in fig.axes if ax.get_title().startswith("(d)"))
    for i, g in enumerate(shown.gpu_idle):
        bars = [p for p in idle_ax.patches if round(p.get_x() + p.get_width() / 2) == i]
        assert sum(b.get_height() for b in bars) == pytest.approx(g["idle_us"] / 1000)
    kernel_ax = next(ax for ax in fig.axes if ax.get_title().startswith("(e)"))
    top = max(p.get_width() for p in kernel_ax.patches)
    nccl = sum(k["total_us"] for g in shown.gpu_kernels for k in g["top"] if k["name"].startswith("ncclKernel"))
    assert top == pytest.approx(nccl / 1000)


def test_cpu_only_traces_have_no_kernel_rows(tmp_path: Path) -> None:
    report = analyze(known_run(tmp_path / "sdk"), jobs=1)
    assert report.gpu_kernels == () and report.gpu_idle == ()
    assert tables.kernel_rows(report) == [] and "Top kernels" not in render_text(report)
    assert not any(ax.get_title().startswith("(d)") for ax in picture._figure(report).axes)
