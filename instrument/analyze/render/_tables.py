"""What the terminal table and the page show of a :class:`~instrument.analyze.Report`: the cells, as text.

Three tables: the stages (one row per step x role x stage of the stages given, which the table and the page
take from :attr:`~instrument.analyze.Report.pipeline`, the order they ran: :func:`table_rows`),
GPU time per rank when the traces hold GPU work (:func:`gpu_rows`) and the memory files beside the
traces (:func:`memory_rows`); then the lines under them (:func:`summary`). Every ratio in the stage table
can be checked from figures on its row: when ranks are judged by work, the work figures are shown.
The terminal (:mod:`._text`) and the page (:mod:`._html`) lay the same cells out, so they agree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from instrument import naming
from instrument.analyze.model import STRAGGLER_MIN_MS, STRAGGLER_MIN_SHARE, MemoryFile, Report, StageStats
from instrument.analyze.render._words import ms, pct, plural, size

__all__ = [
    "BAD_RATIO",
    "GPU_HEADERS",
    "GPU_LEGEND",
    "IDLE_HEADERS",
    "IDLE_LEGEND",
    "KERNEL_HEADERS",
    "KERNEL_LEGEND",
    "HEADERS",
    "HOW_TO_OPEN",
    "LEFT",
    "MEMORY_HEADERS",
    "MEMORY_VIZ",
    "WARN_RATIO",
    "clock_caveat",
    "gpu_rows",
    "headers",
    "hosts",
    "idle_rows",
    "kernel_rows",
    "memory_rows",
    "short_kernel_name",
    "shown_ratio",
    "summary",
    "table_rows",
]

HEADERS = (
    "step",
    "role",
    "stage",
    "ranks",
    "median ms",
    "max ms",
    "work med ms",
    "work max ms",
    "slowest",
    "max/med",
    "lost ms",
    "mini-batch ms",
    "cpu op ms",
    "gpu ms",
    "events",
)
"""Every column; :func:`headers` leaves out those that would hold only ``-``."""
GPU_HEADERS = ("rank", "step", "span ms", "compute ms", "communication ms", "memory ms", "idle ms", "overlap")
LEFT = frozenset({"step", "role", "stage", "kernel", "type"})
"""Columns of labels, aligned left; numbers go right."""
WARN_RATIO = 1.2
"""From this straggler ratio a row is marked (yellow); from :data:`BAD_RATIO` it is marked bad (red)."""
BAD_RATIO = 1.5


def hosts(report: Report) -> frozenset[str] | None:
    """The hosts the report's traces come from, read from the SDK's file names; ``None`` when a name
    does not say (plain torch, verl or engine names)."""
    found: set[str] = set()
    for stage in report.stages:
        for rank in stage.ranks:
            for path in rank.files:
                parsed = naming.parse_trace_name(os.path.basename(path))
                if parsed is None:
                    return None
                found.add(parsed.host)
    return frozenset(found)


def clock_caveat(report: Report) -> str | None:
    """The report's clock caveat when it applies: traces from more than one host, or from hosts the
    names do not give while more than one rank (or replica) is compared."""
    seen = hosts(report)
    if seen is not None:
        return report.caveat if len(seen) > 1 else None
    return report.caveat if any(len(s.ranks) > 1 for s in report.stages) else None


def _windows(stage: StageStats) -> str:
    parts = [f"mb{a}" if a == b else f"mb{a}-{b}" for a, b in stage.windows]
    if any(r.partial for r in stage.ranks):
        parts.append("partial")
    return f" [{','.join(parts)}]" if parts else ""


def _by_work(stage: StageStats) -> bool:
    # one rank judged by work too: an engine's row shows its work beside its profiling window, as --json does
    return stage.judged_by == "work"


def _named(stage: StageStats) -> bool:
    return stage.straggler is not None and len(stage.ranks) > 1


def shown_ratio(stage: StageStats) -> float:
    """The ratio a row is marked by (:data:`WARN_RATIO`, :data:`BAD_RATIO`): 0 where no straggler is named."""
    return (stage.ratio or 0.0) if _named(stage) else 0.0


def _has_mini_batches(report: Report) -> bool:
    return any(r.mini_batches for s in report.stages for r in s.ranks)


def _cells(s: StageStats) -> dict[str, str]:
    """One row's cells under every one of :data:`HEADERS`."""
    compared = len(s.ranks) > 1  # one rank has no straggler: "-", not "0" and "1.00"
    by_work = _by_work(s)
    return {
        "step": "-" if s.step is None else str(s.step),
        "role": s.role,
        "stage": s.stage + _windows(s),
        "ranks": str(len(s.ranks)),
        "median ms": ms(s.median_ms),
        "max ms": ms(s.max_ms),
        "work med ms": ms(s.median_work_ms) if by_work else "-",
        "work max ms": ms(max(r.judged_ms for r in s.ranks)) if by_work else "-",
        "slowest": s.straggler if compared and s.straggler is not None else "-",
        "max/med": "-" if s.ratio is None or not compared else f"{s.ratio:.2f}",
        "lost ms": ms(s.lost_ms) if _named(s) and s.lost_ms > 0 else "-",
        "mini-batch ms": ms(s.minibatch_ms if any(r.mini_batches for r in s.ranks) else None),
        "cpu op ms": ms(s.cpu_ms),
        "gpu ms": ms(s.kernel_ms),
        "events": f"{s.events:,.0f}",
    }


_LABELS = ("step", "role", "stage")


def headers(report: Report) -> tuple[str, ...]:
    """The stage table's columns for ``report``: :data:`HEADERS` but those that would hold only ``-`` (the
    work pair when no row is judged by work, ``slowest`` and ``max/med`` with one rank, ``gpu ms`` on the CPU,
    ...): a column of ``-`` only takes room. The labels (step, role, stage) always stay."""
    rows = [_cells(s) for s in report.stages]
    return tuple(h for h in HEADERS if h in _LABELS or any(row[h] != "-" for row in rows))


def table_rows(report: Report, stages: Iterable[StageStats] | None = None) -> list[tuple[str, ...]]:
    """The stage table's cells as text, in the columns of :func:`headers`, one row per stage of ``stages``
    (default :attr:`Report.stages`; the table shows :attr:`Report.pipeline`, the order the stages ran).

    ``max/med`` is ``work max ms / work med ms`` on a row judged by work, else ``max ms / median ms``:
    the ratio can always be checked from its row.
    """
    columns = headers(report)
    return [tuple(cells[c] for c in columns) for cells in map(_cells, report.stages if stages is None else stages)]


def _gpu_cell(part_us: Any, span_us: float) -> str:
    value = float(part_us or 0.0)
    return f"{ms(value / 1000.0)} ({pct(value, span_us)})"


def gpu_rows(report: Report) -> list[tuple[str, ...]]:
    """The GPU table's cells (:data:`GPU_HEADERS`): the whole trace of every rank (step ``all``), then
    each step's ranks; ms and, in brackets, % of the rank's GPU span. Empty for CPU-only traces."""
    order = sorted(report.gpu, key=lambda g: (g["step"] is not None, g["step"] or 0, g["rank"] is None, g["rank"] or 0))
    rows: list[tuple[str, ...]] = []
    for g in order:
        span = float(g["span_us"])
        overlap = g["comm_comp_overlap_pct"]
        rows.append(
            (
                "-" if g["rank"] is None else str(g["rank"]),
                "all" if g["step"] is None else str(g["step"]),
                ms(span / 1000.0),
                _gpu_cell(g["compute_us"], span),
                _gpu_cell(g["communication_us"], span),
                _gpu_cell(g["memory_us"], span),
                _gpu_cell(g["idle_us"], span),
                "-" if overlap is None else f"{overlap:.1f}%",
            )
        )
    return rows


GPU_LEGEND = (
    "GPU (HTA's definitions): span: first to last GPU event; compute, communication (NCCL kernels) and memory"
    " (memcpy, memset): time each kind of GPU work runs, so they can overlap; idle: no GPU work; (%): of the span;"
    " overlap: the share of communication time during which compute runs too."
)

KERNEL_HEADERS = ("rank", "kernel", "type", "count", "total ms", "mean us", "share")
TABLE_KERNELS = 5
"""Kernels shown per rank in the table (``--json`` has the top ten)."""
KERNEL_LEGEND = (
    f"Top kernels (HTA's get_gpu_kernel_breakdown), the {TABLE_KERNELS} of most total time per rank, whole trace:"
    " total and mean duration; share: of the rank's summed GPU event time; names cut short (--json has them whole)."
)
IDLE_HEADERS = (
    "rank",
    "compute",
    "communication",
    "memory",
    "idle ms",
    "host wait",
    "kernel wait",
    "other wait",
    "launch p50 us",
    "launch p95 us",
)
IDLE_LEGEND = (
    "GPU time by kernel type (summed durations, share of all GPU event time) and idle time per stream, summed over"
    " streams (HTA's get_idle_time_breakdown): host wait, the next event's launch came after the stream went idle"
    " (the CPU was late); kernel wait, a gap under 30 us between events; other, the rest (waiting on another stream);"
    " launch: GPU start minus the end of its launch call (cudaLaunchKernel, cudaMemcpyAsync, ...), median and p95."
)


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel's name without its return type, template and argument lists, cut to ``width``."""
    short = name.removeprefix("void ")
    for stop in ("<", "("):
        cut = short.find(stop)
        if cut > 0:
            short = short[:cut]
    short = short.strip()
    return short if len(short) <= width else short[: width - 1] + "\u2026"


def kernel_rows(report: Report) -> list[tuple[str, ...]]:
    """The top-kernels table's cells (:data:`KERNEL_HEADERS`): each rank's :data:`TABLE_KERNELS` of most time."""
    rows: list[tuple[str, ...]] = []
    for g in report.gpu_kernels:
        rank = "-" if g["rank"] is None else str(g["rank"])
        for k in g["top"][:TABLE_KERNELS]:
            rows.append(
                (
                    rank,
                    short_kernel_name(k["name"]),
                    k["type"],
                    f"{k['count']:,}",
                    ms(k["total_us"] / 1000.0),
                    f"{k['mean_us']:,.1f}",
                    f"{k['share_pct']:.1f}%",
                )
            )
    return rows


def _share(part: dict[str, Any]) -> str:
    return f"{ms(part['total_us'] / 1000.0)} ({part['share_pct']:.1f}%)"


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


def idle_rows(report: Report) -> list[tuple[str, ...]]:
    """The per-rank GPU table's cells (:data:`IDLE_HEADERS`): time by kernel type, the idle split (ms and % of
    the idle time) and the launch delay."""
    idle = {g["rank"]: g for g in report.gpu_idle}
    rows: list[tuple[str, ...]] = []
    for g in report.gpu_kernels:
        split = idle.get(g["rank"])
        if split is None:  # pragma: no cover - the two lists are made together
            continue
        types, delay = g["by_type"], g["launch_delay_us"]
        rows.append(
            (
                "-" if g["rank"] is None else str(g["rank"]),
                _share(types["compute"]),
                _share(types["communication"]),
                _share(types["memory"]),
                ms(split["idle_us"] / 1000.0),
                f"{ms(split['host_wait_us'] / 1000.0)} ({split['host_wait_pct']:.1f}%)",
                f"{ms(split['kernel_wait_us'] / 1000.0)} ({split['kernel_wait_pct']:.1f}%)",
                f"{ms(split['other_us'] / 1000.0)} ({split['other_pct']:.1f}%)",
                _us(delay["median"]),
                _us(delay["p95"]),
            )
        )
    return rows


def _engine_notes(report: Report) -> list[str]:
    """One line per engine stage: what each replica rank did in its profiling window."""
    lines = []
    for stage in report.stages:
        if stage.stage != "engine" and not any(r.iterations for r in stage.ranks):
            continue
        parts = []
        for r in stage.ranks:
            if r.iterations == 0:
                parts.append(f"rank {r.label} idle (0 iterations in {r.wall_ms:,.1f} ms)")
                continue
            tokens = f", {plural(r.tokens, 'token')}" if r.tokens else ""
            parts.append(
                f"rank {r.label} {plural(r.iterations, 'iteration')}{tokens}, "
                f"{r.judged_ms:,.1f} ms in a {r.wall_ms:,.1f} ms window"
            )
        step = "-" if stage.step is None else stage.step
        lines.append(f"{stage.role}/{stage.stage} step {step}: " + "; ".join(parts))
    return lines


def summary(report: Report) -> tuple[str, list[str], list[str]]:
    """The headline, what the columns mean, and the notes (caveat, skipped files)."""
    jobs = f" with {plural(report.jobs, 'process', 'processes')}" if report.jobs > 1 else ""
    headline = (
        f"{plural(report.files, 'trace file')}, {size(report.bytes)}, {plural(report.events, 'event')}, "
        f"{plural(len(report.steps), 'step')}, {plural(len(report.ranks), 'rank')}; "
        f"read in {report.elapsed_s:.2f} s{jobs}"
    )
    legend = [
        "rows: each step's stages in the order they ran; ms: wall time of the stage range (median and max"
        " across ranks; an engine's: its profiling window);"
    ]
    by_work = any(_by_work(s) for s in report.stages)
    if any(len(s.ranks) > 1 for s in report.stages):
        ratio = "work max / work med where shown, else max / median" if by_work else "max / median"
        legend.append(f"slowest: the straggler rank, max/med: its time over the median ({ratio});")
        legend.append(
            f"lost ms: the straggler's excess over the median times the ranks that waited for it; no straggler"
            f" (-) where the slowest rank takes under {STRAGGLER_MIN_MS:g} ms or under"
            f" {100 * STRAGGLER_MIN_SHARE:g}% of the step;"
        )
    if by_work:
        # a rank waiting in a barrier for a slow peer has as long a wall time as the peer: say how we judged
        legend.append(
            "stragglers judged by work (work med / work max ms): time outside CPU-side waits in collectives"
            " (barrier, all_reduce), so the rank the others wait for is named, not the waiters, and an engine's"
            " execution time (not its profiling window); -: judged by wall time;"
        )
    medians = "mini-batch, cpu op, gpu ms" if _has_mini_batches(report) else "cpu op, gpu ms"
    legend.append(f"{medians} and events: medians across ranks; -: none in the traces.")
    notes = _engine_notes(report)
    caveat = clock_caveat(report)
    if caveat:
        notes.append(f"note: {caveat}")
    if report.skipped:
        notes.append(f"skipped {plural(len(report.skipped), 'file')}: see the lines above (stderr)")
    return headline, legend, notes


MEMORY_VIZ = "https://pytorch.org/memory_viz"
HOW_TO_OPEN = (
    f"open a .pickle in PyTorch's memory viewer, {MEMORY_VIZ} (drag it in; it runs in the browser), or run "
    "`python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html`; a .memory-timeline.html opens in any browser"
)
MEMORY_HEADERS = ("kind", "role", "stage", "step", "rank", "window", "size", "peak allocated", "file")


def memory_rows(files: Iterable[MemoryFile]) -> list[tuple[str, ...]]:
    """The rows ``instrument analyze`` shows for memory files (:data:`MEMORY_HEADERS`)."""
    rows: list[tuple[str, ...]] = []
    for f in files:
        window = (
            "" if f.window is None else f"mb{f.window[0]}" + ("" if f.window[0] == f.window[1] else f"-{f.window[1]}")
        )
        peak = size(f.peak_allocated) if f.peak_allocated is not None else (f.note or "-")
        rows.append((f.kind, f.role, f.stage, str(f.step), str(f.rank), window, size(f.bytes), peak, Path(f.path).name))
    return rows
