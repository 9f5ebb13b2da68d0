"""The terminal table of a :class:`~instrument.analyze.Report` (:func:`render_text`).

``rich`` is imported when a table is drawn, so importing ``instrument.analyze`` stays light; without
``rich`` the tables are plain text. The cells come from :mod:`._tables`, as the page's do, in the order the
stages ran (:attr:`~instrument.analyze.Report.pipeline`). Every table fits the terminal's width (:func:`fit`)
without ever cutting or wrapping a number: headers break between words, names end in an ellipsis, the frame
goes, then the least needed columns, each named under the table.
"""

from __future__ import annotations

import io
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from instrument.analyze.model import Report
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

__all__ = ["DROPPED_FIRST", "Layout", "fit", "render_text", "shorten"]


def render_text(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The findings and the per-step table when the run has a timeline, the stage table with a short summary
    under it, then the GPU tables when there is GPU work and the memory files when there are any: ``rich``
    fitted to ``width`` columns (160 when ``None``), coloured only with ``color``; plain text without ``rich``."""
    columns = headers(report)
    in_order = report.pipeline  # the order the stages ran, shared with the page and the picture
    rows = table_rows(report, in_order)
    headline, legend, notes = summary(report)
    gpu = gpu_rows(report)
    findings = findings_lines(report)
    steps = [tuple(row) for row in step_rows(report)]
    try:
        from rich.console import Console
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
    width = width or 160
    if not rows:
        rows = [("-", "-", "no trace found", *([""] * (len(columns) - 3)))]
    layout = fit(columns, rows, width, shortened=("role", "stage"), droppable=DROPPED_FIRST)
    table = _table(layout, title=f"instrument analyze: {report.directory}")
    for row, stage in zip(layout.cut(rows), in_order, strict=False):
        ratio = shown_ratio(stage)
        style = "bold red" if ratio >= BAD_RATIO else "yellow" if ratio >= WARN_RATIO else None
        table.add_row(*(Text(cell) for cell in row), style=style)  # Text: "[mb2-3]" is no markup
    if not report.stages:
        table.add_row(*(Text(cell) for cell in layout.cut(rows)[0]))
    below = _tables_below(report, gpu, width)
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        # a table that cannot fit is wider than the terminal, never a number cut: everything else keeps to width
        width=max(width, layout.width, *(fitted.width for _, fitted, _, _ in below)),
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
    )
    _print_timeline(console, findings, steps, width)
    console.print(table)
    for line in (headline, *legend):
        console.print(line, markup=False, width=width)
    if layout.left_out:
        console.print(_left_out(layout, width).lstrip("\n"), markup=False, width=width)
    for title, fitted, cells, legend_line in below:
        table = _table(fitted, title=title)
        for row in fitted.cut(cells):
            table.add_row(*(Text(cell) for cell in row))
        console.print()
        console.print(table)
        console.print(legend_line, markup=False, width=width)
    for line in notes:
        console.print(line, markup=False, width=width)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def _tables_below(
    report: Report, gpu: list[tuple[str, ...]], width: int
) -> list[tuple[str, Layout, list[tuple[str, ...]], str]]:
    """The tables under the stage table, fitted: GPU time per rank, by kernel type and idle split, the top
    kernels (GPU traces), then the memory files beside the traces (CUDA snapshots, CPU memory timelines)."""
    tables = [("GPU time per rank", GPU_HEADERS, gpu, GPU_LEGEND), *_gpu_details(report)]
    if report.memory:
        tables.append(("Memory files", MEMORY_HEADERS, memory_rows(report.memory), HOW_TO_OPEN))
    shortened = ("kernel", "role", "stage", "file")
    out = []
    for title, columns, rows, legend in tables:
        if rows:
            fitted = fit(columns, rows, width, shortened=shortened, droppable=_GPU_DROPPED_FIRST, left=_MEMORY_LEFT)
            out.append((title, fitted, rows, legend + _left_out(fitted, width)))
    return out


def _left_out(layout: Layout, width: int) -> str:
    if not layout.left_out:
        return ""
    return f"\nleft out for {width} columns: {', '.join(layout.left_out)} (a wider terminal or --json has them)"


_GPU_DROPPED_FIRST = ("overlap", "launch p95 us", "launch p50 us", "kernel wait", "memory", "memory ms")
"""The GPU tables' columns left out, in this order, when a table cannot fit the terminal otherwise."""
_MEMORY_LEFT = LEFT - {"step"} | {"kind", "window", "file"}  # the memory table's words; its numbers go right


# --------------------------------------------------------------------------- fitting a table to the terminal

DROPPED_FIRST = ("events", "cpu op ms", "gpu ms", "mini-batch ms", "ranks", "max ms", "work max ms")
"""The stage table's columns left out, in this order, when the table cannot fit the terminal otherwise."""
LABEL_KEEP = 20
"""Characters of a label kept while a column can be left out instead."""
LABEL_MIN = 8
"""Characters a shortened label keeps at least (its last one an ellipsis)."""
_ELLIPSIS = "\u2026"
_PIECE = re.compile(r"[^ /-]+[/-]?|[/-]")


def _header_lines(header: str, width: int) -> list[str]:
    """``header`` on lines of at most ``width``, broken at spaces and after ``-`` and ``/`` (``max/`` ``med``)."""
    lines: list[str] = []
    for piece in _PIECE.findall(header):
        glued = bool(lines) and lines[-1].endswith(("-", "/"))
        joined = lines[-1] + ("" if glued else " ") + piece if lines else piece
        if lines and len(joined) <= width:
            lines[-1] = joined
        else:
            lines.append(piece)
    return lines or [""]


def shorten(label: str, width: int) -> str:
    """``label`` cut to ``width`` with an ellipsis; a stage's window (`` [mb2-3]``) is kept where it fits."""
    if len(label) <= width:
        return label
    name, bracket, window = label.partition(" [")
    suffix = bracket + window
    if bracket and len(suffix) + 2 <= width - LABEL_MIN // 2:
        return name[: width - len(suffix) - 1] + _ELLIPSIS + suffix
    return label[: width - 1] + _ELLIPSIS


@dataclass(frozen=True)
class Layout:
    """How a table fits: the columns shown, their widths, the box (``compact``: no frame, one space apart)."""

    columns: tuple[str, ...]
    shown: tuple[int, ...]
    """Indices of the shown columns in the table's own."""
    widths: tuple[int, ...]
    compact: bool
    left_out: tuple[str, ...]
    labels: frozenset[str]
    """Columns whose cells may be shortened."""
    left: frozenset[str] = LEFT
    """Columns aligned left (words); the rest are numbers, aligned right."""

    @property
    def width(self) -> int:
        """The table's width in characters."""
        gaps = 2 * (len(self.widths) - 1) if self.compact else 3 * len(self.widths) + 1
        return sum(self.widths) + gaps

    def headers(self) -> list[str]:
        """The shown headers, each broken onto lines that fit its column."""
        return ["\n".join(_header_lines(h, w)) for h, w in zip(self.columns, self.widths, strict=True)]

    def cut(self, rows: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
        """``rows`` in the shown columns, labels shortened to their width (numbers always fit theirs)."""
        out = []
        for row in rows:
            cells = [row[i] for i in self.shown]
            out.append(
                tuple(
                    shorten(c, w) if h in self.labels else c
                    for c, w, h in zip(cells, self.widths, self.columns, strict=True)
                )
            )
        return out


def fit(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    *,
    shortened: Collection[str] = (),
    droppable: Sequence[str] = (),
    left: frozenset[str] = LEFT,
) -> Layout:
    """The layout of a table of ``rows`` under ``columns`` in ``width`` characters.

    A number is never cut or wrapped: each column is at least as wide as its longest cell. To fit, in this
    order: headers break onto lines, the ``shortened`` labels lose their ends (to :data:`LABEL_KEEP`), the
    frame goes (``compact``), the ``droppable`` columns are left out one by one; then all over again with
    labels cut to :data:`LABEL_MIN`. A table that fits none of these ways is wider than ``width``."""
    longest = [max([len(r[i]) for r in rows] + [0]) for i in range(len(columns))]
    shrinkable = frozenset(shortened)
    present = [h for h in droppable if h in columns]
    tried: Layout | None = None
    for label_min in (LABEL_KEEP, LABEL_MIN):  # columns go before a name is cut short of LABEL_KEEP
        for dropped in range(len(present) + 1):
            left_out = tuple(present[:dropped])
            shown = tuple(i for i, h in enumerate(columns) if h not in left_out)
            names = tuple(columns[i] for i in shown)
            natural = [max(longest[i], len(columns[i])) for i in shown]
            least = [
                min(n, label_min) if h in shrinkable else max(longest[i], *map(len, _PIECE.findall(h)))
                for n, h, i in zip(natural, names, shown, strict=True)
            ]
            for compact in (False, True):
                tried = Layout(names, shown, tuple(least), compact, left_out, shrinkable, left)
                room = width - (tried.width - sum(least))
                if sum(least) <= room:
                    widths = _grown(least, natural, names, shrinkable, room)
                    return Layout(names, shown, widths, compact, left_out, shrinkable, left)
    assert tried is not None  # the loops run at least once
    return tried


def _grown(
    least: list[int], natural: list[int], names: Sequence[str], labels: frozenset[str], room: int
) -> tuple[int, ...]:
    """Widths from ``least`` towards ``natural`` within ``room``: labels first (a name whole matters more than
    a header on one line), a character at a time to the most cut; then headers whole, left to right."""
    widths = list(least)
    spare = room - sum(widths)
    while spare > 0:
        short = [i for i, h in enumerate(names) if h in labels and widths[i] < natural[i]]
        if not short:
            break
        widest_cut = max(short, key=lambda i: natural[i] - widths[i])
        widths[widest_cut] += 1
        spare -= 1
    for i, h in enumerate(names):
        if h not in labels and 0 < natural[i] - widths[i] <= spare:
            spare -= natural[i] - widths[i]
            widths[i] = natural[i]
    return tuple(widths)


def _table(layout: Layout, *, title: str) -> Any:
    """An empty rich table with ``layout``'s columns: fixed widths, nothing wraps, labels end in an ellipsis."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD if layout.compact else box.HEAVY_HEAD,
        show_edge=not layout.compact,
        pad_edge=not layout.compact,
        collapse_padding=layout.compact,
    )
    for header, lines, w in zip(layout.columns, layout.headers(), layout.widths, strict=True):
        table.add_column(
            Text(lines),
            justify="left" if header in layout.left else "right",
            width=w,
            no_wrap=True,
            overflow="ellipsis",
        )
    return table


def _print_timeline(console: Any, findings: list[str], steps: list[tuple[str, ...]], width: int) -> None:
    """The findings, then the per-step table, on a rich console (nothing without a timeline)."""
    from rich.table import Table
    from rich.text import Text

    if findings:
        console.print("Findings", style="bold")
        for line in findings:
            console.print(line, markup=False, width=width)
        console.print()
    if steps:
        per_step = Table(title="Steps", title_justify="left", header_style="bold")
        for i, header in enumerate(STEP_HEADERS):
            # Whole on one line; the critical path wraps between words.
            number = header in ("step", "wall ms", "instrument ms")
            per_step.add_column(
                header,
                justify="right" if number else "left",
                overflow="fold",
                no_wrap=number,
                min_width=max(len(header), *(len(row[i]) for row in steps)) if number else None,
            )
        for row in steps:
            per_step.add_row(*(Text(cell) for cell in row))
        console.print(per_step, width=width)
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
