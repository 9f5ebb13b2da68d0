"""The Ray actors of ``ppo_demo_ray.py``: the demo's workers (``ppo_workers.py``) as verl worker groups.

Each actor mixes in instrument's :class:`ProfiledWorker` (the remote control calls of a
``ProfileController``), configures instrument with its group's role and its rank in the group,
and joins its group's gloo process group: the models are wrapped in ``DistributedDataParallel``,
so the ranks' gradients are all-reduced and their weights stay equal.
"""

from __future__ import annotations

import ppo_workers as ppo
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import instrument as ins
from instrument.config import ProfilerConfig
from instrument.integrations.ray import ProfiledWorker

ACTOR_ROLLOUT_REF = "actor_rollout_ref"
"""The fused worker group's role: rollout, actor and reference in the same actors."""

CRITIC = "critic"
"""The critic group's role."""

_GROUP_SEEDS = {ACTOR_ROLLOUT_REF: 1, CRITIC: 2}
"""Per-group offsets of the sampling / shuffling seeds (every rank draws its own stream)."""


class _GroupWorker(ProfiledWorker):
    """What both groups' actors share: instrument's run, the gloo group, the controller's calls."""

    def __init__(self, cfg: ProfilerConfig, *, role: str, rank: int, world_size: int, rendezvous: str) -> None:
        torch.set_num_threads(1)  # four actors share two cores
        self.run = ins.configure(cfg, role=role, rank=rank, world_size=world_size)
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
        return self.starts, str(self.run.manifest_path)

    def weights(self) -> torch.Tensor:
        """This rank's trained weights, flattened (equal on every rank of a group)."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()


class ActorRolloutRefWorker(_GroupWorker):
    """verl's fused worker: rollout, actor and reference share one process and the policy's weights."""

    def __init__(self, cfg: ProfilerConfig, rank: int, world_size: int, rendezvous: str, seed: int) -> None:
        super().__init__(cfg, role=ACTOR_ROLLOUT_REF, rank=rank, world_size=world_size, rendezvous=rendezvous)
        policy, reference, _ = ppo.init_models(torch.Generator().manual_seed(seed))  # equal on every rank
        generator = torch.Generator().manual_seed(_rank_seed(seed, ACTOR_ROLLOUT_REF, rank))
        self.rollout = ppo.RolloutWorker(policy, generator)
        self.actor = ppo.ActorWorker(DistributedDataParallel(policy), generator)  # gradients all-reduced
        self.ref = ppo.RefWorker(reference)

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
        _, _, critic = ppo.init_models(torch.Generator().manual_seed(seed))
        generator = torch.Generator().manual_seed(_rank_seed(seed, CRITIC, rank))
        self.critic = ppo.CriticWorker(DistributedDataParallel(critic), generator)

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
    return torch.cat([p.detach().flatten() for p in model.parameters()])
