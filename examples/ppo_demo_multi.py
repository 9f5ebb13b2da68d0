"""The PPO demo across processes (``make demo``): 2 actor and 2 rollout ranks on torch.distributed gloo.

    python examples/ppo_demo_multi.py --config examples/demo.yaml --num-steps 8 'ranks=[0,3]' 'steps=[2,8]'
    python examples/ppo_demo_multi.py --slow-factor 1          # no planted straggler

The demo spawns :data:`WORLD_SIZE` processes (``torch.multiprocessing``) that meet at a ``TCPStore`` the
parent holds and form one gloo process group. Global ranks 0-1 are the ``actor`` role, 2-3 the
``rollout`` role (a verl job with a separate rollout engine), and each process configures instrument
with its own role; its global rank comes from torch.distributed. Every RL step:

1. each rollout rank samples responses for its own prompts (``generate_sequences``, best of
   :data:`CANDIDATES`). Rank :data:`SLOW_RANK` is planted slower: its stage repeats real ``torch.mm``
   work for ``factor - 1`` times as long as its sampling took (a slower device, or a busier host);
2. the hand-off: one ``all_gather`` over all ranks moves the sequences to the actor ranks (the actor
   ranks put in a placeholder). It runs outside any stage, as a verl driver moves the batch, so the
   time every other rank waits there for the slow rank is idle time the step timeline attributes;
3. each actor rank takes one rollout rank's sequences and runs the policy's and the reference's
   log-probs, the critic's values (its stages carry the role ``critic``, colocated as in verl), the
   advantages, and the critic's and the actor's updates (``DistributedDataParallel`` over the two
   actor ranks: gradients all-reduced);
4. the weight sync: actor rank 0 broadcasts the updated policy to every rank; the rollout ranks wait
   there for the actor's update, so the waits run both ways across the roles.

Every process writes into the one ``save_path``; ``demo.yaml``'s finish hook (rank 0 only) runs once,
after every rank's last step. Then ``instrument analyze`` names the slow rank as the straggler of
``generate_sequences``, the actor ranks waiting for it, and a critical path that crosses the roles.

Uses only instrument's public API. Needs ``torch`` and ``pyyaml`` (``pip install 'instrument-rl[torch,yaml]'``).
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import ppo_demo as demo
import ppo_workers as ppo
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ppo_demo import DEFAULT_CONFIG, DemoResult
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import instrument as ins
from instrument.config import ProfilerConfig
from instrument.naming import parse_trace_name
from instrument.ranks import validate_ranks

ACTOR = "actor"
"""The role of the actor ranks (policy, reference and the colocated critic)."""
ROLLOUT = "rollout"
"""The role of the rollout ranks."""
ACTOR_RANKS = (0, 1)
ROLLOUT_RANKS = (2, 3)
WORLD_SIZE = len(ACTOR_RANKS) + len(ROLLOUT_RANKS)
SLOW_RANK = 3
"""The rollout rank planted slower."""
DEFAULT_SLOW_FACTOR = 3.0
"""How many times as long the slow rank's ``generate_sequences`` takes (``--slow-factor``)."""
DEFAULT_NUM_STEPS = 8
"""Enough steps that a straggler is one on most of them, and short enough for 2 cores (``make demo``)."""
CANDIDATES = 8
"""Responses sampled per prompt by the rollout ranks (:class:`BestOfN`)."""
PER_ROLLOUT_RANK = ppo.BATCH // len(ROLLOUT_RANKS)
SEQUENCE_LEN = ppo.PROMPT_LEN + ppo.RESPONSE_LEN
# torch exports these without types: the ranks' meeting point, and the launcher with its two failures.
_TCPStore: Any = dist.TCPStore  # type: ignore[attr-defined,unused-ignore]
_start_processes: Any = mp.start_processes  # type: ignore[attr-defined,unused-ignore]
_Raised: type[Exception] = mp.ProcessRaisedException  # type: ignore[attr-defined,unused-ignore]
_Exited: type[Exception] = mp.ProcessExitedException  # type: ignore[attr-defined,unused-ignore]
_HOST = "127.0.0.1"
_STORE_WAIT = timedelta(seconds=120)  # only against a process that never comes up
_POLL_S = 0.1


def role_of(rank: int) -> str:
    """The role of global rank ``rank``."""
    return ACTOR if rank in ACTOR_RANKS else ROLLOUT


@dataclass(frozen=True)
class MultiDemoResult(DemoResult):
    """A :class:`DemoResult` of the multi-process demo: every process's files, manifests and reports.

    :attr:`DemoResult.manifest` is rank 0's; :attr:`DemoResult.profiled_steps` the steps some rank profiled.
    """

    manifests: tuple[Path, ...]
    """The ``instrument-manifest-*.jsonl`` of every process, in rank order."""
    recorded: tuple[tuple[int, int], ...]
    """``(step, rank)`` for every rank that recorded a step."""
    roles: tuple[str, ...]
    """The role of each global rank, in rank order."""
    in_sync: bool
    """Whether every rank ended with the actor's weights (the rollout ranks through the weight sync)."""


@dataclass(frozen=True)
class _Spec:
    """What every spawned process is given."""

    cfg: ProfilerConfig
    steps_total: int
    seed: int
    slow_factor: float
    port: int
    echo: bool
    """Rank 0 prints its step lines itself (to the terminal, in order with the finish hook's lines)."""


@dataclass(frozen=True)
class _Report:
    """What a process sends back when it is done."""

    rank: int
    files: tuple[str, ...]
    manifest: str
    recorded: tuple[int, ...]
    weights_digest: float


# --------------------------------------------------------------------------- the ranks


class _Ranks:
    """One process's part of a PPO step; the collectives are the same calls, in the same order, on every rank."""

    def __init__(self, seed: int, rank: int, actors: Any) -> None:
        # Every rank starts from the same weights; each draws its own samples.
        self.policy, self.reference, self.critic = ppo.init_models(torch.Generator().manual_seed(seed))
        self.generator = torch.Generator().manual_seed(seed * 1_000 + rank)
        self.rank = rank
        self.actors = actors

    def hand_off(self, sequences: torch.Tensor | None) -> list[torch.Tensor]:
        """The rollout ranks' sequences, on every rank (the actor ranks' slots hold placeholders)."""
        mine = torch.zeros(PER_ROLLOUT_RANK, SEQUENCE_LEN, dtype=torch.long) if sequences is None else sequences
        gathered = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
        dist.all_gather(gathered, mine)
        return gathered

    def sync_weights(self) -> None:
        """Actor rank 0's policy to every rank."""
        flat = parameters_to_vector(self.policy.parameters()).detach().clone()
        dist.broadcast(flat, src=ACTOR_RANKS[0])
        with torch.no_grad():
            vector_to_parameters(flat, self.policy.parameters())

    def step(self) -> ppo.StepStats | None:
        """This rank's part of one step; the step's stats on actor ranks (all-reduced over them)."""
        raise NotImplementedError


class BestOfN:
    """The rollout ranks' engine: :data:`CANDIDATES` sampled responses per prompt, the best-scoring one kept.

    Best-of-n sampling, as rejection-sampling recipes do: generation is most of a step, as in LLM RL.
    ``slow_factor`` plants a slower device: after sampling, the call repeats a small ``torch.mm`` for
    ``slow_factor - 1`` times as long as the sampling took, inside the stage, so the whole stage takes about
    ``slow_factor`` times as long and the extra time is ``aten::mm`` in its trace.
    """

    def __init__(self, policy: torch.nn.Module, generator: torch.Generator, slow_factor: float = 1.0) -> None:
        self.policy = policy
        self.generator = generator
        self.slow_factor = slow_factor
        self._block = torch.ones(64, 64)

    def _sample(self, prompts: torch.Tensor) -> torch.Tensor:
        sequences = prompts
        for _ in range(ppo.RESPONSE_LEN):
            logits: torch.Tensor = self.policy(sequences[:, -ppo.CONTEXT :])
            tokens = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generator)
            sequences = torch.cat([sequences, tokens], dim=1)
        return sequences

    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self, prompts: torch.Tensor) -> torch.Tensor:
        """``(B, P)`` -> ``(B, P+R)``: of :data:`CANDIDATES` responses to each prompt, the best-scoring one."""
        began = time.perf_counter()
        with torch.no_grad():
            candidates = torch.stack([self._sample(prompts) for _ in range(CANDIDATES)])  # (n, B, P+R)
            best = ppo.scores(candidates.flatten(0, 1)).view(CANDIDATES, -1).argmax(dim=0)
            if self.slow_factor > 1:
                now = time.perf_counter()
                deadline = now + (self.slow_factor - 1) * (now - began)
                while time.perf_counter() < deadline:
                    torch.mm(self._block, self._block)
            return candidates[best, torch.arange(len(prompts))]


class _RolloutRank(_Ranks):
    def __init__(self, seed: int, rank: int, actors: Any, slow_factor: float) -> None:
        super().__init__(seed, rank, actors)
        self.rollout = BestOfN(self.policy, self.generator, slow_factor if rank == SLOW_RANK else 1.0)

    def step(self) -> None:
        prompts = torch.randint(0, ppo.VOCAB, (PER_ROLLOUT_RANK, ppo.PROMPT_LEN), generator=self.generator)
        self.hand_off(self.rollout.generate_sequences(prompts))
        self.sync_weights()  # waits here for the actor's update


class _ActorRank(_Ranks):
    def __init__(self, seed: int, rank: int, actors: Any) -> None:
        super().__init__(seed, rank, actors)
        self.actor = ppo.ActorWorker(DistributedDataParallel(self.policy, process_group=actors), self.generator)
        self.ref = ppo.RefWorker(self.reference)
        self.values = ppo.CriticWorker(DistributedDataParallel(self.critic, process_group=actors), self.generator)

    def step(self) -> ppo.StepStats:
        gathered = self.hand_off(None)  # waits here for the slowest rollout rank
        sequences = gathered[ROLLOUT_RANKS[ACTOR_RANKS.index(self.rank)]]
        old_log_probs = self.actor.compute_log_prob(sequences)
        ref_log_probs = self.ref.compute_ref_log_prob(sequences)
        values = self.values.compute_values(sequences)
        score = ppo.scores(sequences)
        advantage, returns = ppo.advantages(score, old_log_probs, ref_log_probs, values)
        critic_loss = self.values.update_critic(sequences, returns)
        actor_loss = self.actor.update_actor(sequences, old_log_probs, advantage)
        kl = (old_log_probs - ref_log_probs).mean().item()
        stats = torch.tensor([score.mean().item(), actor_loss, critic_loss, kl], dtype=torch.float64)
        dist.all_reduce(stats, group=self.actors)
        self.sync_weights()
        reward, actor_loss, critic_loss, kl = (stats / len(ACTOR_RANKS)).tolist()
        return ppo.StepStats(reward=reward, actor_loss=actor_loss, critic_loss=critic_loss, kl=kl)


def _process(rank: int, spec: _Spec, lines: Any) -> None:
    """One spawned rank: join the gloo group, configure instrument with its role, train, finish."""
    torch.set_num_threads(1)  # four processes share two cores
    store = _TCPStore(_HOST, spec.port, is_master=False, timeout=_STORE_WAIT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=_STORE_WAIT)
    try:
        run = ins.configure(spec.cfg, role=role_of(rank))  # the global rank and world size: torch.distributed's
        actors = dist.new_group(list(ACTOR_RANKS))  # every rank takes part in creating a group
        torch.manual_seed(spec.seed)
        ranks: _Ranks
        if role_of(rank) == ACTOR:
            ranks = _ActorRank(spec.seed, rank, actors)
        else:
            ranks = _RolloutRank(spec.seed, rank, actors, spec.slow_factor)
        dist.barrier()  # set-up done everywhere: step 1 does not wait for a late process's imports
        for step in range(1, spec.steps_total + 1):
            started = time.perf_counter()
            with ins.profile_step(step, last=(step == spec.steps_total)):
                stats = ranks.step()
            if stats is not None and rank == ACTOR_RANKS[0]:
                line = stats.line(step, spec.steps_total, time.perf_counter() - started)
                if spec.echo:
                    print(line, flush=True)
                lines.put(("step", step, stats.reward, line))
        files = tuple(str(Path(f).absolute()) for f in ins.finish())
        digest = float(parameters_to_vector(ranks.policy.parameters()).detach().double().sum())
        recorded = tuple(s for s in range(1, spec.steps_total + 1) if run.profiles(s))
        lines.put(("done", _Report(rank, files, str(run.manifest_path.absolute()), recorded, digest)))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the parent


def prepare(config_path: str | Path, overrides: Sequence[str], num_steps: int | None) -> tuple[ProfilerConfig, int]:
    """The configuration and step count; ``ValueError`` / ``TypeError`` before any process starts."""
    steps_total = DEFAULT_NUM_STEPS if num_steps is None else demo.check_steps(num_steps)
    cfg = ins.ProfilerConfig.from_file(config_path, overrides)
    try:
        if cfg.active and not cfg.all_ranks:
            validate_ranks(cfg.ranks, WORLD_SIZE)
        if cfg.finish_hook is not None and not cfg.finish_hook.all_ranks:
            validate_ranks(cfg.finish_hook.ranks, WORLD_SIZE, field="finish_hook.ranks")
    except ValueError as exc:
        raise ValueError(f"{exc}; the demo has {WORLD_SIZE} ranks") from None
    return cfg, steps_total


def check_slow_factor(factor: float) -> float:
    """``factor`` unless it is below 1 or not finite."""
    if not 1 <= factor < float("inf"):
        raise ValueError(f"'slow_factor' must be a finite number >= 1 (1: no straggler): {factor}")
    return factor


def _sort_key(path: Path) -> tuple[int, int, str, str]:
    name = parse_trace_name(path.name)
    if name is None:
        return (1 << 30, 0, "", path.name)
    return (name.step, name.rank, name.stage, path.name)


def _header(cfg: ProfilerConfig, steps_total: int, slow_factor: float, save_path: Path) -> list[str]:
    actor = ",".join(map(str, ACTOR_RANKS))
    rollout = ",".join(map(str, ROLLOUT_RANKS))
    slow = f"rank {SLOW_RANK} planted {slow_factor:g}x slower" if slow_factor > 1 else "no rank planted slower"
    lines = [
        f"ppo demo: {WORLD_SIZE} processes on gloo, {steps_total} steps: actor ranks {actor}, rollout ranks "
        f"{rollout} ({slow}), batch {ppo.BATCH}, {ppo.NUM_MINI_BATCHES} mini-batches per update",
    ]
    profiled = [s for s in range(1, steps_total + 1) if cfg.profiles_step(s)]
    ranks = [r for r in range(WORLD_SIZE) if cfg.profiles_rank(r)]
    if profiled and ranks:
        mode = "discrete" if cfg.discrete else "continuous"
        lines.append(
            f"profiling steps {demo.listed(profiled)} on rank(s) {demo.listed(ranks)} ({cfg.tool}, {mode}); "
            f"the step timeline on every step and rank; into {demo.shown(save_path)}"
        )
    elif cfg.active and cfg.timeline:
        lines.append(f"profiling: the step timeline only, on every step and rank, into {demo.shown(save_path)}")
    else:
        lines.append("profiling: off for this run (the configuration disables it)")
    lines += demo.later_steps_note(cfg, steps_total)
    return lines


def _summary(result: MultiDemoResult, cfg: ProfilerConfig) -> list[str]:
    traces = result.traces
    lines = [f"traces    {len(traces)} in {demo.shown(result.save_path)}/"]
    lines += [f"  {t.name}" for t in traces] or ["  (none)"]
    lines.append(f"manifests {len(result.manifests)} (one per process)")
    lines += [f"  {demo.shown(m)}" for m in result.manifests]
    if result.archive is not None:
        lines.append(f"archive   {demo.shown(result.archive)} (written once, by the finish hook)")
    elif cfg.active and cfg.finish_hook is not None:
        lines.append(f"archive   (no new {demo.ARCHIVE_NAME} next to save_path: the hook writes elsewhere or failed)")
    sync = "the actor's weights" if result.in_sync else "DIFFERENT weights (the weight sync failed)"
    lines.append(f"ranks     all {WORLD_SIZE} ended with {sync}")
    lines.append(f"next      instrument analyze {demo.shown(result.save_path)}   (who waited for whom, across roles)")
    return lines


def train(
    cfg: ProfilerConfig,
    steps_total: int,
    *,
    seed: int = 0,
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    out: TextIO | None = None,
) -> MultiDemoResult:
    """Spawn the :data:`WORLD_SIZE` ranks, print rank 0's line per step and a summary to ``out``; their files.

    ``RuntimeError`` if a rank fails (the others are ended by ``torch.multiprocessing``).
    """
    save_path = Path(cfg.save_path).absolute()
    stream = sys.stdout if out is None else out

    def say(text: Sequence[str]) -> None:
        for line in text:
            print(line, file=stream, flush=True)

    say(_header(cfg, steps_total, check_slow_factor(slow_factor), save_path))
    began = time.time()
    # The parent holds the store the ranks meet at: a free port with no race, and the ranks' clock exchange.
    store = _TCPStore(_HOST, 0, is_master=True, wait_for_workers=False, timeout=_STORE_WAIT)
    spec = _Spec(cfg, steps_total, seed, slow_factor, store.port, echo=out is None)
    lines: Any = mp.get_context("spawn").Queue()
    context = _start_processes(_process, args=(spec, lines), nprocs=WORLD_SIZE, join=False, start_method="spawn")
    rewards: list[float] = []
    reports: dict[int, _Report] = {}

    def drain() -> None:
        while True:
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return
            if item[0] == "step":
                rewards.append(item[2])
                if not spec.echo:
                    say([item[3]])
            else:
                reports[item[1].rank] = item[1]

    try:
        while not context.join(timeout=_POLL_S):
            drain()
    except _Raised as exc:
        raise RuntimeError(f"a rank failed: {str(exc).strip().splitlines()[-1]}") from exc
    except _Exited as exc:
        raise RuntimeError(f"a rank died: {exc}") from exc
    deadline = time.monotonic() + 10  # the queue's feeder may still be flushing the last reports
    while len(reports) < WORLD_SIZE and time.monotonic() < deadline:
        drain()
        time.sleep(_POLL_S)
    drain()
    del store
    if len(reports) < WORLD_SIZE:
        raise RuntimeError(f"only ranks {sorted(reports)} of {WORLD_SIZE} reported back")

    ordered = [reports[r] for r in range(WORLD_SIZE)]
    files = sorted({Path(f) for r in ordered for f in r.files}, key=_sort_key)
    manifests = tuple(p for p in (Path(r.manifest) for r in ordered) if p.is_file())
    archive = save_path.parent / demo.ARCHIVE_NAME
    recorded = tuple(sorted((s, r.rank) for r in ordered for s in r.recorded))
    result = MultiDemoResult(
        files=tuple(files),
        save_path=save_path,
        manifest=manifests[0] if manifests else None,
        archive=archive if archive.is_file() and archive.stat().st_mtime >= began - 1 else None,
        rewards=tuple(rewards),
        profiled_steps=tuple(sorted({s for s, _ in recorded})),
        manifests=manifests,
        recorded=recorded,
        roles=tuple(role_of(r) for r in range(WORLD_SIZE)),
        in_sync=len({r.weights_digest for r in ordered}) == 1,
    )
    say(_summary(result, cfg))
    return result


def run_multi_demo(
    config_path: str | Path = DEFAULT_CONFIG,
    *,
    num_steps: int | None = None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    out: TextIO | None = None,
) -> MultiDemoResult:
    """:func:`prepare` then :func:`train`: the multi-process demo under ``config_path`` plus dotted ``overrides``."""
    cfg, steps_total = prepare(config_path, overrides, num_steps)
    return train(cfg, steps_total, seed=seed, slow_factor=slow_factor, out=out)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success; 1 if a rank failed or a profiled step left no trace; 2 for a bad configuration."""
    parser = argparse.ArgumentParser(
        prog="ppo_demo_multi.py", description="The PPO demo on 4 gloo processes: 2 actor and 2 rollout ranks."
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. ranks=[0,3]")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), metavar="FILE", help="YAML or JSON configuration")
    parser.add_argument(
        "--num-steps", type=int, default=DEFAULT_NUM_STEPS, metavar="N", help=f"RL steps (default {DEFAULT_NUM_STEPS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--slow-factor",
        type=float,
        default=DEFAULT_SLOW_FACTOR,
        metavar="F",
        help=f"rollout rank {SLOW_RANK}'s generate_sequences takes F times as long (default {DEFAULT_SLOW_FACTOR:g}; "
        "1: no straggler)",
    )
    args = parser.parse_args(argv)
    try:
        cfg, steps_total = prepare(args.config, args.overrides, args.num_steps)
        check_slow_factor(args.slow_factor)
    except (ValueError, TypeError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = train(cfg, steps_total, seed=args.seed, slow_factor=args.slow_factor)
    except RuntimeError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    if result.profiled_steps and not result.traces:
        print(f"{parser.prog}: error: profiled steps wrote no trace", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
