"""A tiny PPO loop on the CPU, profiled by instrument the way a verl job would be (``make demo``).

    python examples/ppo_demo.py --config examples/demo.yaml --num-steps 4
    python examples/ppo_demo.py --slow-step 5            # the slow-step trigger profiles step 6
    python examples/ppo_demo.py --slow-stage generate_sequences:1.3 save_path=outputs/slow/profile
    python examples/ppo_demo.py --slow-step 5 --metrics-port 0   # stage metrics: serves /metrics, prints a scrape

One process plays a fused ``actor_rollout_ref`` worker plus a critic: every RL step it

1. generates responses to random prompts (``generate_sequences``, autoregressive sampling),
2. computes the policy's and the frozen reference model's log-probs and the critic's values
   (``compute_log_prob``, ``compute_ref_log_prob``, ``compute_values``: forward-only stages),
3. scores the responses (a toy reward: the share of response tokens below ``TARGET_BELOW``),
   turns score and KL penalty into GAE advantages, and
4. updates the critic and the actor over ``NUM_MINI_BATCHES`` mini-batches each
   (``update_critic``, ``update_actor``: scheduled stages, one ``profile_window`` per mini-batch,
   the actor with PPO's clipped loss).

The model, maths and workers are in ``ppo_workers.py``; ``ppo_demo_ray.py`` runs the same workers as
Ray actors. Both use only instrument's public API.
Needs ``torch`` and ``pyyaml`` (``pip install 'instrument-rl[torch,yaml]'``).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import attrs
import torch
from ppo_workers import (
    BATCH,
    NUM_MINI_BATCHES,
    PROMPT_LEN,
    VOCAB,
    ActorWorker,
    CriticWorker,
    RefWorker,
    RolloutWorker,
    StepStats,
    advantages,
    init_models,
    scores,
)

import instrument as ins
from instrument.naming import TRACE_SUFFIX

DEFAULT_CONFIG = Path(__file__).resolve().with_name("demo.yaml")
"""The profiling setup the demo reads unless ``--config`` names another."""

DEFAULT_NUM_STEPS = 4
ROLE = "actor_rollout_ref"
"""The role the demo process configures (one fused worker that also hosts the critic)."""

ARCHIVE_NAME = "profile-archive.tgz"
"""What ``demo.yaml``'s finish hook writes next to ``save_path``."""


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` did: the files ``instrument.finish()`` reported and where everything is."""

    files: tuple[Path, ...]
    """Every file instrument reported as written, in the order ``finish()`` returned them."""
    save_path: Path
    """The configured ``save_path``, made absolute."""
    manifest: Path | None
    """This process's ``instrument-manifest-*.jsonl``, if it was written."""
    archive: Path | None
    """The finish hook's archive, if it exists after the run."""
    rewards: tuple[float, ...]
    """Mean reward of every step, in order."""
    profiled_steps: tuple[int, ...]
    """The steps of this run the configuration profiles on rank 0."""

    @property
    def traces(self) -> tuple[Path, ...]:
        """The trace files among :attr:`files`."""
        return tuple(f for f in self.files if f.name.endswith(TRACE_SUFFIX))


# --------------------------------------------------------------------------- a slowed stage


_WORKERS = (RolloutWorker, ActorWorker, RefWorker, CriticWorker)


def parse_slow_stage(text: str) -> tuple[str, float]:
    """``generate_sequences:1.3`` -> ``("generate_sequences", 1.3)``; ``ValueError`` unless FACTOR >= 1."""
    name, sep, factor = text.rpartition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if not sep or not name or not value >= 1 or value == float("inf"):
        raise ValueError(f"'slow_stage' must be NAME:FACTOR with FACTOR >= 1, e.g. update_actor:1.3 (got {text!r})")
    if not any(callable(getattr(worker, name, None)) for worker in _WORKERS):
        raise ValueError(f"'slow_stage': no stage named {name!r} (the demo's stages are its workers' methods)")
    return name, value


def slow_down(trainer: Trainer, stage: str, factor: float) -> None:
    """Make every forward pass of ``stage``'s models take ``factor`` times as long, with real work inside it.

    The worker's method is wrapped so that, only while the stage runs, a forward hook on each of its models
    repeats a small ``torch.mm`` for ``factor - 1`` times the forward's own time: the stage grows by about
    that factor where forward passes are its work (``generate_sequences``, the ``compute_*`` stages), by less
    in the updates, and the extra time shows up as ``aten::mm`` in its traces. Plain torch hooks and the
    worker's own attributes: nothing of instrument but its public API runs.
    """
    workers = [w for w in (trainer.rollout, trainer.actor, trainer.ref, trainer.critic) if type(w) in _WORKERS]
    found = [w for w in workers if callable(getattr(type(w), stage, None))]
    if not found:
        raise ValueError(f"'slow_stage': no stage named {stage!r} (the demo's stages are its workers' methods)")
    worker = found[0]
    models = [m for m in vars(worker).values() if isinstance(m, torch.nn.Module)]
    method = getattr(worker, stage)
    block = torch.ones(64, 64)
    started: list[float] = []

    def before(module: torch.nn.Module, inputs: object) -> None:
        started.append(time.perf_counter())

    def after(module: torch.nn.Module, inputs: object, output: object) -> None:
        begun = started.pop()
        deadline = time.perf_counter() + (factor - 1) * (time.perf_counter() - begun)
        torch.mm(block, block)  # at least once: the planted op is in every slowed forward's trace
        while time.perf_counter() < deadline:
            torch.mm(block, block)

    def slowed(*args: object, **kwargs: object) -> object:
        hooks = [h for m in models for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
        try:
            return method(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()

    setattr(worker, stage, slowed)


# --------------------------------------------------------------------------- the run


class Trainer:
    """The driver: builds the models and workers and runs one PPO step at a time."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        policy, reference, critic = init_models(generator)
        self.generator = generator
        self.rollout = RolloutWorker(policy, generator)
        self.actor = ActorWorker(policy, generator)
        self.ref = RefWorker(reference)
        self.critic = CriticWorker(critic, generator)

    def step(self) -> StepStats:
        """Rollout, forward passes, advantages, critic and actor updates (verl's order)."""
        prompts = torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), generator=self.generator)
        sequences = self.rollout.generate_sequences(prompts)
        old_log_probs = self.actor.compute_log_prob(sequences)
        ref_log_probs = self.ref.compute_ref_log_prob(sequences)
        values = self.critic.compute_values(sequences)
        score = scores(sequences)
        advantage, returns = advantages(score, old_log_probs, ref_log_probs, values)
        critic_loss = self.critic.update_critic(sequences, returns)
        actor_loss = self.actor.update_actor(sequences, old_log_probs, advantage)
        kl = (old_log_probs - ref_log_probs).mean().item()
        return StepStats(reward=score.mean().item(), actor_loss=actor_loss, critic_loss=critic_loss, kl=kl)


def listed(values: Sequence[int]) -> str:
    """``1, 3`` or ``none``."""
    return ", ".join(str(v) for v in values) or "none"


def shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def later_steps_note(cfg: ins.ProfilerConfig, steps_total: int) -> list[str]:
    """A note naming configured steps that this run never reaches."""
    later = [s for s in cfg.steps or () if s > steps_total]
    if not cfg.active or not later:
        return []
    return [f"note: configured step(s) {listed(later)} lie beyond step {steps_total} and are not profiled"]


def _header(cfg: ins.ProfilerConfig, steps_total: int, profiled: Sequence[int], save_path: Path) -> list[str]:
    lines = [
        f"ppo demo: PPO on the CPU, {steps_total} steps, batch {BATCH}, "
        f"{NUM_MINI_BATCHES} mini-batches per update, role {ROLE}"
    ]
    if profiled:
        mode = "discrete" if cfg.discrete else "continuous"
        lines.append(f"profiling steps {listed(profiled)} ({cfg.tool}, {mode}) into {shown(save_path)}")
    else:
        lines.append("profiling: off for this run (the configuration disables it or profiles no step of it)")
    lines += later_steps_note(cfg, steps_total)
    earlier = sorted(save_path.glob(f"*{TRACE_SUFFIX}")) if save_path.is_dir() else []
    if earlier:
        where = shown(save_path)
        lines.append(f"note: {len(earlier)} trace(s) of earlier runs are in {where}; an archive holds them too")
    return lines


def _summary(result: DemoResult, cfg: ins.ProfilerConfig) -> list[str]:
    traces = result.traces
    lines = [f"traces    {len(traces)} in {shown(result.save_path)}/"]
    lines += [f"  {t.name}" for t in traces] or ["  (none)"]
    lines.append(f"manifest  {shown(result.manifest) if result.manifest else '(none written)'}")
    if result.archive is not None:
        lines.append(f"archive   {shown(result.archive)} (written by the finish hook)")
    elif cfg.finish_hook is not None:
        lines.append(f"archive   (no {ARCHIVE_NAME} next to save_path: the finish hook writes elsewhere or failed)")
    if traces:
        lines.append("open a trace in https://ui.perfetto.dev or chrome://tracing (or TensorBoard / HTA)")
    return lines


def check_steps(num_steps: int | None) -> int:
    """``num_steps`` (default :data:`DEFAULT_NUM_STEPS`), refused unless an int >= 1."""
    steps_total = DEFAULT_NUM_STEPS if num_steps is None else num_steps
    if isinstance(steps_total, bool) or not isinstance(steps_total, int) or steps_total < 1:
        raise ValueError(f"'num_steps' must be an int >= 1: {num_steps!r}")
    return steps_total


def prepare(
    config_path: str | Path, overrides: Sequence[str], num_steps: int | None, slow_step: int | None
) -> tuple[ins.ProfilerConfig, int]:
    """The configuration and step count of a run; ``ValueError`` / ``TypeError`` before anything runs.

    ``slow_step`` turns on the slow-step trigger (``SlowStep(factor=1.5, window=2)`` unless the
    configuration has one) and stage metrics, and runs at least one step past it.
    """
    steps_total = check_steps(num_steps)
    cfg = ins.ProfilerConfig.from_file(config_path, overrides)
    if slow_step is not None:
        if slow_step < 1:
            raise ValueError(f"'slow_step' must be >= 1: {slow_step}")
        steps_total = max(steps_total, slow_step + 1)
        cfg = attrs.evolve(cfg, trigger=cfg.trigger or ins.SlowStep(factor=1.5, window=2, steps=1), metrics=True)
    return cfg, steps_total


def train(
    cfg: ins.ProfilerConfig,
    steps_total: int,
    *,
    seed: int = 0,
    out: TextIO | None = None,
    slow_step: int | None = None,
    slow_stage: tuple[str, float] | None = None,
) -> DemoResult:
    """Configure instrument (role :data:`ROLE`, rank 0 of 1), run the steps, ``finish()``, print a summary.

    A line per step goes to ``out`` (default ``sys.stdout``); ``slow_step`` sleeps in that step so
    that the slow-step trigger profiles the next one; ``slow_stage`` (name, factor) slows a stage in every
    step (:func:`slow_down`). The caller's global torch RNG is left as it was.
    """
    save_path = Path(cfg.save_path).absolute()
    stream = sys.stdout if out is None else out

    def say(lines: Sequence[str]) -> None:
        for line in lines:
            print(line, file=stream, flush=True)

    run = ins.configure(cfg, role=ROLE, rank=0, world_size=1)
    profiled = tuple(s for s in range(1, steps_total + 1) if run.profiles(s))
    say(_header(cfg, steps_total, profiled, save_path))
    rewards: list[float] = []
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        trainer = Trainer(seed)
        if slow_stage is not None:
            slow_down(trainer, *slow_stage)
        longest = 0.0
        for step in range(1, steps_total + 1):
            started = time.perf_counter()
            with ins.profile_step(step, last=(step == steps_total)):
                stats = trainer.step()
                triggered = run.step_triggered  # read inside the step: it describes the open step
                if step == slow_step:
                    # Twice the longest step so far: over the trigger's 1.5 x median however loaded the machine is.
                    time.sleep(max(0.3, 2 * longest))
            note = "  profiled" if step in profiled else ""
            if triggered:
                note = "  profiled on demand (slow-step trigger)"
            elif step == slow_step:
                note += "  slow on purpose"
            rewards.append(stats.reward)
            took = time.perf_counter() - started
            longest = max(longest, took)
            say([stats.line(step, steps_total, took) + note])
        files = tuple(Path(f).absolute() for f in ins.finish())

    manifest = run.manifest_path.absolute()
    archive = save_path.parent / ARCHIVE_NAME
    result = DemoResult(
        files=files,
        save_path=save_path,
        manifest=manifest if manifest.is_file() else None,
        archive=archive if archive.is_file() else None,
        rewards=tuple(rewards),
        profiled_steps=profiled,
    )
    say(_summary(result, cfg))
    return result


def run_demo(
    config_path: str | Path = DEFAULT_CONFIG,
    *,
    num_steps: int | None = None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    out: TextIO | None = None,
    slow_step: int | None = None,
    slow_stage: tuple[str, float] | None = None,
) -> DemoResult:
    """:func:`prepare` then :func:`train`: the whole demo under ``config_path`` plus dotted ``overrides``."""
    cfg, steps_total = prepare(config_path, overrides, num_steps, slow_step)
    return train(cfg, steps_total, seed=seed, out=out, slow_step=slow_step, slow_stage=slow_stage)


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both demos take."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. steps=[1,3]")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), metavar="FILE", help="YAML or JSON configuration")
    parser.add_argument("--num-steps", type=int, default=DEFAULT_NUM_STEPS, metavar="N", help="RL steps (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


_NOISE = ("_bucket{", "_created{")


def scrape(server: object) -> list[str]:
    """The ``instrument_`` lines of one real scrape of ``server``'s ``/metrics``, less buckets and ``_created``."""
    host, port = getattr(server, "server_address", ("127.0.0.1", 0))[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    lines = text.splitlines()
    return [line for line in lines if line.startswith("instrument_") and not any(w in line for w in _NOISE)]


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success; 1 if a profiled step left no trace; 2 (one line on stderr) for a bad configuration."""
    parser = argparse.ArgumentParser(prog="ppo_demo.py", description="A tiny PPO loop on the CPU, profiled.")
    add_arguments(parser)
    parser.add_argument("--slow-step", type=int, metavar="S", help="make step S slow: the trigger profiles S+1")
    parser.add_argument(
        "--slow-stage",
        metavar="NAME:FACTOR",
        help="slow stage NAME's forward passes by FACTOR in every step (real work: aten::mm), e.g. "
        "generate_sequences:1.3, to try instrument compare",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="stage metrics on: serve /metrics on 127.0.0.1:PORT (0: a free port) and print one scrape at the end",
    )
    args = parser.parse_args(argv)
    try:
        cfg, steps_total = prepare(args.config, args.overrides, args.num_steps, args.slow_step)
        slow_stage = None if args.slow_stage is None else parse_slow_stage(args.slow_stage)
        server = None
        if args.metrics_port is not None:
            if not 0 <= args.metrics_port <= 65535:
                raise ValueError(f"'metrics_port' must be 0-65535: {args.metrics_port}")
            from instrument.metrics import serve

            cfg = attrs.evolve(cfg, metrics=True)
            server = serve(args.metrics_port)
    except (ValueError, TypeError, OSError) as exc:  # OSError: the port is taken
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    result = train(cfg, steps_total, seed=args.seed, slow_step=args.slow_step, slow_stage=slow_stage)
    if server is not None:
        host, port = server.server_address[:2]
        print(f"metrics   http://{host}:{port}/metrics, one scrape:")
        print("\n".join(f"  {line}" for line in scrape(server)))
        server.shutdown()
    if result.profiled_steps and not result.traces:
        print(f"{parser.prog}: error: profiled steps wrote no trace", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
