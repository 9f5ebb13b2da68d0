"""``instrument analyze DIR``: the table, ``--json``, the PNG and ``--html``.

Exit status: 0 every file was read, 1 some were skipped (one stderr line each), 2 bad arguments,
an unreadable directory or an output that could not be written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from instrument.analyze._report import analyze

__all__ = ["DEFAULT_PNG", "add_arguments", "main_from_args", "parse_int_list"]

DEFAULT_PNG = "instrument-analysis.png"
"""The picture's name inside the analysed directory unless ``--png`` names another path."""

_EPILOG = """\
examples:
  instrument analyze outputs/profile
  instrument analyze outputs/profile --ranks 0,2 --steps 2-4 --stage update_actor --html report.html
  instrument analyze outputs/profile --json > analysis.json

Exit status: 0 all files read, 1 some skipped (named on stderr), 2 bad arguments or unreadable directory.
"""


def parse_int_list(text: str) -> list[int]:
    """``"0,2,5-7"`` -> ``[0, 2, 5, 6, 7]``; raises ``argparse.ArgumentTypeError``."""
    out: list[int] = []
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
        out.extend(range(low, high + 1))
    if not out:
        raise argparse.ArgumentTypeError(f"no number in {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``instrument analyze``."""
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("directory", metavar="DIR", help="a save_path: trace files and instrument-manifest-*.jsonl")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--all-ranks", action="store_true", help="every rank (the default)")
    who.add_argument("--ranks", type=parse_int_list, metavar="LIST", help="only these global ranks, e.g. 0,2 or 0-3")
    parser.add_argument("--steps", type=parse_int_list, metavar="LIST", help="only these steps, e.g. 1,3")
    parser.add_argument(
        "--stage", action="append", metavar="NAME", help="only this stage (update_actor or update-actor); repeat it"
    )
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON instead of the table")
    parser.add_argument("--png", metavar="PATH", help=f"where the picture goes (default DIR/{DEFAULT_PNG})")
    parser.add_argument("--no-png", action="store_true", help="write no picture")
    parser.add_argument("--html", metavar="PATH", help="also write one self-contained HTML page")
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="processes reading files (default: CPUs up to 8 for large sets)"
    )


def _error(message: str) -> int:
    print(f"instrument analyze: error: {message}", file=sys.stderr)
    return 2


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument analyze`` with parsed arguments; returns the exit status."""
    if args.jobs is not None and args.jobs < 1:
        return _error(f"--jobs must be >= 1: {args.jobs}")
    if args.no_png and args.png:
        return _error("--png and --no-png contradict each other")
    try:
        report = analyze(args.directory, ranks=args.ranks, steps=args.steps, stages=args.stage, jobs=args.jobs)
    except (OSError, ValueError) as exc:
        return _error(str(exc))
    for skipped in report.skipped:
        print(f"instrument analyze: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)

    png: Path | None = None
    if not args.no_png:
        target = Path(args.png) if args.png else Path(args.directory) / DEFAULT_PNG
        try:
            png = report.write_png(target)
        except ImportError:
            if args.png:
                return _error("--png needs matplotlib: pip install 'instrument[analyze]'")
            print("instrument analyze: no picture: matplotlib is not installed", file=sys.stderr)
        except OSError as exc:
            if args.png:
                return _error(f"cannot write {target}: {exc}")
            print(f"instrument analyze: no picture: cannot write {target}: {exc}", file=sys.stderr)
    page: Path | None = None
    if args.html:
        try:
            page = report.write_html(args.html)
        except ImportError:
            return _error("--html needs matplotlib: pip install 'instrument[analyze]'")
        except OSError as exc:
            return _error(f"cannot write {args.html}: {exc}")

    if args.json:
        data = report.to_dict()
        data["png"] = None if png is None else str(png)
        data["html"] = None if page is None else str(page)
        print(json.dumps(data, indent=2))
    else:
        tty = sys.stdout.isatty()
        width = shutil.get_terminal_size().columns if tty else None
        print(report.render_text(width=width, color=tty))
        if png is not None:
            print(f"picture  {png}")
        if page is not None:
            print(f"page     {page}")
    return 1 if report.skipped else 0
