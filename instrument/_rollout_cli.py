"""``instrument rollout launch-args|start|stop|status``: the command line over :mod:`instrument._rollout`.

``launch-args`` prints what to add to an engine's launch; ``start`` / ``stop`` / ``status`` call
every worker (from a router's ``/workers`` or ``--worker-url``) and print one row each. ``start``
leaves a marker per worker (:mod:`instrument._rollout_files`) so that ``stop`` can say "not
profiling" for a worker it never started and relocate only what was written since the start.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from typing import Any

from instrument import _rollout, _rollout_files
from instrument._cli_config import load_config
from instrument._rollout import WorkerOutcome

__all__ = ["EPILOG", "add_arguments", "main_from_args"]

EPILOG = """\
examples:
  instrument rollout launch-args --config profile.yaml --profiler-dir /scratch/vllm-prof --replica 0
  instrument rollout start --router-url http://127.0.0.1:30000 --step 3
  instrument rollout stop --router-url http://127.0.0.1:30000 --step 3 \\
      --save-path outputs/profile --profiler-dir /scratch/vllm-prof --config profile.yaml
  instrument rollout status --worker-url http://10.0.0.5:8000 --worker-url http://10.0.0.6:8000

Exit status: 0 every worker ok (and every trace relocated); 1 a worker failed, is still flushing,
or a trace could not be relocated; 2 bad arguments or configuration, an unreachable or broken
router, or a URL that is not http(s)://host:port, with one line saying which.
"""


def _common(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--router-url", metavar="URL", help="a router answering GET /workers (vllm-router, sglang)")
    source.add_argument("--worker-url", metavar="URL", action="append", help="a vLLM server; repeat it")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds per call (default 10)")
    parser.add_argument(
        "--stop-timeout", type=float, default=600.0, metavar="S", help="seconds a stop may take to flush (default 600)"
    )
    parser.add_argument("--concurrency", type=int, default=16, metavar="N", help="workers called at once (default 16)")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where start leaves its markers for stop (default $XDG_STATE_HOME/instrument/rollout)",
    )
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress (it is only ever drawn on a terminal)")


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. all_ranks=true")
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON configuration file (docs/config.md)")


def add_arguments(rollout: argparse.ArgumentParser) -> None:
    """The ``rollout`` subcommands and their options."""
    actions = rollout.add_subparsers(dest="action", required=True, metavar="ACTION")
    launch = actions.add_parser(
        "launch-args",
        help="print the launch arguments that give a vLLM server its profiler",
        description=(
            "Print what to add to a vLLM server's launch for one replica: '--profiler-config <json>' for "
            "vLLM >= 0.13 (only fields that version knows), else VAR=value environment assignments. The "
            "version is the installed vLLM's unless --vllm-version is given."
        ),
    )
    _config_args(launch)
    launch.add_argument("--profiler-dir", required=True, metavar="BASE", help="engines write into BASE/replicaN")
    launch.add_argument("--replica", type=int, default=0, metavar="N", help="the replica this server is (default 0)")
    launch.add_argument("--vllm-version", metavar="V", help="the engine's vLLM version, e.g. 0.14.0")
    launch.add_argument("--json", action="store_true", help="print args, env and the version as JSON")

    raw = argparse.RawDescriptionHelpFormatter
    start = actions.add_parser("start", help="POST /start_profile to every worker", epilog=EPILOG, formatter_class=raw)
    _common(start)
    start.add_argument(
        "--prefix", help="profile_prefix (default step{S} with --step); vLLM >= 0.32 names files with it"
    )
    start.add_argument("--step", type=int, metavar="S", help="the RL step: the prefix becomes step{S}")

    stop = actions.add_parser(
        "stop",
        help="POST /stop_profile to every worker (waits for the flush), then relocate with --save-path",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(stop)
    _config_args(stop)
    stop.add_argument("--save-path", metavar="DIR", help="move this step's engine traces into DIR (needs --step)")
    stop.add_argument("--step", type=int, metavar="S", help="the RL step the traces belong to")
    stop.add_argument("--profiler-dir", metavar="BASE", help="the engines' BASE (as given to launch-args)")
    stop.add_argument("--gpus-per-replica", type=int, default=1, metavar="G", help="tp x pp x dp (default 1)")
    stop.add_argument("--world-size", type=int, metavar="W", help="global GPU ranks (default: workers x G)")

    status = actions.add_parser(
        "status", help="which workers have profiling routes", epilog=EPILOG, formatter_class=raw
    )
    _common(status)


# --------------------------------------------------------------------------- launch-args


def _launch_args(args: argparse.Namespace) -> int:
    from instrument.backends.vllm import installed_vllm_version, profiler_launch_args, replica_profiler_dir

    config = load_config(args.config, args.overrides)
    version, source = args.vllm_version, "given"
    if version is None:
        version = installed_vllm_version()
        source = "installed" if version is not None else "none installed here: the newest behaviour"
    directory = replica_profiler_dir(args.profiler_dir, args.replica)
    launch = profiler_launch_args(config, profiler_dir=directory, vllm_version=version)
    words = [f"{key}={value}" for key, value in launch.env.items()] + list(launch.args)
    if args.json:
        payload = {"vllm_version": version, "version_source": source, "profiler_dir": directory}
        payload.update(args=list(launch.args), env=dict(launch.env), dropped=list(launch.dropped))
        print(json.dumps(payload, indent=2))
        return 0
    where = "put them before the command" if launch.env else "put them after 'vllm serve MODEL'"
    print(f"# vLLM {version or '(newest)'} ({source}); {where}; the profiler writes into {directory}", file=sys.stderr)
    print(shlex.join(words))
    return 0


# --------------------------------------------------------------------------- start / stop / status


def _workers(args: argparse.Namespace) -> list[tuple[str, bool]]:
    from instrument._http import check_http_url

    if args.router_url:
        return _rollout.list_router_workers(args.router_url, timeout_s=args.timeout)
    return [(check_http_url(url, "worker URL"), True) for url in args.worker_url]


def _check_relocation(args: argparse.Namespace, workers: int) -> tuple[Any, int] | None:
    """The configuration and world size for the stop's relocation, checked before anything is stopped."""
    if args.save_path is None:
        for name in ("profiler_dir", "config"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} is only used with --save-path (relocation)")
        return None
    missing = [f"--{n.replace('_', '-')}" for n in ("step", "profiler_dir") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"--save-path needs {' and '.join(missing)} (which step, and the engines' BASE)")
    if args.step < 1:
        raise ValueError(f"--step must be >= 1 (steps count from 1): {args.step}")
    if args.gpus_per_replica < 1:
        raise ValueError(f"--gpus-per-replica must be >= 1: {args.gpus_per_replica}")
    world = args.world_size if args.world_size is not None else workers * args.gpus_per_replica
    if world < 1 or world % args.gpus_per_replica:
        raise ValueError(f"--world-size must be a positive multiple of --gpus-per-replica: {world}")
    from instrument import ranks

    config = load_config(args.config, args.overrides)
    if not config.all_ranks:
        ranks.validate_ranks(config.ranks, world)
    return config, world


def _restarted_detail(outcome: WorkerOutcome, earlier: _rollout_files.StartMarker | None) -> WorkerOutcome:
    if earlier is None:
        detail = "was profiling (not started from here): restarted; its earlier traces flushed under their own prefix"
    else:
        named = f"{earlier.prefix}_*" if earlier.prefix else "files without a prefix"
        detail = f"was profiling since {earlier.clock()}: restarted; earlier traces flushed as {named}"
    return replace(outcome, detail=detail)


def _record_starts(
    outcomes: list[WorkerOutcome], store: _rollout_files.MarkerStore, prefix: str | None, started_ns: int
) -> list[WorkerOutcome]:
    recorded = []
    for outcome in outcomes:
        shown = outcome
        if outcome.state in ("profiling", "restarted"):
            earlier = store.read(outcome.url)
            if outcome.state == "restarted":
                shown = _restarted_detail(outcome, earlier)
            try:
                store.write(_rollout_files.StartMarker(outcome.url, prefix, started_ns))
            except OSError as exc:
                shown = replace(shown, detail=f"{shown.detail}; start not recorded ({exc})")
        recorded.append(shown)
    return recorded


def _status_detail(outcomes: list[WorkerOutcome], store: _rollout_files.MarkerStore) -> list[WorkerOutcome]:
    shown = []
    for outcome in outcomes:
        marker = store.read(outcome.url) if outcome.state == "routes" else None
        if marker is None:
            shown.append(outcome)
            continue
        prefix = f", prefix {marker.prefix}" if marker.prefix else ""
        shown.append(replace(outcome, detail=f"{outcome.detail}; started here at {marker.clock()}{prefix}"))
    return shown


def _relocate(
    args: argparse.Namespace,
    plan: tuple[Any, int],
    outcomes: list[WorkerOutcome],
    markers: dict[str, _rollout_files.StartMarker],
    stop_began_ns: int,
) -> tuple[list[_rollout_files.ReplicaMove], list[str]]:
    """Relocate after the stop; the moves and the lines to print."""
    config, world = plan
    still = [o.url for o in outcomes if o.state == "still-flushing"]
    if still:
        return [], [
            f"relocation skipped: {len(still)} worker(s) still flushing; run the same stop again once they are done"
        ]
    starts = [markers[o.url].started_ns for o in outcomes if o.state == "flushed" and o.url in markers]
    since_ns = min(starts) if starts else stop_began_ns  # without a start: what this stop flushed
    try:
        moves = _rollout_files.relocate_replicas(
            args.profiler_dir,
            save_path=args.save_path,
            step=args.step,
            config=config,
            gpus_per_replica=args.gpus_per_replica,
            world_size=world,
            since_ns=since_ns,
        )
    except FileNotFoundError:
        return [], [f"relocation FAILED: {args.profiler_dir} does not exist (vLLM makes replicaN there at the stop)"]
    except OSError as exc:
        return [], [f"relocation FAILED: cannot list {args.profiler_dir}: {exc}"]
    lines = _rollout_files.summary(moves, args.save_path)
    if not moves:
        lines.append(f"no replicaN directory in {args.profiler_dir}: were the engines launched with launch-args?")
    return moves, lines


def _fan_out(args: argparse.Namespace) -> int:
    workers = _workers(args)
    relocation = _check_relocation(args, len(workers)) if args.action == "stop" else None
    prefix = getattr(args, "prefix", None)
    if args.action == "start":
        if args.step is not None and args.step < 1:
            raise ValueError(f"--step must be >= 1 (steps count from 1): {args.step}")
        prefix = prefix or (f"step{args.step}" if args.step is not None else None)
    store = _rollout_files.MarkerStore(args.state_dir)
    healthy = [url for url, ok in workers if ok]
    markers = {url: m for url in healthy if (m := store.read(url)) is not None}
    began_ns = time.time_ns()
    with _rollout.EngineProgress(args.action, quiet=args.quiet or args.json) as progress:
        outcomes = _rollout.fan_out(
            args.action,
            healthy,
            prefix=prefix,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            stop_timeout_s=args.stop_timeout,
            progress=progress,
            started=set(markers) if args.action == "stop" else None,
        )
    if args.action == "start":
        outcomes = _record_starts(outcomes, store, prefix, began_ns)
    elif args.action == "status":
        outcomes = _status_detail(outcomes, store)
    outcomes += [
        WorkerOutcome(url, False, "the router reports it unhealthy: not contacted", 0.0, "unhealthy")
        for url, ok in workers
        if not ok
    ]
    moves: list[_rollout_files.ReplicaMove] = []
    lines: list[str] = []
    if relocation is not None:
        moves, lines = _relocate(args, relocation, outcomes, markers, began_ns)
    if args.action == "stop":
        for outcome in outcomes:  # the start is over once its traces are flushed (and relocated)
            if outcome.state == "flushed":
                store.remove(outcome.url)
    relocation_failed = any(line.startswith("relocation FAILED") for line in lines)
    if args.json:
        payload: dict[str, Any] = {"workers": [asdict(o) for o in outcomes]}
        if relocation is not None:
            payload["relocation"] = {"replicas": [asdict(m) for m in moves], "notes": lines}
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join([_rollout.render_table(outcomes), *lines]))
    return 0 if all(o.ok for o in outcomes) and not relocation_failed else 1


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument rollout ACTION`` from parsed arguments; the exit status."""
    if args.action == "launch-args":
        return _launch_args(args)
    return _fan_out(args)
