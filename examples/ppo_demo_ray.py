"""The PPO demo of ``ppo_demo.py`` with verl-style Ray worker groups (``make demo-ray``).

    python examples/ppo_demo_ray.py --config examples/demo.yaml --num-steps 4 all_ranks=true

The driver runs a local Ray cluster (unless one is up) and two worker groups of ``WORLD_SIZE`` Ray
actors: ``actor_rollout_ref`` (rollout, the actor's log-probs and PPO update, the frozen reference's
log-probs), registered a second time as ``ref`` (colocated, as in verl), and ``critic``. Each actor
configures instrument with its group's role and its rank in the group; the ranks of a group form a
gloo process group and wrap their models in ``DistributedDataParallel``, so their weights stay equal.
Every stage splits the batch over the ranks and the driver concatenates the results (verl's
data-parallel dispatch), all inside ``ProfileController.step``. The controller owns the finish hook
of ``demo.yaml``: after the last step it waits for every worker's traces, then runs the hook on the
hook's ranks of the first group only (a critic rank with the same number does not run it too).

Uses only instrument's public API. Needs ``ray``, ``torch`` and ``pyyaml``
(``pip install 'instrument-rl[ray,torch,yaml]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import attrs
import ppo_demo as demo
import ppo_workers as ppo
import ray
import torch
from ppo_demo import DEFAULT_CONFIG, DemoResult
from ppo_ray_workers import ACTOR_ROLLOUT_REF, CRITIC, ActorRolloutRefWorker, CriticWorker

import instrument as ins
from instrument.config import ProfilerConfig
from instrument.integrations.ray import ProfileController, WorkerFailure
from instrument.naming import parse_trace_name
from instrument.ranks import validate_ranks

REF = "ref"
"""The second name the ``actor_rollout_ref`` actors are registered under (colocated, driven once)."""

WORLD_SIZE = 2
"""Data-parallel ranks per worker group."""

RAY_NUM_CPUS = 2
"""CPUs of the local Ray cluster the demo starts (the actors ask for none, so it runs on 2 cores)."""


@dataclass(frozen=True)
class RayDemoResult(DemoResult):
    """A :class:`DemoResult` of the Ray demo: one manifest per worker process, and who recorded what.

    :attr:`DemoResult.manifest` is the first of :attr:`manifests`; :attr:`DemoResult.profiled_steps`
    the steps that the configuration profiles on some rank of a group.
    """

    manifests: tuple[Path, ...]
    """The ``instrument-manifest-*.jsonl`` written by the workers of this run, then the controller's (its timeline)."""
    recorded: tuple[tuple[int, str, int], ...]
    """``(step, group, rank)`` for every worker that recorded a step."""
    starts: tuple[tuple[str, int, int], ...]
    """``(group, rank, calls)``: how often the controller opened a step in each worker."""
    workers: int
    """Distinct actors the controller drove (``ref`` shares the ``actor_rollout_ref`` actors)."""
    failures: tuple[WorkerFailure, ...]
    """Workers that did not answer a control call (``ProfileController.failures``)."""
    in_sync: bool
    """Whether the ranks of each group ended with equal weights (their gradients were all-reduced)."""


# --------------------------------------------------------------------------- the driver


class _RayTrainer:
    """The driver's PPO step: split the batch over a group's ranks, call a stage, concatenate."""

    def __init__(self, actor_rollout_ref: Sequence[Any], critic: Sequence[Any], seed: int) -> None:
        self.actor_rollout_ref = list(actor_rollout_ref)
        self.critic = list(critic)
        self.generator = torch.Generator().manual_seed(seed)

    @staticmethod
    def _call(workers: Sequence[Any], method: str, *batch: torch.Tensor) -> list[Any]:
        """Rank ``r`` gets the ``r``-th part of every tensor in ``batch``; their results in rank order."""
        parts = [[t.contiguous() for t in tensor.chunk(len(workers))] for tensor in batch]
        refs = [getattr(w, method).remote(*(p[rank] for p in parts)) for rank, w in enumerate(workers)]
        return list(ray.get(refs))

    def _gather(self, workers: Sequence[Any], method: str, *batch: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._call(workers, method, *batch))

    def step(self) -> ppo.StepStats:
        """verl's order: rollout, log-probs, reference log-probs, values, advantages, critic, actor."""
        arr, critic = self.actor_rollout_ref, self.critic
        prompts = torch.randint(0, ppo.VOCAB, (ppo.BATCH, ppo.PROMPT_LEN), generator=self.generator)
        sequences = self._gather(arr, "generate_sequences", prompts)
        old_log_probs = self._gather(arr, "compute_log_prob", sequences)
        ref_log_probs = self._gather(arr, "compute_ref_log_prob", sequences)
        values = self._gather(critic, "compute_values", sequences)
        scores = ppo.scores(sequences)
        advantages, returns = ppo.advantages(scores, old_log_probs, ref_log_probs, values)
        critic_losses = self._call(critic, "update_critic", sequences, returns)
        actor_losses = self._call(arr, "update_actor", sequences, old_log_probs, advantages)
        return ppo.StepStats(
            reward=scores.mean().item(),
            actor_loss=sum(actor_losses) / len(actor_losses),
            critic_loss=sum(critic_losses) / len(critic_losses),
            kl=(old_log_probs - ref_log_probs).mean().item(),
        )


def _check_world(cfg: ProfilerConfig) -> None:
    """Refuse, before Ray starts, ranks that a group of ``WORLD_SIZE`` does not have."""
    try:
        if cfg.active and not cfg.all_ranks:
            validate_ranks(cfg.ranks, WORLD_SIZE)
        if cfg.finish_hook is not None and not cfg.finish_hook.all_ranks:
            validate_ranks(cfg.finish_hook.ranks, WORLD_SIZE, field="finish_hook.ranks")
    except ValueError as exc:
        raise ValueError(f"{exc}; each worker group of the Ray demo has {WORLD_SIZE} ranks") from None


def _runtime_env() -> dict[str, Any]:
    """Workers import ``instrument`` from where this driver does (installed or not) and these examples."""
    roots = (str(Path(ins.__file__).resolve().parents[1]), str(Path(__file__).resolve().parent))
    python_path = os.pathsep.join(p for p in (*roots, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": python_path}}


def _pairs(pairs: Sequence[tuple[str, int]]) -> str:
    groups: dict[str, list[int]] = {}
    for group, rank in pairs:
        groups.setdefault(group, []).append(rank)
    return " ".join(f"{group}[{','.join(map(str, ranks))}]" for group, ranks in groups.items())


def _sort_key(path: Path) -> tuple[int, str, int, int, str]:
    name = parse_trace_name(path.name)
    if name is None:
        return (1 << 30, "", 0, 0, path.name)
    return (name.step, name.role, name.rank, name.timestamp_ns, path.name)


def _header(cfg: ProfilerConfig, steps_total: int, profiled: Sequence[int], save_path: Path) -> list[str]:
    per_rank = ppo.BATCH // WORLD_SIZE
    lines = [
        f"ppo demo on Ray: {steps_total} steps, batch {ppo.BATCH} ({per_rank} per rank), "
        f"{ppo.NUM_MINI_BATCHES} mini-batches per update",
        f"worker groups: {ACTOR_ROLLOUT_REF} x{WORLD_SIZE} (also registered as {REF}), {CRITIC} x{WORLD_SIZE}; "
        "gloo all-reduce within each group",
    ]
    if profiled:
        mode = "discrete" if cfg.discrete else "continuous"
        ranks = "all ranks" if cfg.all_ranks else f"rank(s) {demo.listed(cfg.ranks)}"
        lines.append(
            f"profiling steps {demo.listed(profiled)} on {ranks} of each group ({cfg.tool}, {mode}) "
            f"into {demo.shown(save_path)}"
        )
    else:
        lines.append("profiling: off for this run (the configuration disables it or profiles no step of it)")
    lines += demo.later_steps_note(cfg, steps_total)
    if cfg.active and cfg.finish_hook is not None:
        hook = cfg.finish_hook
        ranks = "every rank" if hook.all_ranks else f"rank(s) {demo.listed(hook.ranks)}"
        lines.append(f"finish hook: on {ACTOR_ROLLOUT_REF} {ranks} only, once every worker's traces are saved")
    return lines


def _summary(result: RayDemoResult, cfg: ProfilerConfig) -> list[str]:
    traces = result.traces
    lines = [f"traces    {len(traces)} in {demo.shown(result.save_path)}/"]
    lines += [f"  {t.name}" for t in traces] or ["  (none)"]
    lines.append(f"manifests {len(result.manifests)} (one per worker process, and the controller's for its timeline)")
    lines += [f"  {demo.shown(m)}" for m in result.manifests]
    if result.archive is not None:
        lines.append(f"archive   {demo.shown(result.archive)} (written by the finish hook)")
    elif cfg.active and cfg.finish_hook is not None:
        lines.append(f"archive   (no new {demo.ARCHIVE_NAME} next to save_path: the hook writes elsewhere or failed)")
    # The step timeline, metrics, triggers and on-demand profiling need every step's boundaries on the workers.
    every = (cfg.timeline and cfg.enable) or cfg.metrics or cfg.trigger is not None or cfg.on_demand
    lines.append(f"workers   {result.workers} Ray actors driven, each once per {'step' if every else 'profiled step'}")
    sync = "equal weights" if result.in_sync else "DIFFERENT weights (the all-reduce failed)"
    lines.append(f"ranks     {sync} within each group after the last update")
    for failure in result.failures:
        lines.append(f"failure   {failure.group}[{failure.index}] {failure.call}: {failure.error}")
    if traces:
        lines.append("open a trace in https://ui.perfetto.dev or chrome://tracing (or TensorBoard / HTA)")
    return lines


def _start_groups(cfg: ProfilerConfig, seed: int, rendezvous: Path) -> tuple[list[Any], list[Any]]:
    """Create both groups' actors; each group's ranks meet at their own rendezvous file."""
    env = _runtime_env()
    arr_class: Any = ray.remote(num_cpus=0, runtime_env=env)(ActorRolloutRefWorker)
    critic_class: Any = ray.remote(num_cpus=0, runtime_env=env)(CriticWorker)
    arr = [
        arr_class.remote(cfg, rank, WORLD_SIZE, str(rendezvous / f"{ACTOR_ROLLOUT_REF}-rendezvous"), seed)
        for rank in range(WORLD_SIZE)
    ]
    critic = [
        critic_class.remote(cfg, rank, WORLD_SIZE, str(rendezvous / f"{CRITIC}-rendezvous"), seed)
        for rank in range(WORLD_SIZE)
    ]
    return arr, critic


def _stop_actors(actors: Sequence[Any]) -> None:
    """Leave the process groups and remove the actors (quietly: this runs on error paths too)."""
    with contextlib.suppress(Exception):
        ray.get([a.close.remote() for a in actors], timeout=30)
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor)


@dataclass
class _Run:
    """What the step loop collects."""

    rewards: list[float]
    recorded: list[tuple[int, str, int]]


def _train(
    ctl: ProfileController,
    trainer: _RayTrainer,
    names: Sequence[tuple[str, int]],
    cfg: ProfilerConfig,
    steps_total: int,
    say: Callable[[Sequence[str]], None],
) -> _Run:
    """The step loop: every step inside ``ctl.step``, a line per step."""
    actors = [*trainer.actor_rollout_ref, *trainer.critic]
    run = _Run(rewards=[], recorded=[])
    for step in range(1, steps_total + 1):
        started = time.perf_counter()
        with ctl.step(step, last=(step == steps_total)):
            stats = trainer.step()
        seconds = time.perf_counter() - started
        run.rewards.append(stats.reward)
        pairs: list[tuple[str, int]] = []
        if cfg.profiles_step(step):
            answers = ray.get([a.records.remote(step) for a in actors])
            pairs = [name for name, recorded in zip(names, answers, strict=True) if recorded]
        run.recorded += [(step, group, rank) for group, rank in pairs]
        say([stats.line(step, steps_total, seconds) + (f"  profiled by {_pairs(pairs)}" if pairs else "")])
    return run


def _in_sync(trainer: _RayTrainer) -> bool:
    """Whether the ranks of each group ended with the same weights (the all-reduce worked)."""
    for group in (trainer.actor_rollout_ref, trainer.critic):
        weights = ray.get([a.weights.remote() for a in group])
        if not all(torch.equal(weights[0], w) for w in weights[1:]):
            return False
    return True


def prepare(config_path: str | Path, overrides: Sequence[str], num_steps: int | None) -> tuple[ProfilerConfig, int]:
    """The configuration (``save_path`` made absolute) and step count; ``ValueError`` before Ray starts.

    Ranks outside a group of :data:`WORLD_SIZE` are refused here too.
    """
    steps_total = demo.check_steps(num_steps)
    loaded = ins.ProfilerConfig.from_file(config_path, overrides)
    cfg = attrs.evolve(loaded, save_path=str(Path(loaded.save_path).absolute()))  # workers may run elsewhere
    _check_world(cfg)
    return cfg, steps_total


def run_ray_demo(
    config_path: str | Path = DEFAULT_CONFIG,
    *,
    num_steps: int | None = None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    out: TextIO | None = None,
) -> RayDemoResult:
    """:func:`prepare` then :func:`train`: the Ray demo under ``config_path`` plus dotted ``overrides``."""
    cfg, steps_total = prepare(config_path, overrides, num_steps)
    return train(cfg, steps_total, seed=seed, out=out)


def train(cfg: ProfilerConfig, steps_total: int, *, seed: int = 0, out: TextIO | None = None) -> RayDemoResult:
    """Run the PPO demo on Ray worker groups, through a :class:`ProfileController`.

    Starts a local Ray cluster unless Ray is initialised (and shuts down only one it started),
    prints a line per step and a summary to ``out`` (default ``sys.stdout``), finishes every
    worker and removes the actors.
    """
    save_path = Path(cfg.save_path)
    profiled = tuple(
        s
        for s in range(1, steps_total + 1)
        if cfg.profiles_step(s) and any(cfg.profiles_rank(r) for r in range(WORLD_SIZE))
    )
    stream = sys.stdout if out is None else out

    def say(lines: Sequence[str]) -> None:
        for line in lines:
            print(line, file=stream, flush=True)

    say(_header(cfg, steps_total, profiled, save_path))
    began = time.time()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=RAY_NUM_CPUS, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    rendezvous = Path(tempfile.mkdtemp(prefix="instrument-demo-ray-"))
    actors: list[Any] = []
    try:
        arr, critic = _start_groups(cfg, seed, rendezvous)
        actors = [*arr, *critic]
        names = [(ACTOR_ROLLOUT_REF, r) for r in range(WORLD_SIZE)] + [(CRITIC, r) for r in range(WORLD_SIZE)]
        ray.get([a.ready.remote() for a in actors])
        cluster = "started a local cluster" if started_ray else "on the running cluster"
        say([f"ray: {cluster}, {len(actors)} workers up in {time.time() - began:.1f} s"])
        ctl = ProfileController(cfg, groups={ACTOR_ROLLOUT_REF: arr, CRITIC: critic, REF: arr})
        trainer = _RayTrainer(arr, critic, seed)
        run = _train(ctl, trainer, names, cfg, steps_total, say)
        files = sorted((Path(f).absolute() for f in ctl.finish()), key=_sort_key)
        reports = ray.get([a.report.remote() for a in actors])
        in_sync = _in_sync(trainer)
    finally:
        _stop_actors(actors)
        if started_ray:
            ray.shutdown()
        shutil.rmtree(rendezvous, ignore_errors=True)

    own = [] if ctl.manifest_path is None else [str(ctl.manifest_path)]
    manifests = tuple(p for p in (Path(m).absolute() for m in [*(m for _, m in reports), *own]) if p.is_file())
    archive = save_path.parent / demo.ARCHIVE_NAME
    fresh_archive = archive.is_file() and archive.stat().st_mtime >= began - 1
    result = RayDemoResult(
        files=tuple(files),
        save_path=save_path,
        manifest=manifests[0] if manifests else None,
        archive=archive if fresh_archive else None,
        rewards=tuple(run.rewards),
        profiled_steps=profiled,
        manifests=manifests,
        recorded=tuple(run.recorded),
        starts=tuple((group, rank, starts) for (group, rank), (starts, _) in zip(names, reports, strict=True)),
        workers=len(ctl.workers),
        failures=tuple(ctl.failures),
        in_sync=in_sync,
    )
    say(_summary(result, cfg))
    return result


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success; 1 if a profiled step left no trace or a worker failed; 2 for a bad configuration."""
    parser = argparse.ArgumentParser(prog="ppo_demo_ray.py", description="The PPO demo on Ray worker groups.")
    demo.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg, steps_total = prepare(args.config, args.overrides, args.num_steps)
    except (ValueError, TypeError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    result = train(cfg, steps_total, seed=args.seed)
    if result.profiled_steps and not result.traces:
        print(f"{parser.prog}: error: profiled steps wrote no trace", file=sys.stderr)
        return 1
    if result.failures:
        print(f"{parser.prog}: error: {len(result.failures)} worker(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
