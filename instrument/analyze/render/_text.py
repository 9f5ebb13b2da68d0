"""The terminal table of a :class:`~instrument.analyze.Report` (:func:`render_text`).

``rich`` is imported when a table is drawn, so importing ``instrument.analyze`` stays light; without
``rich`` the tables are plain text. The cells come from :mod:`._tables`, as the page's do.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from instrument.analyze._model import Report
from instrument.analyze.render._tables import (
    BAD_RATIO,
    GPU_HEADERS,
    GPU_LEGEND,
    HOW_TO_OPEN,
    IDLE_HEADERS,
    IDLE_LEGEND,
    KERNEL_HEADERS,
    KERNEL_LEGEND,
    LEFT,
    MEMORY_HEADERS,
    WARN_RATIO,
    gpu_rows,
    headers,
    idle_rows,
    kernel_rows,
    memory_rows,
    shown_ratio,
    summary,
    table_rows,
)
from instrument.analyze.render._timeline import STEP_HEADERS, findings_lines, step_rows

__all__ = ["render_text"]


def render_text(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The findings and the per-step table when the run has a timeline, the stage table with a short summary
    under it, then the GPU table when there is GPU work and the memory files when there are any: ``rich`` at
    ``width`` columns (160 when ``None``), coloured only with ``color``; plain text without ``rich``."""
    columns = headers(report)
    rows = table_rows(report)
    headline, legend, notes = summary(report)
    gpu = gpu_rows(report)
    findings = findings_lines(report)
    steps = [tuple(row) for row in step_rows(report)]
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        text = _plain(columns, rows, [headline, *legend])
        if steps:
            text = "Steps\n" + _plain(STEP_HEADERS, steps, []) + "\n\n" + text
        if findings:
            text = "Findings\n" + "\n".join(findings) + "\n\n" + text
        if gpu:
            text += "\n\nGPU time per rank\n" + _plain(GPU_HEADERS, gpu, [GPU_LEGEND]) + _plain_gpu_details(report)
        if report.memory:
            text += "\n\nMemory files\n" + _plain(MEMORY_HEADERS, memory_rows(report.memory), [HOW_TO_OPEN])
        return "\n".join([text, *notes])
    table = Table(title=f"instrument analyze: {report.directory}", title_justify="left", header_style="bold")
    # Labels up to 32 characters stay on one line and the numbers' headers wrap instead ("work med" over
    # "ms" reads better than a stage name cut in three); a longer label folds.
    longest = {h: max((len(r[i]) for r in rows), default=0) for i, h in enumerate(columns)}
    for header in columns:
        whole = header in ("role", "stage") and longest[header] <= 32
        table.add_column(header, justify="left" if header in LEFT else "right", overflow="fold", no_wrap=whole)
    for row, stage in zip(rows, report.stages, strict=True):
        ratio = shown_ratio(stage)
        style = "bold red" if ratio >= BAD_RATIO else "yellow" if ratio >= WARN_RATIO else None
        table.add_row(*(Text(cell) for cell in row), style=style)  # Text: "[mb2-3]" is no markup
    if not rows:
        table.add_row("-", "no trace found", *([""] * (len(columns) - 2)))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 160,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
    )
    _print_timeline(console, findings, steps)
    console.print(table)
    for line in (headline, *legend):
        console.print(line, markup=False)
    if gpu:
        _print_gpu(console, gpu, report)
    if report.memory:  # CUDA snapshots and CPU memory timelines beside the traces
        files = Table(title="Memory files", title_justify="left", header_style="bold")
        for header in MEMORY_HEADERS:
            files.add_column(header, justify="right" if header in ("step", "rank", "size") else "left")
        for row in memory_rows(report.memory):
            files.add_row(*(Text(cell) for cell in row))
        console.print()
        console.print(files)
        console.print(HOW_TO_OPEN, markup=False)
    for line in notes:
        console.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def _print_timeline(console: Any, findings: list[str], steps: list[tuple[str, ...]]) -> None:
    """The findings, then the per-step table, on a rich console (nothing without a timeline)."""
    from rich.table import Table
    from rich.text import Text

    if findings:
        console.print("Findings", style="bold")
        for line in findings:
            console.print(line, markup=False)
        console.print()
    if steps:
        per_step = Table(title="Steps", title_justify="left", header_style="bold")
        for header in STEP_HEADERS:
            per_step.add_column(header, justify="right" if header in ("step", "wall ms") else "left", overflow="fold")
        for row in steps:
            per_step.add_row(*(Text(cell) for cell in row))
        console.print(per_step)
        console.print()


def _plain(columns: Sequence[str], rows: Sequence[tuple[str, ...]], footer: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if h in LEFT else c.rjust(w) for c, w, h in zip(cells, widths, columns, strict=True)
        ).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out + footer)


def _gpu_details(report: Report) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]], str]]:
    """The GPU tables after the first: per rank by kernel type and idle split, then the top kernels."""
    return [
        ("GPU kernels and idle time per rank", IDLE_HEADERS, idle_rows(report), IDLE_LEGEND),
        ("Top kernels per rank", KERNEL_HEADERS, kernel_rows(report), KERNEL_LEGEND),
    ]


def _plain_gpu_details(report: Report) -> str:
    return "".join(
        f"\n\n{title}\n" + _plain(h, rows, [legend]) for title, h, rows, legend in _gpu_details(report) if rows
    )


def _print_gpu(console: Any, gpu: list[tuple[str, ...]], report: Report) -> None:
    """The GPU tables on a rich console: time per rank, then by kernel type and idle split, then the top kernels."""
    from rich.table import Table
    from rich.text import Text

    small = Table(title="GPU time per rank", title_justify="left", header_style="bold")
    for header in GPU_HEADERS:
        small.add_column(header, justify="left" if header == "step" else "right")
    for row in gpu:
        small.add_row(*(Text(cell) for cell in row))
    console.print()
    console.print(small)
    console.print(GPU_LEGEND, markup=False)
    for title, columns, rows, legend in _gpu_details(report):
        if not rows:
            continue
        table = Table(title=title, title_justify="left", header_style="bold")
        for header in columns:
            table.add_column(header, justify="left" if header in LEFT else "right", overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print()
        console.print(table)
        console.print(legend, markup=False)
