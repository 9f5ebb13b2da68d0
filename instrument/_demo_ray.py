"""``instrument demo --ray``: the PPO demo of :mod:`instrument._demo` with verl-style Ray worker groups.

The driver (the trainer) runs a local Ray cluster, unless one is already up, and two worker groups
of ``WORLD_SIZE`` Ray actors each:

* ``actor_rollout_ref``: the fused worker (rollout generation, the actor's log-probs and PPO update,
  the frozen reference's log-probs), registered a second time as ``ref`` (colocated, as in verl);
* ``critic``: values and the critic's update.

Each actor configures instrument with its group's role and its rank in the group, and the ranks of a
group form a torch.distributed (gloo) process group: the models are wrapped in
``DistributedDataParallel``, so the ranks' gradients are all-reduced and their weights stay equal.
Every stage splits the batch: rank ``r`` works on the ``r``-th part and the driver concatenates the
results (verl's data-parallel dispatch).  Per step, inside ``ProfileController.step``, the driver
calls the stages in verl's order: ``generate_sequences``, ``compute_log_prob``,
``compute_ref_log_prob``, ``compute_values``, the advantages (on the driver), ``update_critic``,
``update_actor``.  The workers reuse the models and stage code of :mod:`instrument._demo`.

The controller owns the finish hook of ``examples/demo.yaml`` (``tar`` of ``save_path``): after the
last step it waits until every worker's traces are on disk, then runs the hook on the hook's ranks of
the first group, ``actor_rollout_ref`` (hook ranks are ranks within a group, so a critic rank with the
same number does not run it too).

Importing this module imports Ray (not torch).
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
from typing import TYPE_CHECKING, Any, TextIO

import attrs
import ray

import instrument as ins
from instrument import _demo as demo
from instrument._demo import DEFAULT_CONFIG, DEFAULT_NUM_STEPS, DemoResult
from instrument.config import ProfilerConfig
from instrument.integrations.ray import ProfileController, ProfiledWorker, WorkerFailure
from instrument.naming import parse_trace_name
from instrument.ranks import validate_ranks

if TYPE_CHECKING:
    import torch

__all__ = [
    "ACTOR_ROLLOUT_REF",
    "CRITIC",
    "REF",
    "WORLD_SIZE",
    "ActorRolloutRefWorker",
    "CriticWorker",
    "RayDemoResult",
    "main_from_args",
    "run_ray_demo",
]

ACTOR_ROLLOUT_REF = "actor_rollout_ref"
"""The fused worker group's role: rollout, actor and reference in the same actors."""

CRITIC = "critic"
"""The critic group's role."""

REF = "ref"
"""The second name the ``actor_rollout_ref`` actors are registered under (colocated, driven once)."""

WORLD_SIZE = 2
"""Data-parallel ranks per worker group."""

RAY_NUM_CPUS = 2
"""CPUs of the local Ray cluster the demo starts (the actors ask for none, so it runs on 2 cores)."""

_GROUP_SEEDS = {ACTOR_ROLLOUT_REF: 1, CRITIC: 2}
"""Per-group offsets of the sampling / shuffling seeds (every rank draws its own stream)."""


@dataclass(frozen=True)
class RayDemoResult(DemoResult):
    """A :class:`DemoResult` of the Ray demo: one manifest per worker process, and who recorded what.

    :attr:`DemoResult.manifest` is the first of :attr:`manifests`; :attr:`DemoResult.profiled_steps`
    the steps that the configuration profiles on some rank of a group.
    """

    manifests: tuple[Path, ...]
    """The ``instrument-manifest-*.jsonl`` written by the workers of this run."""
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


# --------------------------------------------------------------------------- workers (Ray actors)


class _GroupWorker(ProfiledWorker):
    """What both groups' actors share: instrument's session, the gloo group, the controller's calls."""

    def __init__(self, cfg: ProfilerConfig, *, role: str, rank: int, world_size: int, rendezvous: str) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # four actors share two cores
        self.session = ins.configure(cfg, role=role, rank=rank, world_size=world_size)
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
        self.starts = 0
        self.recorded: list[int] = []

    def start_profile(self, step: int) -> bool:
        """Count the controller's calls and remember the steps this worker records."""
        self.starts += 1
        recording = super().start_profile(step)
        if recording:
            self.recorded.append(step)
        return recording

    def ready(self) -> bool:
        """Answers once the actor is constructed (its process group is up)."""
        return True

    def records(self, step: int) -> bool:
        """Whether this worker recorded step ``step``."""
        return step in self.recorded

    def report(self) -> tuple[int, str]:
        """``(start_profile calls, this process's manifest path)``."""
        return self.starts, str(self.session.manifest_path)

    def weights(self) -> torch.Tensor:
        """This rank's trained weights, flattened (equal on every rank of a group)."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class ActorRolloutRefWorker(_GroupWorker):
    """verl's fused worker: rollout, actor and reference share one process and the policy's weights."""

    def __init__(self, cfg: ProfilerConfig, rank: int, world_size: int, rendezvous: str, seed: int) -> None:
        super().__init__(cfg, role=ACTOR_ROLLOUT_REF, rank=rank, world_size=world_size, rendezvous=rendezvous)
        import torch
        from torch.nn.parallel import DistributedDataParallel

        policy, reference, _ = demo._init_models(torch.Generator().manual_seed(seed))  # equal on every rank
        generator = torch.Generator().manual_seed(_rank_seed(seed, ACTOR_ROLLOUT_REF, rank))
        self.rollout = demo.RolloutWorker(policy, generator)
        self.actor = demo.ActorWorker(DistributedDataParallel(policy), generator)  # gradients all-reduced
        self.ref = demo.RefWorker(reference)

    def weights(self) -> torch.Tensor:
        """The policy's weights."""
        return _flat(self.rollout.policy)

    def generate_sequences(self, prompts: torch.Tensor) -> torch.Tensor:
        """This rank's part of the prompts, with sampled responses appended."""
        return self.rollout.generate_sequences(prompts)

    def compute_log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """The policy's log-probs of this rank's responses."""
        return self.actor.compute_log_prob(sequences)

    def compute_ref_log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """The reference's log-probs of this rank's responses."""
        return self.ref.compute_ref_log_prob(sequences)

    def update_actor(self, sequences: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor) -> float:
        """PPO over this rank's part of the batch, in ``NUM_MINI_BATCHES`` mini-batches; the mean loss."""
        return self.actor.update_actor(sequences, old_log_probs, advantages)


class CriticWorker(_GroupWorker):
    """The value model, data-parallel over the group."""

    def __init__(self, cfg: ProfilerConfig, rank: int, world_size: int, rendezvous: str, seed: int) -> None:
        super().__init__(cfg, role=CRITIC, rank=rank, world_size=world_size, rendezvous=rendezvous)
        import torch
        from torch.nn.parallel import DistributedDataParallel

        _, _, critic = demo._init_models(torch.Generator().manual_seed(seed))
        generator = torch.Generator().manual_seed(_rank_seed(seed, CRITIC, rank))
        self.critic = demo.CriticWorker(DistributedDataParallel(critic), generator)

    def weights(self) -> torch.Tensor:
        """The critic's weights."""
        return _flat(self.critic.critic)

    def compute_values(self, sequences: torch.Tensor) -> torch.Tensor:
        """Values of this rank's sequences."""
        return self.critic.compute_values(sequences)

    def update_critic(self, sequences: torch.Tensor, returns: torch.Tensor) -> float:
        """Regression on this rank's returns, in ``NUM_MINI_BATCHES`` mini-batches; the mean loss."""
        return self.critic.update_critic(sequences, returns)


def _rank_seed(seed: int, group: str, rank: int) -> int:
    return seed * 1_000 + 100 * _GROUP_SEEDS[group] + rank


def _flat(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat([p.detach().flatten() for p in model.parameters()])


# --------------------------------------------------------------------------- the driver


class _RayTrainer:
    """The driver's PPO step: split the batch over a group's ranks, call a stage, concatenate."""

    def __init__(self, actor_rollout_ref: Sequence[Any], critic: Sequence[Any], seed: int) -> None:
        import torch

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
        import torch

        return torch.cat(self._call(workers, method, *batch))

    def step(self) -> demo._StepStats:
        """verl's order: rollout, log-probs, reference log-probs, values, advantages, critic, actor."""
        import torch

        arr, critic = self.actor_rollout_ref, self.critic
        prompts = torch.randint(0, demo.VOCAB, (demo.BATCH, demo.PROMPT_LEN), generator=self.generator)
        sequences = self._gather(arr, "generate_sequences", prompts)
        old_log_probs = self._gather(arr, "compute_log_prob", sequences)
        ref_log_probs = self._gather(arr, "compute_ref_log_prob", sequences)
        values = self._gather(critic, "compute_values", sequences)
        scores = demo._scores(sequences)
        advantages, returns = demo._advantages(scores, old_log_probs, ref_log_probs, values)
        critic_losses = self._call(critic, "update_critic", sequences, returns)
        actor_losses = self._call(arr, "update_actor", sequences, old_log_probs, advantages)
        return demo._StepStats(
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
    """Workers import ``instrument`` from where this driver does, installed or not."""
    root = str(Path(ins.__file__).resolve().parents[1])
    python_path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
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
    per_rank = demo.BATCH // WORLD_SIZE
    lines = [
        f"instrument demo --ray: PPO on Ray, {steps_total} steps, batch {demo.BATCH} ({per_rank} per rank), "
        f"{demo.NUM_MINI_BATCHES} mini-batches per update",
        f"worker groups: {ACTOR_ROLLOUT_REF} x{WORLD_SIZE} (also registered as {REF}), {CRITIC} x{WORLD_SIZE}; "
        "gloo all-reduce within each group",
    ]
    if profiled:
        mode = "discrete" if cfg.discrete else "continuous"
        ranks = "all ranks" if cfg.all_ranks else f"rank(s) {demo._list(cfg.ranks)}"
        lines.append(
            f"profiling steps {demo._list(profiled)} on {ranks} of each group ({cfg.tool}, {mode}) "
            f"into {demo._shown(save_path)}"
        )
    else:
        lines.append("profiling: off for this run (the configuration disables it or profiles no step of it)")
    if cfg.active and cfg.steps is not None and max(cfg.steps) > steps_total:
        later = [s for s in cfg.steps if s > steps_total]
        lines.append(f"note: configured step(s) {demo._list(later)} lie beyond step {steps_total} and are not profiled")
    if cfg.active and cfg.finish_hook is not None:
        hook = cfg.finish_hook
        ranks = "every rank" if hook.all_ranks else f"rank(s) {demo._list(hook.ranks)}"
        lines.append(f"finish hook: on {ACTOR_ROLLOUT_REF} {ranks} only, once every worker's traces are saved")
    return lines


def _summary(result: RayDemoResult, cfg: ProfilerConfig) -> list[str]:
    traces = result.traces
    lines = [f"traces    {len(traces)} in {demo._shown(result.save_path)}/"]
    lines += [f"  {t.name}" for t in traces] or ["  (none)"]
    lines.append(f"manifests {len(result.manifests)} (one per worker process that saved a trace)")
    lines += [f"  {demo._shown(m)}" for m in result.manifests]
    if result.archive is not None:
        lines.append(f"archive   {demo._shown(result.archive)} (written by the finish hook)")
    elif cfg.active and cfg.finish_hook is not None:
        lines.append(f"archive   (no new {demo.ARCHIVE_NAME} next to save_path: the hook writes elsewhere or failed)")
    lines.append(f"workers   {result.workers} Ray actors driven, each once per profiled step")
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
        say(
            [
                f"step {step}/{steps_total}  reward {stats.reward:.3f}  actor_loss {stats.actor_loss:+.4f}  "
                f"critic_loss {stats.critic_loss:.4f}  kl {stats.kl:+.4f}  {seconds:5.2f} s"
                + (f"  profiled by {_pairs(pairs)}" if pairs else "")
            ]
        )
    return run


def _in_sync(trainer: _RayTrainer) -> bool:
    """Whether the ranks of each group ended with the same weights (the all-reduce worked)."""
    import torch

    for group in (trainer.actor_rollout_ref, trainer.critic):
        weights = ray.get([a.weights.remote() for a in group])
        if not all(torch.equal(weights[0], w) for w in weights[1:]):
            return False
    return True


def run_ray_demo(
    config_path: str | Path | None = DEFAULT_CONFIG,
    *,
    num_steps: int | None = None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    out: TextIO | None = None,
) -> RayDemoResult:
    """Run the PPO demo on Ray worker groups under the profiling setup of ``config_path`` (plus ``overrides``).

    Starts a local Ray cluster unless Ray is initialised (and shuts down only one it started), runs
    ``num_steps`` RL steps (default :data:`DEFAULT_NUM_STEPS`) through a :class:`ProfileController`,
    prints a line per step and a summary to ``out`` (default: ``sys.stdout`` at call time), finishes
    every worker and removes the actors.  ``save_path`` is made absolute before the workers see it.
    Raises ``ValueError`` for a bad step count or configuration (ranks outside a group of
    :data:`WORLD_SIZE` included) before Ray starts.
    """
    from instrument.cli import load_config  # here, not at the top: instrument.cli imports the demos

    steps_total = DEFAULT_NUM_STEPS if num_steps is None else num_steps
    if isinstance(steps_total, bool) or not isinstance(steps_total, int) or steps_total < 1:
        raise ValueError(f"'num_steps' must be an int >= 1: {num_steps!r}")
    loaded = load_config(config_path, overrides)
    save_path = Path(loaded.save_path).absolute()
    cfg = attrs.evolve(loaded, save_path=str(save_path))  # Ray workers need not share our working directory
    _check_world(cfg)
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

    manifests = tuple(p for p in (Path(m).absolute() for _, m in reports) if p.is_file())
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


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument demo --ray`` with the arguments of ``_demo.add_arguments``.

    0 on success; 1 if a profiled step left no trace or a worker failed a control call.
    """
    config = Path(args.config)
    if args.config == DEFAULT_CONFIG and not config.exists():
        packaged = Path(__file__).resolve().parents[1] / DEFAULT_CONFIG  # a source checkout, run from elsewhere
        if packaged.exists():
            config = packaged
    result = run_ray_demo(config, num_steps=args.num_steps, overrides=args.overrides, seed=args.seed)
    if result.profiled_steps and not result.traces:
        print("instrument demo --ray: error: profiled steps wrote no trace", file=sys.stderr)
        return 1
    if result.failures:
        print(f"instrument demo --ray: error: {len(result.failures)} worker(s) failed", file=sys.stderr)
        return 1
    return 0
