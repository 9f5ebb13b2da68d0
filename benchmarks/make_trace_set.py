"""Generate a multi-rank trace set of real torch.profiler traces, written by instrument itself.

``W`` real processes (a ``torch.multiprocessing`` gloo group, one process per rank) each run one
RL-like step through the public API, continuous mode: ``instrument.configure`` (``discrete=False``,
every rank), ``profile_step``, ``@profiled_stage`` for ``generate_sequences``,
``compute_log_prob``, ``compute_ref_log_prob`` and ``update_actor`` (scheduled, with
``profile_window`` per mini-batch and a gloo ``all_reduce`` of the gradients). Each rank therefore
writes exactly one big trace, ``actor-rollout-ref_continuous_step1_rank{r}-of-{W}_….pt.trace.json.gz``,
which is also what HTA wants (one file per rank: it keeps only the last file it sees for a rank).
One rank is a deliberate straggler: it generates twice as many tokens and sleeps 1 ms per token.

The output directory holds the traces and the SDK's manifests (``instrument-manifest-*.jsonl``,
one per process). HTA takes every name ending in ``.json`` or ``.gz`` as a trace, so the
``.jsonl`` manifests are invisible to it; ``instrument analyze`` reads them first (and writes its
``instrument-analysis.png`` there, which HTA ignores too). Nothing else is written there.

``--replicate K`` is the fast path for slow machines: only ``W / K`` ranks are profiled for real,
and their traces are copied under the other ranks' numbers (the rank and world-size fields of the
trace header, the file name and the manifest are rewritten; the events are the same; the
straggler is not copied, so there is still one). The output says so. Not needed on 2 cores: the
default set takes about 50 s for real.

Run: ``.venv/bin/python benchmarks/make_trace_set.py OUTDIR`` (default 8 ranks, 1,100 generated
tokens per rank, rank 3 the straggler: about 330 MB uncompressed). ``--force`` clears an OUTDIR
left by an earlier run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import socket
import struct
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import instrument as ins

ROLE = "actor_rollout_ref"
HIDDEN = 64
VOCAB = 32
BATCH = 8
MINI_BATCHES = 4
MICRO_BATCHES = 2
STRAGGLER_DELAY_S = 0.001
TRACE_SUFFIX = ".pt.trace.json.gz"
MANIFEST_GLOB = "instrument-manifest-*.jsonl"


# --------------------------------------------------------------------------- the profiled job (one per rank)


def _mlp(out_features: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(), torch.nn.LayerNorm(HIDDEN)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, out_features))


class RLWorker:
    """A fused actor / rollout / reference worker, its stages marked the way a verl worker's would be."""

    def __init__(self, rank: int, tokens: int, delay_s: float = 0.0) -> None:
        torch.manual_seed(rank)
        self.actor, self.ref, self.embed = _mlp(VOCAB), _mlp(VOCAB), torch.nn.Embedding(VOCAB, HIDDEN)
        self.params = [*self.actor.parameters(), *self.embed.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        self.prompts = torch.randint(0, VOCAB, (BATCH,))
        self.tokens = tokens
        self.delay_s = delay_s

    def _log_prob(self, model: torch.nn.Module, seqs: torch.Tensor) -> torch.Tensor:
        logits = model(self.embed(seqs[:, :-1]))
        return torch.log_softmax(logits, -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)

    @ins.profiled_stage("generate_sequences")
    def generate_sequences(self) -> torch.Tensor:
        """Autoregressive sampling, one small forward per token: most of the trace's events."""
        out, token = [self.prompts], self.prompts
        with torch.no_grad():
            for _ in range(self.tokens):
                token = torch.softmax(self.actor(self.embed(token)), -1).argmax(-1)
                out.append(token)
                if self.delay_s:
                    time.sleep(self.delay_s)
        return torch.stack(out, 1)

    @ins.profiled_stage("compute_log_prob")
    def compute_log_prob(self, seqs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([self._log_prob(self.actor, part) for part in seqs.chunk(MICRO_BATCHES)])

    @ins.profiled_stage("compute_ref_log_prob")
    def compute_ref_log_prob(self, seqs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([self._log_prob(self.ref, part) for part in seqs.chunk(MICRO_BATCHES)])

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor(self, seqs: torch.Tensor, old: torch.Tensor, ref: torch.Tensor) -> None:
        """PPO-like updates over the last 16 tokens, gradients all-reduced over gloo per mini-batch."""
        parts = zip(
            seqs[:, -17:].chunk(MICRO_BATCHES),
            old[:, -16:].chunk(MICRO_BATCHES),
            ref[:, -16:].chunk(MICRO_BATCHES),
            strict=True,
        )
        micro = list(parts)
        for i in range(MINI_BATCHES):
            with ins.profile_window(mini_batch=i):
                for part, o, r in micro:
                    new = self._log_prob(self.actor, part)
                    loss = -(torch.exp(new - o) * (o - r)).mean() + 0.01 * (new - r).pow(2).mean()
                    loss.backward()
                for p in self.params:
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                self.opt.step()
                self.opt.zero_grad()

    def step(self) -> None:
        seqs = self.generate_sequences()
        old = self.compute_log_prob(seqs)
        ref = self.compute_ref_log_prob(seqs)
        self.update_actor(seqs, old, ref)


def _worker(rank: int, out: str, world: int, tokens: int, straggler: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # The straggler generates twice the tokens and waits 1 ms per token (a slower host): with more
    # ranks than cores the OS hands it the CPU the others leave while blocked in all_reduce, so
    # double work alone shows as a ratio of only ~1.3.
    slow = rank == straggler
    worker = RLWorker(rank, tokens * (2 if slow else 1), STRAGGLER_DELAY_S if slow else 0.0)
    config = ins.ProfilerConfig(save_path=out, discrete=False, all_ranks=True, steps=(1,), contents=("cpu", "shapes"))
    ins.configure(config, role=ROLE, rank=rank, world_size=world)
    t0 = time.perf_counter()
    with ins.profile_step(1, last=True):
        worker.step()
        dist.barrier()
    written = ins.finish()
    if rank == 0:
        print(f"  rank 0: step profiled and exported in {time.perf_counter() - t0:.1f} s ({len(written)} file)")
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- replication


_RANK_IN_NAME = re.compile(r"_rank(\d+)-of-(\d+)_")


def _copy_as(src: Path, dst: Path, rank: int, world: int) -> None:
    """Copy a trace, rewriting the rank and world size in its header (the events stay as they are)."""
    with gzip.open(src, "rb") as fin:
        head = fin.read(1 << 16)
        # torch writes the metadata (distributedInfo, then instrument's own) before "traceEvents".
        cut = head.find(b'"traceEvents"')
        cut = len(head) if cut < 0 else cut
        header = re.sub(rb'("rank":\s*)\d+', rb"\g<1>" + str(rank).encode(), head[:cut])
        header = re.sub(rb'("world_size":\s*)\d+', rb"\g<1>" + str(world).encode(), header)
        with (
            open(dst, "xb") as raw,
            gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as packed,
        ):
            packed.write(header + head[cut:])
            shutil.copyfileobj(fin, packed, 1 << 20)


def replicate(out: Path, traces: list[Path], world: int, straggler: int) -> int:
    """Turn the ``len(traces)`` real traces into ``world`` ranks; returns how many are copies.

    Rank ``r`` of the set holds the events of real rank ``r % real``, except that the straggler's
    events appear only once (its copies take the next rank's events instead). File names, header
    rank fields and one manifest (replacing the per-process ones) say the new rank and world size.
    """
    real = len(traces)
    by_rank = {int(m.group(1)): p for p in traces if (m := _RANK_IN_NAME.search(p.name))}
    records = {}
    for manifest in out.glob(MANIFEST_GLOB):
        for line in manifest.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            records[Path(record["path"]).name] = record
    lines = []
    for rank in range(world):
        base = rank % real
        if rank >= real and base == straggler:
            base = (straggler + 1) % real
        src = by_rank[base]
        dst = src.with_name(_RANK_IN_NAME.sub(f"_rank{rank}-of-{world}_", src.name, count=1))
        _copy_as(src, dst, rank, world)
        record = {**records[src.name], "path": str(dst), "rank": rank, "world": world, "bytes": dst.stat().st_size}
        lines.append(json.dumps(record, separators=(",", ":")) + "\n")
    for old in [*traces, *out.glob(MANIFEST_GLOB)]:
        old.unlink()
    (out / "instrument-manifest-replicated.jsonl").write_text("".join(lines), encoding="utf-8")
    return world - real


# --------------------------------------------------------------------------- driver


def uncompressed_size(path: Path) -> int:
    """A gzip file's uncompressed size from its trailer (exact below 4 GiB per member)."""
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int(struct.unpack("<I", fh.read(4))[0])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            sys.exit(f"{out} is not empty (use --force to clear a trace set left by an earlier run)")
        foreign = [
            p.name
            for p in out.iterdir()
            if not (
                p.name.endswith(TRACE_SUFFIX)
                or p.match(MANIFEST_GLOB)
                or p.name.startswith((".", "instrument-analysis"))
            )
        ]
        if foreign:
            sys.exit(f"{out} holds files that are not a trace set ({', '.join(foreign[:3])}); not clearing it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--ranks", type=int, default=8, help="ranks in the trace set (default 8)")
    parser.add_argument("--tokens", type=int, default=1100, help="tokens generated per rank (default 1100)")
    parser.add_argument("--straggler", type=int, default=3, help="the rank that does double rollout work (3)")
    parser.add_argument("--replicate", type=int, default=1, metavar="K", help="profile ranks/K, copy the rest")
    parser.add_argument("--force", action="store_true", help="clear OUTDIR if it holds an earlier trace set")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.replicate < 1 or args.ranks % args.replicate:
        parser.error("--ranks must be a positive multiple of --replicate")
    real = args.ranks // args.replicate
    if not 0 <= args.straggler < real or (args.replicate > 1 and real < 2):
        parser.error(f"--straggler must be one of the {real} profiled ranks (at least 2 with --replicate)")

    out = args.outdir.absolute()
    _prepare(out, args.force)
    print(
        f"profiling {real} rank(s) for real (gloo, {os.cpu_count()} cores), {args.tokens} tokens each, "
        f"rank {args.straggler} the straggler (x2 tokens, +1 ms each) -> {out}",
        flush=True,
    )
    t0 = time.perf_counter()
    mp.spawn(_worker, args=(str(out), real, args.tokens, args.straggler, _free_port()), nprocs=real)
    t_real = time.perf_counter() - t0
    traces = sorted(out.glob("*" + TRACE_SUFFIX))
    if len(traces) != real:
        sys.exit(f"expected {real} traces, found {len(traces)} in {out}")

    if args.replicate > 1:
        t1 = time.perf_counter()
        copies = replicate(out, traces, args.ranks, args.straggler)
        print(
            f"REPLICATED: {copies} of {args.ranks} traces are copies of the {real} profiled ranks "
            f"(rank r + k*{real} holds rank r's events; the straggler is not copied), "
            f"{time.perf_counter() - t1:.1f} s"
        )
        traces = sorted(out.glob("*" + TRACE_SUFFIX))

    total = time.perf_counter() - t0
    packed = sum(p.stat().st_size for p in traces)
    plain = sum(uncompressed_size(p) for p in traces)
    print(f"{'rank':>4}  {'uncompressed MB':>15}  {'gzip MB':>8}  file")
    for p in traces:
        m = _RANK_IN_NAME.search(p.name)
        rank = m.group(1) if m else "?"
        print(f"{rank:>4}  {uncompressed_size(p) / 1e6:15.1f}  {p.stat().st_size / 1e6:8.1f}  {p.name}")
    print(
        f"trace set: {len(traces)} traces, {plain / 1e6:.0f} MB uncompressed, {packed / 1e6:.1f} MB gzipped; "
        f"profiling {t_real:.1f} s, total {total:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
