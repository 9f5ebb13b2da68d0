"""verl 0.9.1's rollout rules, for configurations in verl's keys (``dialect="verl"``), beside instrument's own.

verl's rollout server drives its engine only when enabled, selected and discrete, with the torch tool
(``_should_profile``), picks replicas as ``{r // (tp*dp*pp)}`` (replica 0 for ``ranks: []``), relocates every
trace of a replica when ``all_ranks`` or no rank is named (``rollout_profiler_global_ranks``) and never runs
the finish command. instrument's own keys keep instrument's rules. Engines are stand-ins writing traces of
known content; files are real.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import instrument as ins
import instrument.testing
from instrument.config import ProfilerConfig
from instrument.finish._coordinator import FinishCoordinator
from instrument.manifest import Manifest
from instrument.rollout import RolloutProfiler, engine_to_drive, replica_profiler_dir, vllm
from instrument.rollout._markers import relocate_replicas
from instrument.rollout.vllm import InProcessEngineDriver

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    instrument.testing.reset()


def _verl(save: Path, *extra: str, discrete: bool = True) -> ProfilerConfig:
    """The rollout's view of a verl configuration: the actor enabled (the rollout follows it), steps 1-2."""
    overrides = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        f"global_profiler.save_path={save}",
        "global_profiler.relocate_results=True",
        f"{ACTOR}.enable=True",
        f"{ROLLOUT}.tool_config.torch.discrete={str(discrete).lower()}",
        *extra,
    ]
    cfg = ProfilerConfig.from_overrides(overrides, role="rollout")
    assert cfg.dialect == "verl"
    return cfg


class _Engine:
    """A stand-in for ``vllm.LLM``: each stop writes one trace per GPU of the replica, named as vLLM 0.32
    names them, holding ``gpu{local}``, plus any ``extra`` names (holding their own name)."""

    def __init__(self, directory: str, gpus: int, extra: tuple[str, ...] = ()) -> None:
        self.directory, self.gpus, self.extra = Path(directory), gpus, extra
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix: str | None = None
        self.starts = 0

    def start_profile(self, profile_prefix: str | None = None) -> None:
        self.starts += 1
        self.prefix = profile_prefix

    def stop_profile(self) -> None:
        for local in range(self.gpus):
            name = f"{self.prefix}_rank{local}.{time.time_ns()}.pt.trace.json.gz"
            (self.directory / name).write_bytes(f"gpu{local}".encode())
        for name in self.extra:
            (self.directory / name).write_bytes(name.encode())


def _drive(
    cfg: ProfilerConfig, tmp_path: Path, *, gpus: int, world: int, extra: tuple[str, ...] = ()
) -> tuple[_Engine, dict[str, bytes]]:
    """Profile step 1 from global rank 0 (replica 0); the engine and what landed in save_path (name -> content)."""
    base = tmp_path / "prof"
    engine = _Engine(replica_profiler_dir(base, 0), gpus, extra)
    profiler = RolloutProfiler(
        cfg,
        InProcessEngineDriver(engine),
        rank=0,
        world_size=world,
        gpus_per_replica=gpus,
        profiler_base=base,
        manifest=Manifest(cfg.save_path),
    )
    profiler.start(1)
    profiler.stop(1)
    save = Path(cfg.save_path)
    moved = {p.name: p.read_bytes() for p in save.glob("rollout_*")} if save.is_dir() else {}
    return engine, moved


def _gpus(moved: dict[str, bytes]) -> list[bytes]:
    return sorted(content for content in moved.values() if content.startswith(b"gpu"))


# --------------------------------------------------------------------------- which engines are driven


@pytest.mark.parametrize("discrete", [True, False])
def test_verl_drives_an_engine_in_discrete_mode_only(tmp_path: Path, discrete: bool) -> None:
    cfg = _verl(tmp_path / "save", discrete=discrete)
    assert cfg.active and cfg.discrete is discrete
    assert engine_to_drive(0, gpus_per_replica=2, world_size=4, config=cfg) == (0 if discrete else None)
    engine, moved = _drive(cfg, tmp_path, gpus=2, world=4)
    assert engine.starts == (1 if discrete else 0)
    assert _gpus(moved) == ([b"gpu0", b"gpu1"] if discrete else [])


def test_instruments_own_keys_drive_an_engine_in_continuous_mode_too(tmp_path: Path) -> None:
    cfg = ProfilerConfig(discrete=False, steps=(1,), save_path=str(tmp_path / "save"))
    assert cfg.dialect == "instrument"
    engine, moved = _drive(cfg, tmp_path, gpus=1, world=1)
    assert engine.starts == 1
    assert _gpus(moved) == [b"gpu0"]


def test_continuous_verl_says_once_why_the_engine_is_not_profiled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="instrument")
    _drive(_verl(tmp_path / "save", discrete=False), tmp_path, gpus=1, world=1)
    said = [r for r in caplog.records if "does not profile its engine" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "discrete mode only" in said[0].getMessage()


def test_only_a_replicas_driving_rank_says_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="instrument")
    cfg = _verl(tmp_path / "save", discrete=False)
    driver = InProcessEngineDriver(_Engine(replica_profiler_dir(tmp_path / "prof", 0), 2))
    for rank in (1, 3):  # TP peers never drive their replica: nothing to say
        RolloutProfiler(
            cfg,
            driver,
            rank=rank,
            world_size=4,
            gpus_per_replica=2,
            profiler_base=tmp_path,
            manifest=Manifest(cfg.save_path),
        )
    assert not [r for r in caplog.records if "does not profile its engine" in r.getMessage()]


@pytest.mark.parametrize("tool", ["nsys", "torch_memory"])
def test_verl_profiles_an_engine_with_the_torch_tool_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tool: str
) -> None:
    cfg = _verl(tmp_path / "save", f"global_profiler.tool={tool}")
    assert cfg.active
    assert engine_to_drive(0, gpus_per_replica=1, world_size=1, config=cfg) is None
    engine, _ = _drive(cfg, tmp_path, gpus=1, world=1)
    assert engine.starts == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("torch tool only" in m and repr(cfg.tool) in m for m in warned)


def test_instruments_own_keys_drive_an_engine_whatever_the_tool() -> None:
    cfg = ProfilerConfig(tool="nvtx", steps=(1,))
    assert engine_to_drive(0, gpus_per_replica=1, world_size=1, config=cfg) == 0


@pytest.mark.parametrize(
    ("extra", "replicas"),
    [
        ((), {0}),  # ranks: [] is replica 0 only
        ((f"{ACTOR}.ranks=[3,4]",), {1, 2}),  # global ranks -> the replicas holding them: r // (tp*dp*pp)
        ((f"{ACTOR}.ranks=[7]",), {3}),
        ((f"{ACTOR}.all_ranks=True",), {0, 1, 2, 3}),
        ((f"{ACTOR}.enable=False",), set()),
    ],
)
def test_verl_selects_replicas_by_the_global_ranks_they_hold(
    tmp_path: Path, extra: tuple[str, ...], replicas: set[int]
) -> None:
    cfg = _verl(tmp_path / "save", *extra)
    driven = {engine_to_drive(g, gpus_per_replica=2, world_size=8, config=cfg) for g in range(8)} - {None}
    assert driven == replicas


# --------------------------------------------------------------------------- which traces are kept


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ((), [b"gpu0", b"gpu1"]),  # ranks: [] keeps every trace of replica 0, its TP peer too
        ((f"{ACTOR}.all_ranks=True",), [b"gpu0", b"gpu1"]),
        ((f"{ACTOR}.ranks=[0]",), [b"gpu0"]),  # a named rank keeps only its own
        ((f"{ACTOR}.ranks=[1]",), [b"gpu1"]),
    ],
)
def test_verl_relocation_keeps_the_named_ranks_or_every_trace(
    tmp_path: Path, extra: tuple[str, ...], kept: list[bytes]
) -> None:
    cfg = _verl(tmp_path / "save", *extra)
    unreadable = "engine-summary.pt.trace.json.gz"  # no rank in the name: always kept
    _, moved = _drive(cfg, tmp_path, gpus=2, world=4, extra=(unreadable,))
    assert _gpus(moved) == kept
    assert [name for name, content in moved.items() if content == unreadable.encode()] == [
        f"rollout_engine_step1_rank-unknown-of-4_replica0_{unreadable}"
    ]
    left = sorted(p.read_bytes() for p in (tmp_path / "prof" / "replica0").iterdir())
    assert left == sorted({b"gpu0", b"gpu1"} - set(kept))  # TP peers not kept stay where the engine wrote them


def test_instruments_own_ranks_keep_only_their_traces(tmp_path: Path) -> None:
    """instrument's ranks are the traces kept: [0] drops the TP peer, unless keep_engine_peers says otherwise."""
    cfg = ProfilerConfig(steps=(1,), ranks=(0,), save_path=str(tmp_path / "a"))
    assert _gpus(_drive(cfg, tmp_path / "a", gpus=2, world=4)[1]) == [b"gpu0"]
    peers = ProfilerConfig(steps=(1,), ranks=(0,), keep_engine_peers=True, save_path=str(tmp_path / "b"))
    assert _gpus(_drive(peers, tmp_path / "b", gpus=2, world=4)[1]) == [b"gpu0", b"gpu1"]


def test_native_ranks_over_verl_keys_name_the_traces_kept(tmp_path: Path) -> None:
    """A native ``ranks`` wins over verl's ``[]``, and with it verl's keep-everything rule goes."""
    overrides = ["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{ACTOR}.enable=True"]
    assert ProfilerConfig.from_overrides(overrides, role="rollout").keep_engine_peers
    cfg = ProfilerConfig.from_overrides([*overrides, "ranks=[0]"], role="rollout")
    assert (cfg.ranks, cfg.keep_engine_peers) == ((0,), False)


@pytest.mark.parametrize(("extra", "moved"), [((), 2), ((f"{ACTOR}.ranks=[0]",), 1)])
def test_the_clis_relocation_follows_the_same_rule(tmp_path: Path, extra: tuple[str, ...], moved: int) -> None:
    cfg = _verl(tmp_path / "save", *extra)
    base = tmp_path / "prof"
    for replica in (0, 1):
        directory = Path(replica_profiler_dir(base, replica))
        directory.mkdir(parents=True)
        for local in (0, 1):
            (directory / f"step1_rank{local}.{local + 1}00.pt.trace.json.gz").write_bytes(
                f"r{replica}g{local}".encode()
            )
    moves = relocate_replicas(
        base,
        save_path=cfg.save_path,
        step=1,
        config=cfg,
        gpus_per_replica=2,
        world_size=4,
        since_ns=None,
        traces=vllm.TRACES,
        publish=None,
        quiet_s=0.05,
    )
    assert [(m.replica, len(m.moved), m.dropped) for m in moves] == [(0, moved, 2 - moved), (1, 0, 2)]
    contents = sorted((Path(cfg.save_path) / name).read_bytes() for m in moves for name in m.moved)
    assert contents == [b"r0g0", b"r0g1"][:moved]


# --------------------------------------------------------------------------- the finish hook


def _hook_config(tmp_path: Path, *, verl: bool) -> ProfilerConfig:
    cmd = 'echo "$INSTRUMENT_PROFILE_ROLE" >> "$INSTRUMENT_PROFILE_SAVE_PATH/hook-ran"'
    if verl:
        return _verl(tmp_path, f"global_profiler.finish_hook_cmd={cmd}")
    return ProfilerConfig(steps=(1, 2), save_path=str(tmp_path), finish_hook={"cmd": cmd, "output": "log"})


def _ran(tmp_path: Path) -> list[str]:
    marker = tmp_path / "hook-ran"
    return marker.read_text().split() if marker.exists() else []


@pytest.mark.parametrize(
    ("verl", "role", "runs"), [(True, "rollout", False), (True, "actor", True), (False, "rollout", True)]
)
def test_the_rollout_role_never_runs_the_finish_hook_in_verls_dialect(
    tmp_path: Path, verl: bool, role: str, runs: bool
) -> None:
    cfg = _hook_config(tmp_path, verl=verl)
    failures: list[Any] = []
    hook = FinishCoordinator(cfg, role=role, rank=0, world_size=1, fail=lambda *a: failures.append(a))
    hook.run(steps=[1, 2], manifest=str(tmp_path / "m.jsonl"), wait_for_exports=lambda: None)
    assert _ran(tmp_path) == ([role] if runs else [])
    assert hook.ran and not failures  # once either way: a later call does not run it


def test_a_configured_rollout_process_in_verls_dialect_ends_without_the_hook(tmp_path: Path) -> None:
    cfg = _hook_config(tmp_path, verl=True)
    with instrument.testing.capture():
        ins.configure(cfg, role="rollout", rank=0, world_size=1)
        for step in (1, 2):
            with ins.profile_step(step):
                pass
        ins.finish()
    assert _ran(tmp_path) == []
    with instrument.testing.capture():
        ins.configure(cfg, role="actor_rollout", rank=0, world_size=1)  # verl's fused worker runs it
        for step in (1, 2):
            with ins.profile_step(step):
                pass
    assert _ran(tmp_path) == ["actor_rollout"]
