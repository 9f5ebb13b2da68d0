"""``instrument rollout launch-args|start|stop|status``: the command line over :mod:`instrument.rollout._fanout`.

``launch-args`` prints what to add to an engine's launch; ``start`` / ``stop`` / ``status`` call
every worker (from a router's ``/workers`` or ``--worker-url``) and print one row each. ``start``
leaves a marker per worker (:mod:`instrument.rollout._markers`) so that ``stop`` can say "not
profiling" for a worker it never started and relocate only what was written since the start.
``--engine`` picks a row of :data:`ENGINES` (vLLM or SGLang): its launch arguments, its driver and
its trace names; everything else is shared.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from instrument import ranks
from instrument.config import ProfilerConfig
from instrument.config._cli import load_config
from instrument.rollout import _fanout as _rollout
from instrument.rollout import _markers as _rollout_files
from instrument.rollout import sglang, vllm
from instrument.rollout._fanout import SglangWorker, WorkerOutcome
from instrument.rollout._http import check_http_url
from instrument.rollout._markers import StartMarker
from instrument.rollout._profiler import VLLM_TRACES, EngineTraces

__all__ = ["ENGINES", "EPILOG", "Engine", "add_arguments", "main_from_args"]


@dataclass(frozen=True)
class Engine:
    """What differs between engines in ``instrument rollout``: launch, driver, trace names."""

    label: str
    installed_version: Callable[[], str | None]
    launch_args: Callable[[ProfilerConfig, str, str | None], vllm.LaunchArgs]  # config, directory, version
    command: str  # the launch command its arguments go after
    worker: Callable[[str, ProfilerConfig, StartMarker | None, float, float], Any]  # a fan-out driver
    traces: EngineTraces
    prefix_joint: str  # what follows the prefix in its file names
    start_reads_config: bool  # whether a start sends the configuration (else it is fixed at launch)
    check_prefix: Callable[[str | None], object]  # ValueError naming a prefix the engine cannot take
    writes_at: str  # when the profiler directory gets its files


def _vllm_worker(
    url: str, config: ProfilerConfig, marker: StartMarker | None, timeout_s: float, stop_timeout_s: float
) -> vllm.HttpEngineDriver:
    return vllm.HttpEngineDriver(url, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)


def _sglang_worker(
    url: str, config: ProfilerConfig, marker: StartMarker | None, timeout_s: float, stop_timeout_s: float
) -> SglangWorker:
    # No output_dir: each server writes into its launch's SGLANG_TORCH_PROFILER_DIR (launch-args --replica N).
    driver = sglang.SglangHttpDriver(url, config, timeout_s=timeout_s, stop_timeout_s=stop_timeout_s)
    return SglangWorker(
        driver, started_here=marker is not None, stops_by_itself=bool(marker and marker.stops_by_itself)
    )


ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        label="vLLM",
        installed_version=vllm.installed_vllm_version,
        launch_args=lambda config, directory, version: vllm.profiler_launch_args(
            config, profiler_dir=directory, vllm_version=version
        ),
        command="vllm serve MODEL",
        worker=_vllm_worker,
        traces=VLLM_TRACES,
        prefix_joint="_",
        start_reads_config=False,
        check_prefix=lambda prefix: None,
        writes_at="vLLM makes replicaN there at the first stop",
    ),
    "sglang": Engine(
        label="SGLang",
        installed_version=sglang.installed_sglang_version,
        launch_args=lambda config, directory, version: sglang.profiler_launch_args(
            config, profiler_dir=directory, sglang_version=version
        ),
        command="python -m sglang.launch_server --model-path MODEL",
        worker=_sglang_worker,
        traces=sglang.SGLANG_TRACES,
        prefix_joint="-",
        start_reads_config=True,
        check_prefix=sglang.check_prefix,
        writes_at="SGLang writes into it at the stop",
    ),
}
"""The engines ``--engine`` picks from."""

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
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="the rollout engine (default vllm)")


def _common(parser: argparse.ArgumentParser) -> None:
    _engine(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--router-url", metavar="URL", help="a router answering GET /workers (vllm-router, sgl-router)")
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
    launch = actions.add_parser(
        "launch-args",
        help="print the launch arguments that give an engine server its profiler",
        description=(
            "Print what to add to an engine server's launch for one replica. vLLM: '--profiler-config <json>' "
            "for vLLM >= 0.13 (only fields that version knows), else VAR=value environment assignments. "
            "SGLang (--engine sglang): VAR=value environment assignments (SGLANG_TORCH_PROFILER_DIR, and what "
            "the version reads of stacks and shapes). The version is the installed engine's unless "
            "--vllm-version / --sglang-version is given."
        ),
    )
    _engine(launch)
    _config_args(launch)
    launch.add_argument("--profiler-dir", required=True, metavar="BASE", help="engines write into BASE/replicaN")
    launch.add_argument("--replica", type=int, default=0, metavar="N", help="the replica this server is (default 0)")
    launch.add_argument("--vllm-version", metavar="V", help="the engine's vLLM version, e.g. 0.14.0")
    launch.add_argument("--sglang-version", metavar="V", help="the engine's SGLang version, e.g. 0.5.23")
    launch.add_argument("--json", action="store_true", help="print args, env and the version as JSON")

    raw = argparse.RawDescriptionHelpFormatter
    start = actions.add_parser("start", help="POST /start_profile to every worker", epilog=EPILOG, formatter_class=raw)
    _common(start)
    _config_args(start)  # SGLang's start body carries the configuration; vLLM's is fixed at launch
    start.add_argument(
        "--prefix",
        help="profile_prefix (default step{S} with --step); vLLM >= 0.32 and SGLang >= 0.5.6 name files with it",
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
    engine = ENGINES[args.engine]
    given = {"vllm": args.vllm_version, "sglang": args.sglang_version}
    for name, value in given.items():
        if value is not None and name != args.engine:
            raise ValueError(f"--{name}-version is for --engine {name} (this is --engine {args.engine})")
    config = load_config(args.config, args.overrides)
    version, source = given[args.engine], "given"
    if version is None:
        version = engine.installed_version()
        source = "installed" if version is not None else "none installed here: the newest behaviour"
    directory = vllm.replica_profiler_dir(args.profiler_dir, args.replica)
    launch = engine.launch_args(config, directory, version)
    words = [f"{key}={value}" for key, value in launch.env.items()] + list(launch.args)
    if args.json:
        payload = {"engine": args.engine, f"{args.engine}_version": version, "version_source": source}
        payload.update(
            profiler_dir=directory, args=list(launch.args), env=dict(launch.env), dropped=list(launch.dropped)
        )
        print(json.dumps(payload, indent=2))
        return 0
    where = "put them before the command" if launch.env else f"put them after '{engine.command}'"
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


def _restarted_detail(outcome: WorkerOutcome, earlier: StartMarker | None, engine: Engine) -> WorkerOutcome:
    if earlier is None:
        detail = "was profiling (not started from here): restarted; its earlier traces flushed under their own prefix"
    else:
        named = f"{earlier.prefix}{engine.prefix_joint}*" if earlier.prefix else "files without a prefix"
        detail = f"was profiling since {earlier.clock()}: restarted; earlier traces flushed as {named}"
    return replace(outcome, detail=detail)


def _record_starts(
    outcomes: list[WorkerOutcome],
    store: _rollout_files.MarkerStore,
    prefix: str | None,
    started_ns: int,
    args: argparse.Namespace,
    drivers: dict[str, Any],
) -> list[WorkerOutcome]:
    recorded = []
    for outcome in outcomes:
        shown = outcome
        if outcome.state in ("profiling", "restarted"):
            earlier = store.read(outcome.url)
            if outcome.state == "restarted":
                shown = _restarted_detail(outcome, earlier, ENGINES[args.engine])
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
    try:
        moves = _rollout_files.relocate_replicas(
            args.profiler_dir,
            save_path=args.save_path,
            step=args.step,
            config=config,
            gpus_per_replica=args.gpus_per_replica,
            world_size=world,
            since_ns=since_ns,
            traces=ENGINES[args.engine].traces,
        )
    except FileNotFoundError:
        where = ENGINES[args.engine].writes_at
        return [], [f"relocation FAILED: {args.profiler_dir} does not exist ({where})"], False
    except OSError as exc:
        return [], [f"relocation FAILED: cannot list {args.profiler_dir}: {exc}"], False
    lines = _rollout_files.summary(moves, args.save_path)
    if not moves:
        lines.append(f"no replicaN directory in {args.profiler_dir}: were the engines launched with launch-args?")
    return moves, lines, not any(m.failed for m in moves)


def _start_config(args: argparse.Namespace, engine: Engine) -> ProfilerConfig:
    """The configuration the engine's drivers are built with (only SGLang's start sends it)."""
    if args.action != "start":
        return ProfilerConfig()  # a stop or status sends no configuration
    if engine.start_reads_config:
        return load_config(args.config, args.overrides)
    if args.config is not None or args.overrides:
        raise ValueError(
            f"start takes --config and KEY=VALUE only with --engine sglang: {engine.label} reads its profiler "
            "configuration at launch (instrument rollout launch-args)"
        )
    return ProfilerConfig()


def _drivers(
    args: argparse.Namespace, engine: Engine, urls: list[str], markers: dict[str, StartMarker]
) -> dict[str, Any]:
    """Each worker's driver, built before any call, so bad settings exit 2 naming the field."""
    for url, marker in markers.items():
        if marker.engine != args.engine:
            raise ValueError(
                f"{url} was started here with --engine {marker.engine} (at {marker.clock()}): "
                f"pass --engine {marker.engine}, or --state-dir elsewhere to ignore that start"
            )
    config = _start_config(args, engine)
    engine.check_prefix(getattr(args, "prefix", None))
    return {url: engine.worker(url, config, markers.get(url), args.timeout, args.stop_timeout) for url in urls}


def _fan_out(args: argparse.Namespace) -> int:
    engine = ENGINES[args.engine]
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
