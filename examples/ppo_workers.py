"""The PPO model, maths and workers of the demos: plain torch, marked with instrument's stages.

``ppo_demo.py`` drives these workers in one process; ``ppo_demo_ray.py`` runs them as Ray actors.
Each worker method is a verl stage: ``@ins.profiled_stage`` names it, and the two updates open a
``profile_window`` per mini-batch so that the profiler's schedule can pick which ones to record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import instrument as ins

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


# --------------------------------------------------------------------------- models and maths


def make_model(out_features: int, generator: torch.Generator) -> torch.nn.Sequential:
    """Embedding of the last ``CONTEXT`` tokens -> MLP -> ``out_features`` (logits or a value)."""
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


def init_models(generator: torch.Generator) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """The policy, its frozen reference (a copy) and the critic, drawn from ``generator`` in that order."""
    policy = make_model(VOCAB, generator)
    reference = make_model(VOCAB, generator)
    reference.load_state_dict(policy.state_dict())
    critic = make_model(1, generator)
    return policy, reference, critic


def _contexts(sequences: torch.Tensor) -> torch.Tensor:
    """``(B, P+R)`` -> ``(B, R, CONTEXT)``: the context each response token was sampled from."""
    start = PROMPT_LEN - CONTEXT
    return sequences.unfold(1, CONTEXT, 1)[:, start : start + RESPONSE_LEN]


def _log_probs(model: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` log-probabilities ``model`` gives the response tokens of ``sequences``."""
    logits: torch.Tensor = model(_contexts(sequences))
    responses = sequences[:, PROMPT_LEN:]
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def _values(model: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` critic values of the states before each response token."""
    values: torch.Tensor = model(_contexts(sequences))
    return values.squeeze(-1)


def scores(sequences: torch.Tensor) -> torch.Tensor:
    """The toy reward of each sequence: the share of its response tokens below ``TARGET_BELOW``."""
    return (sequences[:, PROMPT_LEN:] < TARGET_BELOW).float().mean(dim=1)


def advantages(
    score: torch.Tensor, log_probs: torch.Tensor, ref_log_probs: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over token rewards (KL penalty per token, the score on the last one): (advantages, returns)."""
    rewards = -KL_COEF * (log_probs - ref_log_probs)
    rewards[:, -1] += score
    gae = torch.zeros_like(rewards)
    running = torch.zeros_like(score)
    for t in reversed(range(RESPONSE_LEN)):
        next_value = values[:, t + 1] if t + 1 < RESPONSE_LEN else torch.zeros_like(score)
        delta = rewards[:, t] + GAMMA * next_value - values[:, t]
        running = delta + GAMMA * LAM * running
        gae[:, t] = running
    returns = gae + values
    return (gae - gae.mean()) / (gae.std() + 1e-8), returns


def _mini_batches(generator: torch.Generator, size: int) -> list[torch.Tensor]:
    """A shuffled split of ``size`` batch indices into ``NUM_MINI_BATCHES`` equal parts."""
    return list(torch.randperm(size, generator=generator).chunk(NUM_MINI_BATCHES))


# --------------------------------------------------------------------------- workers


class RolloutWorker:
    """Samples responses from the policy (in verl, the rollout engine sharing the actor's weights)."""

    def __init__(self, policy: torch.nn.Module, generator: torch.Generator) -> None:
        self.policy = policy
        self.generator = generator

    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self, prompts: torch.Tensor) -> torch.Tensor:
        """Append ``RESPONSE_LEN`` sampled tokens to every prompt: ``(B, P)`` -> ``(B, P+R)``."""
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
        self.policy = policy
        self.generator = generator
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=ACTOR_LR)

    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of the response tokens under the current policy."""
        with torch.no_grad():
            return _log_probs(self.policy, sequences)

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, sequences: torch.Tensor, old_log_probs: torch.Tensor, advantage: torch.Tensor) -> float:
        """One PPO epoch over ``NUM_MINI_BATCHES`` mini-batches; returns the mean loss."""
        losses = []
        for i, index in enumerate(_mini_batches(self.generator, len(sequences))):
            with ins.profile_window(mini_batch=i):  # the schedule advances once per mini-batch
                ratio = torch.exp(_log_probs(self.policy, sequences[index]) - old_log_probs[index])
                adv = advantage[index]
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
        with torch.no_grad():
            return _log_probs(self.reference, sequences)


class CriticWorker:
    """The value model: values before the update, then an MSE update towards the returns."""

    def __init__(self, critic: torch.nn.Module, generator: torch.Generator) -> None:
        self.critic = critic
        self.generator = generator
        self.optimizer = torch.optim.Adam(critic.parameters(), lr=CRITIC_LR)

    @ins.profiled_stage("compute_values", role="critic")  # its own worker group in verl, even in one process
    def compute_values(self, sequences: torch.Tensor) -> torch.Tensor:
        """Values of the states before every response token."""
        with torch.no_grad():
            return _values(self.critic, sequences)

    @ins.profiled_stage("update_critic", scheduled=True, role="critic")
    def update_critic(self, sequences: torch.Tensor, returns: torch.Tensor) -> float:
        """One epoch over ``NUM_MINI_BATCHES`` mini-batches; returns the mean loss."""
        losses = []
        for i, index in enumerate(_mini_batches(self.generator, len(sequences))):
            with ins.profile_window(mini_batch=i):
                loss = torch.nn.functional.mse_loss(_values(self.critic, sequences[index]), returns[index])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                self.optimizer.step()
                losses.append(loss.item())
        return sum(losses) / len(losses)


@dataclass(frozen=True)
class StepStats:
    """What one PPO step reports."""

    reward: float
    actor_loss: float
    critic_loss: float
    kl: float

    def line(self, step: int, steps_total: int, seconds: float) -> str:
        """The demo's line for this step (without a note on profiling)."""
        return (
            f"step {step}/{steps_total}  reward {self.reward:.3f}  actor_loss {self.actor_loss:+.4f}  "
            f"critic_loss {self.critic_loss:.4f}  kl {self.kl:+.4f}  {seconds:5.2f} s"
        )
