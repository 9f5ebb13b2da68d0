"""``instrument compare BASELINE CANDIDATE``: the findings and tables, ``--json``, ``--html``.

Exit status: 0 compared, 1 compared but some file was skipped by an analysis (one stderr line each), 2 bad
arguments or input — a missing path, a run with no trace and no timeline, a JSON that is no analysis — or an
output that could not be written: one line on stderr, never a traceback.  Of a save_path holding several
runs the newest is compared (as ``instrument analyze`` reads it; ``instrument analyze DIR --run ID --json``
makes an input of another one).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from instrument.analyze._cli import add_filters
from instrument.analyze._compare_runs import compare
from instrument.analyze.analyzers._compare_stats import MIN_CHANGE_PCT
from instrument.analyze.render._compare import render_compare_text, write_compare_html

__all__ = ["add_arguments", "main_from_args"]

_EPILOG = """\
examples:
  instrument compare outputs/last-week/profile outputs/profile
  instrument compare base/profile cand/profile --stage update_actor --steps 3-20 --min-change 10
  instrument compare base.json cand.json          # two `instrument analyze --json` outputs
  instrument compare base/profile cand/profile --json > diff.json

Of a directory holding several runs the newest is compared; for another one:
  instrument analyze cand/profile --run ID --json > cand.json

Exit status: 0 compared, 1 some file skipped (named on stderr), 2 bad arguments or input.
"""


def _pct(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (e.g. 5 or 2.5)") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--min-change must be a percentage >= 0: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``instrument compare``."""
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for name, what in (("baseline", "the run compared against"), ("candidate", "the run that may have changed")):
        parser.add_argument(
            name, metavar=name.upper(), help=f"{what}: a save_path, or the --json output of instrument analyze"
        )
    add_filters(parser)
    parser.add_argument(
        "--min-change",
        type=_pct,
        default=MIN_CHANGE_PCT,
        metavar="PCT",
        help=f"report a change beyond noise only from this size, in %% (default {MIN_CHANGE_PCT:g})",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of the text")
    parser.add_argument("--html", metavar="PATH", help="also write one self-contained HTML page")
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="processes reading files (default: CPUs up to 8 for large sets)"
    )


def _printable(text: str) -> str:
    """``text`` with newlines, terminal escapes and undecodable bytes written as Python escapes (names come
    from directories we do not trust)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _say(text: str, stream: TextIO | None = None) -> None:
    out = sys.stdout if stream is None else stream
    encoding = getattr(out, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding, "replace"), file=out)


def _error(message: str) -> int:
    _say(f"instrument compare: error: {_printable(message)}", sys.stderr)
    return 2


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument compare`` with parsed arguments; returns the exit status."""
    if args.jobs is not None and args.jobs < 1:
        return _error(f"--jobs must be >= 1: {args.jobs}")
    try:
        comparison = compare(
            args.baseline,
            args.candidate,
            ranks=args.ranks,
            steps=args.steps,
            stages=args.stage,
            min_change_pct=args.min_change,
            jobs=args.jobs,
        )
    except (OSError, ValueError) as exc:
        return _error(str(exc))
    for path, reason in comparison.skipped:
        _say(f"instrument compare: skipped {_printable(path)}: {_printable(reason)}", sys.stderr)
    page = None
    if args.html:
        try:
            page = write_compare_html(comparison, args.html)
        except OSError as exc:
            return _error(f"cannot write {args.html}: {exc.strerror or exc}")
    if args.json:
        data = comparison.to_dict()
        data["html"] = None if page is None else str(page)
        _say(json.dumps(data, indent=2))
    else:
        _say(render_compare_text(comparison))
        if page is not None:
            _say(f"page     {page}")
    return 1 if comparison.skipped else 0
