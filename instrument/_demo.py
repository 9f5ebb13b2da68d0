"""``instrument demo``: a tiny PPO loop on the CPU, profiled the way a verl job would be.

One process plays a fused ``actor_rollout_ref`` worker plus a critic: every RL step it

1. generates responses to random prompts (``generate_sequences``, autoregressive sampling),
2. computes the policy's and the frozen reference model's log-probs and the critic's values
   (``compute_log_prob``, ``compute_ref_log_prob``, ``compute_values``: forward-only stages),
3. scores the responses (a toy reward: the share of response tokens below ``TARGET_BELOW``),
   turns score and KL penalty into GAE advantages, and
4. updates the critic and the actor over ``NUM_MINI_BATCHES`` mini-batches each
   (``update_critic``, ``update_actor``: scheduled stages, one ``profile_window`` per mini-batch,
   the actor with PPO's clipped loss).

The profiling setup comes from ``examples/demo.yaml``; ``run_demo`` prints a line per step and
where the traces, the manifest and the finish hook's archive are.

torch is imported inside the functions that use it, so that ``instrument.cli`` can import this
module (for :func:`add_arguments`) and ``import instrument.cli`` still loads no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import attrs

import instrument as ins
from instrument.naming import TRACE_SUFFIX

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_NUM_STEPS",
    "ROLE",
    "DemoResult",
    "add_arguments",
    "main_from_args",
    "run_demo",
]

DEFAULT_CONFIG = "examples/demo.yaml"
"""The configuration ``instrument demo`` reads unless ``--config`` names another."""

DEFAULT_NUM_STEPS = 4
"""RL steps ``instrument demo`` runs unless ``--num-steps`` says otherwise."""

ROLE = "actor_rollout_ref"
"""The role the demo process configures (one fused worker that also hosts the critic)."""

ARCHIVE_NAME = "profile-archive.tgz"
"""What ``examples/demo.yaml``'s finish hook writes next to ``save_path``."""

# The model and the PPO recipe: small enough for a few seconds per step on one CPU core.
VOCAB = 64
HIDDEN = 64
CONTEXT = 4  # the policy sees the last CONTEXT tokens
PROMPT_LEN = 8
RESPONSE_LEN = 16
BATCH = 96
NUM_MINI_BATCHES = 6
TARGET_BELOW = 8  # reward: share of response tokens < TARGET_BELOW (1/8 for a uniform policy)
ACTOR_LR = 1e-2
CRITIC_LR = 1e-2
CLIP = 0.2
KL_COEF = 0.02
GAMMA = 1.0
LAM = 0.95


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` did: the files ``instrument.finish()`` reported and where everything is."""

    files: tuple[Path, ...]
    """Every file the SDK reported as written (traces, in the order ``finish()`` returned them)."""
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


# --------------------------------------------------------------------------- models and maths


def _make_model(out_features: int, generator: torch.Generator) -> torch.nn.Sequential:
    """Embedding of the last ``CONTEXT`` tokens -> MLP -> ``out_features`` (logits or a value)."""
    import torch

    head = torch.nn.Linear(HIDDEN, out_features)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, HIDDEN),
        torch.nn.Flatten(start_dim=-2),
        torch.nn.Linear(CONTEXT * HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        head,
    )
    with torch.no_grad():
        for param in model.parameters():
            scale = 0.5 if param.dim() == 2 and param.shape[0] == VOCAB else 1.0 / math.sqrt(param.shape[-1])
            param.copy_(torch.randn(param.shape, generator=generator) * scale)
        if out_features == 1:  # a critic starts at value 0 instead of random values
            head.weight.zero_()
            head.bias.zero_()
    return model


def _windows(sequences: torch.Tensor) -> torch.Tensor:
    """``(B, P+R)`` -> ``(B, R, CONTEXT)``: the context each response token was sampled from."""
    start = PROMPT_LEN - CONTEXT
    return sequences.unfold(1, CONTEXT, 1)[:, start : start + RESPONSE_LEN]


def _log_probs(model: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` log-probabilities ``model`` gives the response tokens of ``sequences``."""
    import torch

    logits: torch.Tensor = model(_windows(sequences))
    responses = sequences[:, PROMPT_LEN:]
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def _values(model: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` critic values of the states before each response token."""
    values: torch.Tensor = model(_windows(sequences))
    return values.squeeze(-1)


def _scores(sequences: torch.Tensor) -> torch.Tensor:
    """The toy reward of each sequence: the share of its response tokens below ``TARGET_BELOW``."""
    return (sequences[:, PROMPT_LEN:] < TARGET_BELOW).float().mean(dim=1)


def _advantages(
    scores: torch.Tensor, log_probs: torch.Tensor, ref_log_probs: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over token rewards (KL penalty per token, the score on the last one): (advantages, returns)."""
    import torch

    rewards = -KL_COEF * (log_probs - ref_log_probs)
    rewards[:, -1] += scores
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(scores)
    for t in reversed(range(RESPONSE_LEN)):
        next_value = values[:, t + 1] if t + 1 < RESPONSE_LEN else torch.zeros_like(scores)
        delta = rewards[:, t] + GAMMA * next_value - values[:, t]
        running = delta + GAMMA * LAM * running
        advantages[:, t] = running
    returns = advantages + values
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return advantages, returns


def _mini_batches(generator: torch.Generator, size: int = BATCH) -> list[torch.Tensor]:
    """A shuffled split of ``size`` batch indices into ``NUM_MINI_BATCHES`` equal parts."""
    import torch

    return list(torch.randperm(size, generator=generator).chunk(NUM_MINI_BATCHES))


def _init_models(generator: torch.Generator) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """The policy, its frozen reference (a copy) and the critic, drawn from ``generator`` in that order."""
    policy = _make_model(VOCAB, generator)
    reference = _make_model(VOCAB, generator)
    reference.load_state_dict(policy.state_dict())
    critic = _make_model(1, generator)
    return policy, reference, critic


# --------------------------------------------------------------------------- workers


class RolloutWorker:
    """Samples responses from the policy (in verl, the rollout engine sharing the actor's weights)."""

    def __init__(self, policy: torch.nn.Module, generator: torch.Generator) -> None:
        self.policy = policy
        self.generator = generator

    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self, prompts: torch.Tensor) -> torch.Tensor:
        """Append ``RESPONSE_LEN`` sampled tokens to every prompt: ``(B, P)`` -> ``(B, P+R)``."""
        import torch

        sequences = prompts
        with torch.no_grad():
            for _ in range(RESPONSE_LEN):
                logits: torch.Tensor = self.policy(sequences[:, -CONTEXT:])
                tokens = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generator)
                sequences = torch.cat([sequences, tokens], dim=1)
        return sequences


class ActorWorker:
    """The policy: old log-probs before the update, then PPO's clipped update."""

    def __init__(self, policy: torch.nn.Module, generator: torch.Generator) -> None:
        import torch

        self.policy = policy
        self.generator = generator
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=ACTOR_LR)

    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of the response tokens under the current policy."""
        import torch

        with torch.no_grad():
            return _log_probs(self.policy, sequences)

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, sequences: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor) -> float:
        """One PPO epoch over ``NUM_MINI_BATCHES`` mini-batches; returns the mean loss."""
        import torch

        losses = []
        for i, index in enumerate(_mini_batches(self.generator, len(sequences))):
            with ins.profile_window(mini_batch=i):
                log_probs = _log_probs(self.policy, sequences[index])
                ratio = torch.exp(log_probs - old_log_probs[index])
                adv = advantages[index]
                clipped = torch.clamp(ratio, 1.0 - CLIP, 1.0 + CLIP)
                loss = -torch.min(ratio * adv, clipped * adv).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                self.optimizer.step()
                losses.append(loss.item())
        return sum(losses) / len(losses)


class RefWorker:
    """The frozen reference policy the KL penalty is measured against."""

    def __init__(self, reference: torch.nn.Module) -> None:
        self.reference = reference.requires_grad_(False)

    @ins.profiled_stage("compute_ref_log_prob")
    def compute_ref_log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of the response tokens under the reference policy."""
        import torch

        with torch.no_grad():
            return _log_probs(self.reference, sequences)


class CriticWorker:
    """The value model: values before the update, then a clipped-free MSE update towards the returns."""

    def __init__(self, critic: torch.nn.Module, generator: torch.Generator) -> None:
        import torch

        self.critic = critic
        self.generator = generator
        self.optimizer = torch.optim.Adam(critic.parameters(), lr=CRITIC_LR)

    @ins.profiled_stage("compute_values")
    def compute_values(self, sequences: torch.Tensor) -> torch.Tensor:
        """Values of the states before every response token."""
        import torch

        with torch.no_grad():
            return _values(self.critic, sequences)

    @ins.profiled_stage("update_critic", scheduled=True)
    def update_critic(self, sequences: torch.Tensor, returns: torch.Tensor) -> float:
        """One epoch over ``NUM_MINI_BATCHES`` mini-batches; returns the mean loss."""
        import torch

        losses = []
        for i, index in enumerate(_mini_batches(self.generator, len(sequences))):
            with ins.profile_window(mini_batch=i):
                loss = torch.nn.functional.mse_loss(_values(self.critic, sequences[index]), returns[index])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                self.optimizer.step()
                losses.append(loss.item())
        return sum(losses) / len(losses)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class _StepStats:
    reward: float
    actor_loss: float
    critic_loss: float
    kl: float


class _Trainer:
    """The driver: builds the models and workers and runs one PPO step at a time."""

    def __init__(self, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        policy, reference, critic = _init_models(generator)
        self.generator = generator
        self.rollout = RolloutWorker(policy, generator)
        self.actor = ActorWorker(policy, generator)
        self.ref = RefWorker(reference)
        self.critic = CriticWorker(critic, generator)

    def step(self) -> _StepStats:
        """Rollout, forward passes, advantages, critic and actor updates (verl's order)."""
        import torch

        prompts = torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), generator=self.generator)
        sequences = self.rollout.generate_sequences(prompts)
        old_log_probs = self.actor.compute_log_prob(sequences)
        ref_log_probs = self.ref.compute_ref_log_prob(sequences)
        values = self.critic.compute_values(sequences)
        scores = _scores(sequences)
        advantages, returns = _advantages(scores, old_log_probs, ref_log_probs, values)
        critic_loss = self.critic.update_critic(sequences, returns)
        actor_loss = self.actor.update_actor(sequences, old_log_probs, advantages)
        return _StepStats(
            reward=scores.mean().item(),
            actor_loss=actor_loss,
            critic_loss=critic_loss,
            kl=(old_log_probs - ref_log_probs).mean().item(),
        )


def _list(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values) or "none"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _header(cfg: ins.ProfilerConfig, steps_total: int, profiled: Sequence[int], save_path: Path) -> list[str]:
    lines = [
        f"instrument demo: PPO on the CPU, {steps_total} steps, batch {BATCH}, "
        f"{NUM_MINI_BATCHES} mini-batches per update, role {ROLE}"
    ]
    if profiled:
        mode = "discrete" if cfg.discrete else "continuous"
        lines.append(f"profiling steps {_list(profiled)} ({cfg.tool}, {mode}) into {_shown(save_path)}")
    else:
        lines.append("profiling: off for this run (the configuration disables it or profiles no step of it)")
    if cfg.active and cfg.steps is not None and max(cfg.steps) > steps_total:
        later = [s for s in cfg.steps if s > steps_total]
        lines.append(f"note: configured step(s) {_list(later)} lie beyond step {steps_total} and are not profiled")
    earlier = sorted(save_path.glob(f"*{TRACE_SUFFIX}")) if save_path.is_dir() else []
    if earlier:
        lines.append(
            f"note: {len(earlier)} trace(s) of earlier runs are in {_shown(save_path)}; an archive holds them too"
        )
    return lines


def _summary(result: DemoResult, cfg: ins.ProfilerConfig) -> list[str]:
    traces = result.traces
    lines = [f"traces    {len(traces)} in {_shown(result.save_path)}/"]
    lines += [f"  {t.name}" for t in traces] or ["  (none)"]
    lines.append(f"manifest  {_shown(result.manifest) if result.manifest else '(none written)'}")
    if result.archive is not None:
        lines.append(f"archive   {_shown(result.archive)} (written by the finish hook)")
    elif cfg.finish_hook is not None:
        lines.append(f"archive   (no {ARCHIVE_NAME} next to save_path: the finish hook writes elsewhere or failed)")
    if traces:
        lines.append("open a trace in https://ui.perfetto.dev or chrome://tracing (or TensorBoard / HTA)")
    return lines


def run_demo(
    config_path: str | Path | None = DEFAULT_CONFIG,
    *,
    num_steps: int | None = None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    out: TextIO | None = None,
    slow_step: int | None = None,
) -> DemoResult:
    """Run the PPO demo under the profiling setup of ``config_path`` (plus dotted ``overrides``).

    ``slow_step`` makes that step slow on purpose (a sleep) and turns on the slow-step trigger
    (``SlowStep(factor=1.5, window=2)`` unless the configuration has one) and stage metrics: the
    next step is then profiled on demand, its traces marked ``_trig``.

    Configures instrument for this process (role :data:`ROLE`, rank 0 of 1), runs ``num_steps``
    RL steps (default :data:`DEFAULT_NUM_STEPS`), prints a line per step and a summary to ``out``
    (default: ``sys.stdout`` at call time), then calls ``instrument.finish()``.  The caller's
    global torch RNG is left as it was.  Raises ``ValueError`` for a bad step count or configuration.
    """
    import torch

    from instrument.cli import load_config  # here, not at the top: instrument.cli imports this module

    steps_total = DEFAULT_NUM_STEPS if num_steps is None else num_steps
    if isinstance(steps_total, bool) or not isinstance(steps_total, int) or steps_total < 1:
        raise ValueError(f"'num_steps' must be an int >= 1: {num_steps!r}")
    cfg = load_config(config_path, overrides)
    if slow_step is not None:
        if slow_step < 1:
            raise ValueError(f"'slow_step' must be >= 1: {slow_step}")
        steps_total = max(steps_total, slow_step + 1)
        cfg = attrs.evolve(cfg, trigger=cfg.trigger or ins.SlowStep(factor=1.5, window=2, steps=1), metrics=True)
    save_path = Path(cfg.save_path).absolute()

    stream = sys.stdout if out is None else out

    def say(lines: Sequence[str]) -> None:
        for line in lines:
            print(line, file=stream, flush=True)

    session = ins.configure(cfg, role=ROLE, rank=0, world_size=1)
    profiled = tuple(s for s in range(1, steps_total + 1) if session.profiles(s))
    say(_header(cfg, steps_total, profiled, save_path))
    rewards: list[float] = []
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        trainer = _Trainer(seed)
        for step in range(1, steps_total + 1):
            started = time.perf_counter()
            with ins.profile_step(step, last=(step == steps_total)):
                stats = trainer.step()
                if step == slow_step:
                    time.sleep(max(0.3, 10 * (time.perf_counter() - started)))  # a straggling step
            seconds = time.perf_counter() - started
            rewards.append(stats.reward)
            note = "  profiled" if step in profiled else ""
            if session.step_triggered:
                note = "  profiled on demand (slow-step trigger)"
            elif step == slow_step:
                note += "  slow on purpose"
            say(
                [
                    f"step {step}/{steps_total}  reward {stats.reward:.3f}  actor_loss {stats.actor_loss:+.4f}  "
                    f"critic_loss {stats.critic_loss:.4f}  kl {stats.kl:+.4f}  {seconds:5.2f} s{note}"
                ]
            )
        files = tuple(Path(f).absolute() for f in ins.finish())

    manifest = session.manifest_path.absolute()
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


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``instrument demo`` options to ``parser`` (a subcommand's parser)."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. steps=[1,3]")
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        metavar="FILE",
        help=f"YAML or JSON configuration (default {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--num-steps", type=int, default=DEFAULT_NUM_STEPS, metavar="N", help=f"RL steps (default {DEFAULT_NUM_STEPS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--slow-step",
        type=int,
        metavar="S",
        help="make step S slow on purpose: the slow-step trigger profiles the next step (marked _trig)",
    )


@contextlib.contextmanager
def _without_kineto_chatter() -> Iterator[None]:
    """Drop the ``USDT: … profiler_start/stop`` lines torch 2.13 prints per trace (24 in this demo).

    They come from C++ straight to file descriptor 2, so the demo passes its stderr through a
    pipe and a thread that forwards every other line. Only for this demo: a library must not
    take over a process's stderr.
    """
    try:
        saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except OSError:  # no usable stderr: nothing to keep readable
        yield
        return

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not line.startswith(b"USDT:"):
                    os.write(saved, line)

    forwarder = threading.Thread(target=forward, name="instrument-demo-stderr", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the forwarder reads to the end
        forwarder.join(timeout=5)
        os.close(saved)


def main_from_args(args: argparse.Namespace) -> int:
    """Run ``instrument demo`` with parsed arguments; 0 on success, 1 if a profiled step left no trace."""
    config = Path(args.config)
    if args.config == DEFAULT_CONFIG and not config.exists():
        packaged = Path(__file__).resolve().parents[1] / DEFAULT_CONFIG  # a source checkout, run from elsewhere
        if packaged.exists():
            config = packaged
    with _without_kineto_chatter():
        result = run_demo(
            config, num_steps=args.num_steps, overrides=args.overrides, seed=args.seed, slow_step=args.slow_step
        )
    if result.profiled_steps and not result.traces:
        print("instrument demo: error: profiled steps wrote no trace", file=sys.stderr)
        return 1
    return 0
