"""The ``instrument`` command line: ``plan``, ``rollout`` (:mod:`instrument.rollout._cli`), ``analyze``, ``compare``.

The demos live in ``examples/``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from collections.abc import Sequence
from typing import Any

from instrument._shipped import doc_page, doc_pages, example, examples, for_reading
from instrument._version import __version__
from instrument.config._cli import load_config
from instrument.plan import RunPlan, StageSpec, count, int_runs, plan_run
from instrument.schedule import Window

__all__ = ["load_config", "main"]

_PLAN_EPILOG = """\
examples:
  instrument plan --num-steps 10 --world-size 8 --mini-batches 6 steps=[2,5] \\
      schedule.warmup=1 schedule.active=2 --stage compute_log_prob --stage update_actor:scheduled
  instrument plan --example verl_ppo --num-steps 4 --world-size 16 ranks=[0,8]
  instrument plan --config my_profile.yaml --num-steps 4

Overrides use the keys of `instrument docs config` (verl's keys work too) and are applied after the
configuration file. Exit status: 0 planned, 1 warnings with --strict, 2 bad configuration or arguments.
"""

_DOCS_EPILOG = """examples:
  instrument docs                 # the pages
  instrument docs quickstart      # one page, as Markdown
  instrument docs config | less
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="instrument",
        description="Profile distributed LLM RL training.",
        epilog="Documentation: instrument docs [PAGE] (the pages ship with the package).",
    )
    parser.add_argument("--version", action="version", version=f"instrument {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = commands.add_parser(
        "plan",
        help="print which steps, ranks, stages and mini-batch windows a configuration records",
        description=(
            "Print which steps, ranks, stages and mini-batch windows a configuration records and the "
            "file names that will be written, with a warning for every window that can never complete."
        ),
        epilog=_PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. schedule.active=2")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help="YAML or JSON configuration file")
    source.add_argument(
        "--example",
        metavar="NAME",
        help=f"a configuration shipped with instrument instead of --config: {', '.join(examples()) or 'none'}",
    )
    plan.add_argument("--num-steps", type=int, required=True, metavar="N", help="RL steps in the run")
    plan.add_argument("--world-size", type=int, default=1, metavar="W", help="global ranks (default 1)")
    plan.add_argument(
        "--mini-batches", type=int, default=1, metavar="M", help="profile_window calls per scheduled stage"
    )
    plan.add_argument("--role", default="actor", help="role of the worker (default actor)")
    plan.add_argument(
        "--stage",
        action="append",
        metavar="[ROLE:]NAME[:scheduled]",
        help="a stage of the worker; ROLE: the stage's own role, as profiled_stage(NAME, role=ROLE) names it; "
        "repeat it (default: update_actor:scheduled)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--strict", action="store_true", help="exit 1 when the plan has warnings")
    from instrument.rollout import _cli as _rollout_cli

    rollout = commands.add_parser(
        "rollout",
        help="launch arguments for vLLM / SGLang servers; start, stop (and relocate) or check their profilers",
        description=(
            "launch-args prints a vLLM server's profiler arguments (an SGLang server's environment with "
            "--engine sglang); start / stop / status call every healthy "
            "server listed by a router's /workers (or given with --worker-url), a few at a time, and print a "
            "table; stop --save-path moves this step's engine traces into save_path. docs/rollout.md."
        ),
        epilog=_rollout_cli.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _rollout_cli.add_arguments(rollout)
    docs = commands.add_parser(
        "docs",
        help="print a page of the documentation (shipped with the package), or list them",
        description="Print a documentation page as Markdown; without PAGE, list the pages.",
        epilog=_DOCS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    docs.add_argument("page", nargs="?", metavar="PAGE", help="a page name, e.g. config or quickstart")
    from instrument.analyze import _cli as analyze_cli  # standard library only: no rich, matplotlib or torch

    analyze = commands.add_parser(
        "analyze",
        help="read the traces of a save_path: stage times per step and rank, stragglers, a PNG and HTML",
        description="Read every trace of a save_path (streaming) and report stage times across ranks and steps.",
    )
    analyze_cli.add_arguments(analyze)
    from instrument.analyze import _compare_cli as compare_cli

    compare = commands.add_parser(
        "compare",
        help="compare two runs: what got slower beyond the noise, down to the ops and kernels",
        description="Compare a candidate run against a baseline (two save_paths or two analyze --json outputs).",
    )
    compare_cli.add_arguments(compare)
    return parser


# --json lists at most this many steps, ranks, windows and files; the counts and the
# ``*_ranges`` fields always describe everything, and ``truncated`` names the lists cut short.
_JSON_LIST_LIMIT = 10_000
# The text lists every window and file up to this many, else the first few and "... N more".
_TEXT_LIST_LIMIT = 12
_TEXT_SHOWN = 10
_TEXT_RUNS = 24


def _plan_json(run: RunPlan) -> dict[str, Any]:
    limit = _JSON_LIST_LIMIT
    lists: dict[str, Sequence[Any]] = {
        "steps": run.steps,
        "ranks": run.ranks,
        "windows": run.windows,
        "finish_hook_ranks": run.finish_ranks,
        "files": run.traces,
    }
    truncated = [name for name, values in lists.items() if count(values) > limit]
    return {
        "config": run.config.to_dict(),
        "role": run.role,
        "num_steps": run.num_steps,
        "world_size": run.world_size,
        "num_mini_batches": run.num_mini_batches,
        "stages": [{"name": s.name, "scheduled": s.scheduled, "role": s.role or run.role} for s in run.stages],
        "steps": list(run.steps[:limit]),
        "ranks": list(run.ranks[:limit]),
        "windows": [{"first": w.first, "last": w.last, "partial": w.partial} for w in run.windows[:limit]],
        "finish_hook_ranks": list(run.finish_ranks[:limit]),
        "files": [t.pattern for t in run.traces[:limit]],
        "warnings": list(run.warnings),
        "step_ranges": [list(r) for r in int_runs(run.steps)],
        "rank_ranges": [list(r) for r in int_runs(run.ranks)],
        "finish_hook_rank_ranges": [list(r) for r in int_runs(run.finish_ranks)],
        "counts": {
            "steps": count(run.steps),
            "ranks": count(run.ranks),
            "windows": run.windows.total,
            "files": run.traces.total,
            "files_per_rank": run.traces.per_rank,
        },
        "truncated": truncated,
    }


def _ranges(values: Sequence[int]) -> str:
    """``0,1,2,5`` -> ``0-2, 5``; a ``range`` at O(1) cost; past 24 runs the first 20 and a count."""
    runs = int_runs(values)
    if not runs:
        return "none"
    shown = runs if len(runs) <= _TEXT_RUNS else runs[: _TEXT_RUNS - 4]
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in shown)
    return text if len(shown) == len(runs) else f"{text}, ... and {len(runs) - len(shown)} more runs"


def _windows_text(run: RunPlan) -> str:
    def name(w: Window) -> str:
        return f"mb{w.first}" + (f"-{w.last}" if w.last != w.first else "") + (" (partial)" if w.partial else "")

    windows = run.windows
    if windows.total <= _TEXT_LIST_LIMIT:
        return ", ".join(name(w) for w in windows) or "nothing recorded"
    every = f"one every {windows.cycle} mini-batch" + ("es" if windows.cycle != 1 else "")
    return (
        ", ".join(name(w) for w in windows[:_TEXT_SHOWN])
        + f", ... and {windows.total - _TEXT_SHOWN} more ({every}, the last {name(windows[-1])})"
    )


def _plan_text(run: RunPlan) -> str:
    cfg = run.config
    mode = "discrete (a trace per stage)" if cfg.discrete else "continuous (a trace per step)"
    lines = [
        f"tool {cfg.tool}, {mode}, contents {', '.join(cfg.contents) or 'cpu'}, save_path {cfg.save_path}",
        f"steps    {_ranges(run.steps)} of 1-{run.num_steps}",
        f"ranks    {_ranges(run.ranks)} of {run.world_size} ({count(run.ranks)} profiled)",
        f"role     {run.role}",
    ]
    for stage in run.stages:
        name = stage.name if stage.role is None else f"{stage.name} (role {stage.role})"
        if stage.scheduled and cfg.schedule is not None and cfg.discrete:
            lines.append(f"stage    {name}: scheduled over {run.num_mini_batches} mini-batches -> {_windows_text(run)}")
        else:
            lines.append(f"stage    {name}: recorded whole" + (" (scheduled)" if stage.scheduled else ""))
    if cfg.finish_hook is not None:
        hook = cfg.finish_hook
        when = f"after step {run.steps[-1]}" if run.steps else "at the end of the run"  # steps are sorted
        lines.append(
            f"finish   {hook.cmd!r} on ranks {_ranges(run.finish_ranks)}, {when}, timeout {hook.timeout_s:g} s"
        )
    traces = run.traces
    per_rank = traces.per_rank if run.ranks else 0
    lines.append(f"files    {traces.total} traces ({per_rank} per profiled rank) in {cfg.save_path}/:")
    shown = traces[:] if traces.total <= _TEXT_LIST_LIMIT else traces[:_TEXT_SHOWN]
    lines.extend(f"  {t.pattern}" for t in shown)
    if len(shown) < traces.total:
        listed = "all" if traces.total <= _JSON_LIST_LIMIT else f"the first {_JSON_LIST_LIMIT}"
        lines.append(f"  ... and {traces.total - len(shown)} more (--json lists {listed})")
    lines.extend(f"warning: {note}" for note in run.warnings)
    return "\n".join(lines)


def _run_docs(args: argparse.Namespace) -> int:
    if args.page is not None:
        sys.stdout.write(for_reading(doc_page(args.page)))  # without the docs tests' marks and image links
        return 0
    pages = doc_pages()
    if not pages:
        raise ValueError("no documentation pages are installed")
    for name, path in pages.items():
        title = next((line.lstrip("# ").strip() for line in path.open(encoding="utf-8") if line.startswith("#")), "")
        print(f"{name:<14} {title}")
    print("\ninstrument docs PAGE prints one.")
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    stages = tuple(StageSpec.parse(s) for s in (args.stage or ["update_actor:scheduled"]))
    config = load_config(example(args.example) if args.example else args.config, args.overrides)
    run = plan_run(
        config,
        num_steps=args.num_steps,
        world_size=args.world_size,
        num_mini_batches=args.mini_batches,
        role=args.role,
        stages=stages,
    )
    print(json.dumps(_plan_json(run), indent=2) if args.json else _plan_text(run))
    return 1 if args.strict and run.warnings else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``instrument`` console script; returns the exit status.

    A reader that stops early (``instrument compare A B | head -3``) ends any command quietly, with 0.
    """
    try:
        try:
            return _command(argv)
        finally:  # argparse's --help exits too
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit, where it could only be printed
    except BrokenPipeError as exc:
        if not _reader_left():  # a socket's (rollout's servers), not stdout's: an error as any other
            print(f"instrument: error: {exc}", file=sys.stderr)
            return 2
        _stdout_to_devnull()
        return 0


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll says POLLERR on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no file behind stdout (a test's capture)
        return True  # the error came from stdout's write: its reader left


def _stdout_to_devnull() -> None:
    """What stdout still holds goes nowhere: the interpreter's flush at exit finds a file that takes it (the
    recipe of Python's signal module docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no file behind stdout: nothing is flushed to it at exit
        pass


def _command(argv: Sequence[str] | None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            return _run_plan(args)
        if args.command == "docs":
            return _run_docs(args)
        if args.command == "rollout":
            from instrument.rollout import _cli as _rollout_cli

            return _rollout_cli.main_from_args(args)
        if args.command == "analyze":
            from instrument.analyze import _cli as analyze_cli

            return analyze_cli.main_from_args(args)
        if args.command == "compare":
            from instrument.analyze import _compare_cli as compare_cli

            return compare_cli.main_from_args(args)
    except BrokenPipeError:
        raise  # main decides: stdout's reader left, or a socket broke
    except (ValueError, TypeError, OSError) as exc:
        print(f"instrument {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
