"""``instrument analyze DIR``: the table, ``--json``, the PNG, ``--html`` and ``--merged-trace``.

Exit status: 0 every file was read, 1 some were skipped (one stderr line each), 2 bad arguments,
an unreadable directory, nothing the filters keep (or no trace at all: then no picture is written; what
is there is named), an unknown ``--run`` or an output that could not be written.  Of several runs in
the directory the newest is analysed (one stderr line names the others) unless ``--run`` picks.  A file
read whole because no stage or step could be recognised in it gets a note on stderr (the exit status
stays 0).  Names and labels come from a directory we do not trust: control characters are escaped (one
line per skipped file, no terminal escapes) and text no encoding can print is backslash-escaped rather than raising.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from instrument._terminal import Display, human_bytes, wanted
from instrument.analyze._analyze import analyze
from instrument.analyze._layout import export_layout
from instrument.analyze.model import IntRanges, Report, Skipped
from instrument.analyze.render import render_text, write_html, write_merged_trace, write_png
from instrument.analyze.traces._discover import ALL_RUNS, Run, find_runs, runs_line, select_run
from instrument.analyze.traces._ray import RayUnavailableError
from instrument.analyze.traces._selection import NothingMatchedError

__all__ = ["DEFAULT_PNG", "add_arguments", "main_from_args", "parse_int_list"]

DEFAULT_PNG = "instrument-analysis.png"
"""The picture's name inside the analysed directory unless ``--png`` names another path."""

_EPILOG = """\
examples:
  instrument analyze outputs/profile
  instrument analyze outputs/profile --ranks 0,2 --steps 2-4 --stage update_actor --html report.html
  instrument analyze outputs/profile --json > analysis.json
  instrument analyze outputs/profile --run all       # every run in the directory, not only the newest
  instrument analyze outputs/profile --merged-trace merged.json.gz   # every rank's timeline: open in Perfetto
  instrument analyze outputs/profile --layout tensorboard tb-runs   # then: tensorboard --logdir tb-runs
  instrument analyze /shared/profile --ray auto      # files read as Ray tasks on the running cluster

Exit status: 0 all files read, 1 some skipped (named on stderr), 2 bad arguments, unreadable directory,
nothing matching the filters (or no trace), or an unknown --run.
"""


def parse_int_list(text: str) -> IntRanges:
    """``"0,2,5-7"`` -> the ints 0, 2, 5, 6, 7 as intervals (``5-7`` is never expanded, whatever its
    numbers); raises ``argparse.ArgumentTypeError``."""
    intervals: list[tuple[int, int]] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r} (e.g. 0,2,5-7)") from None
        if low < 0 or high < low:
            raise argparse.ArgumentTypeError(f"bad range {part!r} in {text!r}")
        intervals.append((low, high))
    if not intervals:
        raise argparse.ArgumentTypeError(f"no number in {text!r}")
    return IntRanges(intervals)


def add_filters(parser: argparse.ArgumentParser) -> None:
    """``--all-ranks`` / ``--ranks``, ``--steps`` and ``--stage``: the filters analyze and compare share."""
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--all-ranks", action="store_true", help="every rank (the default)")
    who.add_argument("--ranks", type=parse_int_list, metavar="LIST", help="only these global ranks, e.g. 0,2 or 0-3")
    parser.add_argument("--steps", type=parse_int_list, metavar="LIST", help="only these steps, e.g. 1,3")
    parser.add_argument(
        "--stage", action="append", metavar="NAME", help="only this stage (update_actor or update-actor); repeat it"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``instrument analyze``."""
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", metavar="DIR", help="a save_path: trace files and instrument-manifest-*.jsonl")
    add_filters(parser)
    parser.add_argument(
        "--run",
        metavar="ID",
        help=f"which run of DIR (default: the newest; the others are named on stderr); {ALL_RUNS}: every file",
    )
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON instead of the table")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress while reading (it is only ever drawn on a terminal)"
    )
    parser.add_argument("--png", metavar="PATH", help=f"where the picture goes (default DIR/{DEFAULT_PNG})")
    parser.add_argument("--no-png", action="store_true", help="write no picture")
    parser.add_argument(
        "--html",
        metavar="PATH",
        help="also write one self-contained HTML page (works offline): the findings, an interactive step timeline "
        "(a lane per rank by role, role bands past 32 processes; hover, zoom, pan), the tables and the picture",
    )
    parser.add_argument(
        "--merged-trace",
        metavar="OUT.json.gz",
        help="also write every rank's step-timeline spans on one time axis as one Chrome trace (a process per "
        'rank named "role rank r", steps on their own track) for Perfetto or chrome://tracing; gzip when OUT '
        "ends in .gz",
    )
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="processes reading files (default: CPUs up to 8 for large sets)"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const=True,
        metavar="ADDRESS",
        help="read the files as Ray tasks across a cluster (ADDRESS: auto, ray://head:10001, ...; none: Ray's "
        "default); DIR must be on a filesystem every node mounts at the same path (see docs/scale.md)",
    )
    parser.add_argument(
        "--layout",
        nargs=2,
        metavar=("KIND", "OUT"),
        help="instead of analysing, export DIR for another tool: KIND hta or tensorboard, OUT a new or empty "
        "folder outside DIR (one folder per role/stage/step, one file per rank; see docs/analyze.md)",
    )


def _printable(text: str) -> str:
    """``text`` with newlines, terminal escapes and undecodable bytes written as Python escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text``; what the stream's encoding cannot hold (a lone surrogate) is backslash-escaped."""
    out = sys.stdout if stream is None else stream
    encoding = getattr(out, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding, "replace"), file=out)


def _say_json(data: object, piece: int = 1 << 16) -> None:
    """``json.dumps(data, indent=2)`` written a piece at a time: at 4,096 ranks the text is ~10 MB and
    joining it whole took ~5x that at once. ASCII only (``ensure_ascii``), so any stdout encoding takes it."""
    held: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(indent=2).iterencode(data):
        held.append(chunk)
        size += len(chunk)
        if size >= piece:
            sys.stdout.write("".join(held))
            held, size = [], 0
    sys.stdout.write("".join(held) + "\n")


def _error(message: str) -> int:
    _say(f"instrument analyze: error: {_printable(message)}", sys.stderr)
    return 2


def _not_ours(target: Path) -> str | None:
    """Why the default picture must not be written at ``target``: a planted symlink would be followed
    (overwriting its target) and a FIFO would block; an old picture (a regular file) is replaced."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot check {target}: {exc.strerror}"
    if stat.S_ISREG(mode):
        return None
    kind = "a symlink" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
    return f"{target} is not a regular file ({kind}): left alone"


def _export(args: argparse.Namespace) -> int:
    """``--layout KIND OUT``: the export instead of the analysis (exit 1 when a file was left out)."""
    kind, out = args.layout
    if args.png or args.html or args.no_png or getattr(args, "merged_trace", None):
        return _error("--layout writes no analysis: drop --png, --no-png, --html and --merged-trace")
    runs, chosen = _runs(args)
    said = runs_line(runs, chosen)
    if said is not None:
        _say(f"instrument analyze: {_printable(said)}", sys.stderr)
    try:
        done = export_layout(
            args.directory,
            out,
            kind,
            ranks=args.ranks,
            steps=args.steps,
            stages=args.stage,
            run=chosen or getattr(args, "run", None),
        )
    except (OSError, ValueError) as exc:
        return _error(str(exc))
    for skipped in done.skipped:
        _say(f"instrument analyze: not exported {_printable(skipped.path)}: {_printable(skipped.reason)}", sys.stderr)
    if args.json:
        _say(json.dumps(done.to_dict(), indent=2))
    else:
        words = {"link": "hard links", "symlink": "symlinks", "copy": "copies", "rewritten": "rewritten copies"}
        hows = [h for h in words if any(f.how == h for f in done.files)]
        counts = ", ".join(f"{sum(f.how == h for f in done.files)} {words[h]}" for h in hows) or "none"
        where = _printable(done.out)
        _say(f"{kind} layout in {where}: {len(done.files)} files in {len(done.folders)} folders ({counts})")
        for folder in done.folders:
            _say(f"  {_printable(folder)}")
    return 1 if done.skipped else 0


class _Reading:
    """The reading's progress on stderr (files and bytes), then one line naming the slowest file.

    Drawn only on a terminal (stdout and stderr both), never with ``--json`` or ``--quiet``.
    """

    def __init__(self, quiet: bool) -> None:
        shown = not quiet and sys.stdout.isatty() and wanted(sys.stderr)
        self._display = Display(sys.stderr if shown else None, kind="bytes")
        self._task: int | None = None
        self._files = self._done = 0
        self._bytes = 0
        self._slowest: tuple[float, str] | None = None

    def begin(self, files: int, total_bytes: int) -> None:
        self._files, self._bytes = files, total_bytes
        self._display.__enter__()
        self._task = self._display.add(f"reading 0/{files} files", total=total_bytes)

    def file_done(self, path: str, size: int, seconds: float) -> None:
        self._done += 1
        if self._slowest is None or seconds > self._slowest[0]:
            self._slowest = (seconds, path)
        self._display.update(self._task, advance=size, description=f"reading {self._done}/{self._files} files")

    def close(self) -> None:
        """Remove the display and, if it was drawn, say what was read and which file took longest."""
        drawn = self._display.live
        self._display.close()
        if drawn and self._slowest is not None:
            seconds, path = self._slowest
            _say(
                f"read {self._done} files, {human_bytes(self._bytes)}; slowest {_printable(path)} ({seconds:.1f} s)",
                sys.stderr,
            )


def _wrong_arguments(args: argparse.Namespace, ray: str | bool | None) -> str | None:
    """What is wrong with the arguments taken together, or ``None``."""
    if args.jobs is not None and args.jobs < 1:
        return f"--jobs must be >= 1: {args.jobs}"
    if args.no_png and args.png:
        return "--png and --no-png contradict each other"
    if ray is not None and args.jobs is not None:
        return "--ray and --jobs contradict each other: the cluster's CPUs read the files"
    if ray is not None and getattr(args, "layout", None):
        return "--layout links files and reads none: drop --ray"
    return None


def _reason(exc: OSError) -> str:
    """Why a write failed, without the file name: the writers go through hidden temp files the user never named."""
    return exc.strerror or str(exc)


def _tell_left_out(skipped: Iterable[Skipped], notes: Iterable[Skipped]) -> None:
    """One stderr line per file skipped, then per file read whole for want of a stage or step."""
    for item in skipped:
        _say(f"instrument analyze: skipped {_printable(item.path)}: {_printable(item.reason)}", sys.stderr)
    for note in notes:
        _say(f"instrument analyze: note: {_printable(note.path)}: {_printable(note.reason)}", sys.stderr)


def _page_and_trace(args: argparse.Namespace, report: Report) -> tuple[Path | None, Path | None] | int:
    """``--html`` and ``--merged-trace``: the files written, or the exit status of a failure (said on stderr)."""
    page: Path | None = None
    if args.html:
        try:
            page = write_html(report, args.html)
        except ImportError:
            return _error("--html needs matplotlib: pip install 'instrument-rl[analyze]'")
        except OSError as exc:
            return _error(f"cannot write {args.html}: {_reason(exc)}")
    merged: Path | None = None
    if getattr(args, "merged_trace", None):
        try:
            merged = write_merged_trace(report, args.merged_trace)
        except ValueError as exc:  # no step timeline: nothing to merge
            return _error(f"--merged-trace: {exc}")
        except OSError as exc:
            return _error(f"cannot write {args.merged_trace}: {_reason(exc)}")
    return page, merged


def _runs(args: argparse.Namespace) -> tuple[list[Run], Run | None]:
    """The runs of the directory, newest first, and the one ``--run`` picks (``None``: every one). A directory
    that cannot be read, or an unknown ``--run``, gives no runs here: the analysis then says why."""
    try:
        runs = find_runs(args.directory)
        return runs, select_run(runs, getattr(args, "run", None), args.directory)
    except (OSError, ValueError):
        return [], None


def _analysed(args: argparse.Namespace, ray: str | bool | None, chosen: Run | None) -> Report | int:
    """The analysis, or the exit status of its failure (said on stderr; nothing written)."""
    reading = _Reading(quiet=args.quiet or args.json)
    try:
        try:
            return analyze(
                args.directory,
                ranks=args.ranks,
                steps=args.steps,
                stages=args.stage,
                jobs=args.jobs,
                progress=reading,
                ray=ray,
                run=chosen or getattr(args, "run", None),  # the run found here: its manifests are not read again
                strict=True,
                details=bool(args.html),  # the page alone shows run facts and top ops
            )
        finally:
            reading.close()  # before any other line, so the display never mixes with them
    except NothingMatchedError as exc:  # no picture, no page: what was asked and what there is
        _tell_left_out(exc.skipped, ())
        _error(exc.lines[0])
        for line in exc.lines[1:]:
            _say(_printable(line), sys.stderr)
        return 2
    except (OSError, ValueError, RayUnavailableError) as exc:
        return _error(str(exc))


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument analyze`` with parsed arguments; returns the exit status."""
    ray = getattr(args, "ray", None)
    wrong = _wrong_arguments(args, ray)
    if wrong is not None:
        return _error(wrong)
    if getattr(args, "layout", None):
        return _export(args)
    runs, chosen = _runs(args)
    said = runs_line(runs, chosen)
    if said is not None:  # first: it also explains a filter that matches nothing in the newest run alone
        _say(f"instrument analyze: {_printable(said)}", sys.stderr)
    report = _analysed(args, ray, chosen)
    if isinstance(report, int):
        return report
    _tell_left_out(report.skipped, report.notes)

    png: Path | None = None
    target = Path(args.png) if args.png else Path(args.directory) / DEFAULT_PNG
    refused = None if args.no_png or args.png else _not_ours(target)
    if refused is not None:
        _say(f"instrument analyze: no picture: {_printable(refused)}", sys.stderr)
    elif not args.no_png:
        try:
            png = write_png(report, target)
        except ImportError:
            if args.png:
                return _error("--png needs matplotlib: pip install 'instrument-rl[analyze]'")
            _say("instrument analyze: no picture: matplotlib is not installed", sys.stderr)
        except OSError as exc:
            if args.png:
                return _error(f"cannot write {target}: {_reason(exc)}")
            _say(f"instrument analyze: no picture: cannot write {_printable(str(target))}: {_reason(exc)}", sys.stderr)
    written = _page_and_trace(args, report)
    if isinstance(written, int):
        return written
    page, merged = written

    if args.json:
        data = report.to_dict()
        data["png"] = None if png is None else str(png)
        data["html"] = None if page is None else str(page)
        data["merged_trace"] = None if merged is None else str(merged)
        data["runs"] = [run.to_dict(selected=chosen is None or run is chosen) for run in runs]
        _say_json(data)
    else:
        tty = sys.stdout.isatty()
        width = shutil.get_terminal_size().columns if tty else None
        no_color = os.environ.get("NO_COLOR", "") != ""  # https://no-color.org, as rich reads it
        _say(render_text(report, width=width, color=tty and not no_color))
        if png is not None:
            _say(f"picture  {png}")
        if page is not None:
            _say(f"page     {page}")
        if merged is not None:
            _say(f"trace    {merged}")
    return 1 if report.skipped else 0
