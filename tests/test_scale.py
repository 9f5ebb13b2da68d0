"""4,096 simulated ranks, exact (issue 17 item 1): names, rank selection, replicas, TP peers, relocation.

A job of 4,096 global ranks, 8 GPUs per node and tensor parallelism 8 (a rollout replica spans 8
ranks), several roles, all ranks and selected ranks, scheduled stages with repeating windows. Every
answer the SDK gives is compared, for every rank, with a brute-force oracle written here from the
definitions in ``docs/`` (``g // gpus_per_replica`` and so on), never with the SDK's own helpers.
Relocation moves 4,096 real (tiny) engine trace files through :func:`relocate_engine_traces`.
Small worlds get the same checks as hypothesis properties. No test here reads a clock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import naming, ranks
from instrument.config import ProfilerConfig, Schedule
from instrument.manifest import Manifest, TraceRecord, read_manifests
from instrument.plan import RunPlan, StageSpec, count, plan_run
from instrument.rollout import engine_to_drive, relocate_engine_traces, vllm

WORLD = 4096
TP = 8  # GPUs per rollout replica, and per node
STEPS = (1, 3)
MINI_BATCHES = 8
SCHEDULE = Schedule(wait=0, warmup=1, active=2, repeat=2)  # windows mb1-2 and mb4-5: two repeats per stage
# every TP group's first rank, a few whole groups, and an irregular sprinkle: all the shapes a selection takes
SELECTED = tuple(sorted({*range(0, WORLD, TP), *range(8, 24), *range(4000, 4096), *range(5, WORLD, 97)}))
ROLES = {
    # role: (all_ranks, stages)
    "actor_rollout_ref": (
        True,
        (StageSpec("generate_sequences"), StageSpec("compute_log_prob"), StageSpec("update_actor", scheduled=True)),
    ),
    "critic": (False, (StageSpec("compute_values"), StageSpec("update_critic", scheduled=True))),
}
REPEATS = 2  # an unscheduled stage entered twice in one step: the same prefix twice, told apart by time
# Long host names that all cut to the same 40-character label: hosts collide in names, as pids do
HOST = "gpu-cluster-eu-west-4-rack-017-node-with-a-long-fqdn-{node}.example.internal"


def _oracle_selected(selected: tuple[int, ...], all_ranks: bool, world: int) -> list[int]:
    chosen = set(selected)
    return [g for g in range(world) if all_ranks or g in chosen]


def _config(all_ranks: bool, selected: tuple[int, ...] = SELECTED) -> ProfilerConfig:
    return ProfilerConfig(steps=STEPS, ranks=selected, all_ranks=all_ranks, schedule=SCHEDULE)


def _plans() -> dict[str, RunPlan]:
    return {
        role: plan_run(
            _config(every),
            num_steps=max(STEPS),
            world_size=WORLD,
            num_mini_batches=MINI_BATCHES,
            role=role,
            stages=stages,
        )
        for role, (every, stages) in ROLES.items()
    }


def _process_names(plan: RunPlan, role_index: int) -> Iterator[tuple[str, naming.TraceName]]:
    """Every file name the job's processes write, as each process would: its host (8 ranks a node, all
    hosts the same label), its pid (the same 8 pids on every node), its own strictly increasing clock
    (every process's clock reads the same: the worst case)."""
    clocks: dict[int, int] = {}
    for trace in plan.traces:
        window = None if trace.window is None else (trace.window.first, trace.window.last)
        partial = trace.window is not None and trace.window.partial
        for _ in range(1 if trace.window is not None else REPEATS):
            stamp = clocks[trace.rank] = clocks.get(trace.rank, 1_800_000_000_000_000_000) + 1
            fields = naming.TraceName(
                role=naming.sanitize_label(plan.role),
                stage=naming.sanitize_label(trace.stage),
                step=trace.step,
                rank=trace.rank,
                world_size=plan.world_size,
                host=naming.sanitize_label(HOST.format(node=trace.rank // TP)),
                pid=1000 + 10 * role_index + trace.rank % TP,
                timestamp_ns=stamp,
                window=window,
                partial=partial,
            )
            name = naming.trace_basename(
                role=plan.role, stage=trace.stage, step=trace.step, rank=trace.rank, world_size=plan.world_size,
                host=HOST.format(node=trace.rank // TP), pid=fields.pid, timestamp_ns=stamp,
                window=window, partial=partial,
            ) + naming.TRACE_SUFFIX  # fmt: skip
            assert name.startswith(trace.prefix + "_")
            yield name, fields


def test_4096_ranks_every_name_distinct_and_read_back_exactly() -> None:
    plans = _plans()
    seen: set[str] = set()
    written = 0
    for role_index, plan in enumerate(plans.values()):
        for name, fields in _process_names(plan, role_index):
            written += 1
            assert len(name.encode()) <= 255
            assert naming.parse_trace_name(name) == fields
            seen.add(name)
    assert len({naming.sanitize_label(HOST.format(node=n)) for n in range(WORLD // TP)}) == 1  # hosts collide
    per_rank_step = {role: REPEATS * 2 + 2 if role == "actor_rollout_ref" else REPEATS + 2 for role in ROLES}
    expected = len(STEPS) * (WORLD * per_rank_step["actor_rollout_ref"] + len(SELECTED) * per_rank_step["critic"])
    assert written == expected == len(seen)  # no two processes, repeats or windows share a name


def test_4096_ranks_plan_selects_exactly_the_oracles_ranks_and_windows() -> None:
    for role, plan in _plans().items():
        every, stages = ROLES[role]
        oracle = _oracle_selected(SELECTED, every, WORLD)
        assert list(plan.ranks) == oracle
        assert count(plan.ranks) == len(oracle)
        assert [(w.first, w.last, w.partial) for w in plan.windows] == [(1, 2, False), (4, 5, False)]
        per_step = sum(2 if s.scheduled else 1 for s in stages)
        chosen = set(oracle)
        for g in range(WORLD):
            assert plan.traces.of_rank(g) == (len(STEPS) * per_step if g in chosen else 0)
        assert plan.traces.total == len(oracle) * len(STEPS) * per_step
        assert [t.rank for t in itertools.islice(plan.traces, 0, None, per_step)] == oracle * len(STEPS)


def test_4096_ranks_selection_is_exact_for_every_rank() -> None:
    for every in (True, False):
        config = _config(every)
        oracle = _oracle_selected(SELECTED, every, WORLD)
        chosen = set(oracle)
        assert list(ranks.profiled_ranks(SELECTED, every, WORLD)) == oracle
        for g in range(WORLD):
            assert config.profiles_rank(g) is (g in chosen)
            assert ranks.is_profiled_rank(g, SELECTED, every) is (g in chosen)


@pytest.mark.parametrize("gpus_per_replica", [TP, 2 * TP])  # TP 8; TP 8 x PP 2
def test_4096_ranks_replicas_and_tp_peers_exact_for_every_rank(gpus_per_replica: int) -> None:
    replicas = WORLD // gpus_per_replica
    for every in (True, False):
        config = _config(every)
        chosen = set(_oracle_selected(SELECTED, every, WORLD))
        driven = sorted({g // gpus_per_replica for g in chosen})
        assert list(ranks.replicas_to_drive(SELECTED, every, WORLD, gpus_per_replica)) == driven
        for g in range(WORLD):
            replica, local = divmod(g, gpus_per_replica)
            assert ranks.replica_of(g, gpus_per_replica) == replica
            assert ranks.local_rank_of(g, gpus_per_replica) == local
            drives = replica if local == 0 and replica in driven else None
            assert engine_to_drive(g, gpus_per_replica=gpus_per_replica, world_size=WORLD, config=config) == drives
        for replica in range(replicas):
            members = range(replica * gpus_per_replica, (replica + 1) * gpus_per_replica)
            keep = ranks.ranks_to_keep(replica, SELECTED, every, WORLD, gpus_per_replica)
            assert keep == frozenset(g for g in members if g in chosen)
            for g in members:
                local = g - replica * gpus_per_replica
                for name in _engine_names(local, step=3):
                    assert ranks.engine_trace_rank(name, replica, gpus_per_replica) == g
                    assert ranks.keep_engine_trace(name, replica, gpus_per_replica, keep) is (g in chosen)


def _engine_names(local: int, step: int) -> list[str]:
    """One worker trace name of each form vLLM and SGLang write, for the worker at ``local`` in its replica."""
    return [
        f"step{step}_rank{local}.1790000000000000000.pt.trace.json.gz",  # vLLM >= 0.17 with a prefix
        f"rank{local}.1790000000000000000.pt.trace.json.gz",
        f"worker-{local}-rank-{local}.1790000000000000000.pt.trace.json.gz",  # vLLM < 0.17
        f"1790000000.123-TP-{local}.trace.json.gz",  # SGLang
    ]


def _relocate_all(source: Path, save: Path, selected: tuple[int, ...], every: bool) -> list[TraceRecord]:
    """Every replica's engine writes its 8 worker traces and a frontend trace into its own directory; the
    worker at each driven replica's local rank 0 moves them home, all replicas at once (as in a job)."""
    for replica in range(WORLD // TP):
        folder = source / f"replica{replica}"
        folder.mkdir()
        for local in range(TP):
            (folder / f"step2_rank{local}.{1_790_000_000_000_000_000 + replica}.pt.trace.json.gz").write_bytes(b"x")
        (folder / f"step2_node{replica}_{4000 + replica}.async_llm.1790000000000000000.pt.trace.json.gz").write_bytes(
            b"f"
        )
    manifest = Manifest(save)
    config = _config(every, selected)
    drivers = [
        replica
        for g in range(WORLD)
        if (replica := engine_to_drive(g, gpus_per_replica=TP, world_size=WORLD, config=config)) is not None
    ]
    problems: list[str] = []
    lock = threading.Lock()

    def relocate(replica: int) -> None:
        def report(what: str, exc: BaseException) -> None:
            with lock:
                problems.append(f"{what}: {exc}")

        relocate_engine_traces(
            source / f"replica{replica}", save_path=save, step=2, replica=replica, gpus_per_replica=TP,
            world_size=WORLD, keep_ranks=ranks.ranks_to_keep(replica, selected, every, WORLD, TP),
            manifest=manifest, quiet_s=0.0, timeout_s=60.0, traces=vllm.TRACES, report=report,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(relocate, drivers))
    manifest.close()
    assert problems == []
    return list(read_manifests(save))


@pytest.mark.parametrize("every", [False, True], ids=["selected", "all_ranks"])
def test_relocating_4096_engine_traces_keeps_exactly_the_requested_ranks(tmp_path: Path, every: bool) -> None:
    source, save = tmp_path / "engines", tmp_path / "save"
    source.mkdir()
    records = _relocate_all(source, save, SELECTED, every)
    chosen = _oracle_selected(SELECTED, every, WORLD)
    driven = sorted({g // TP for g in chosen})

    workers = [r for r in records if r.stage == "engine"]
    assert sorted(r.rank for r in workers) == chosen  # each requested global rank once, no TP peer
    frontends = [m for r in records if r.stage == "frontend" and (m := naming.FRONTEND_TRACE.match(r.path))]
    assert sorted(int(m["replica"]) for m in frontends) == driven  # each driven replica's frontend, once
    assert len(records) == len(workers) + len(frontends)
    on_disk = sorted(p.name for p in save.glob("*.pt.trace.json.gz"))
    assert on_disk == sorted(r.path for r in records)  # every moved file listed once, nothing else there
    for record in workers:
        match = naming.ENGINE_TRACE.match(record.path)
        assert match is not None
        assert int(match["rank"]) == record.rank and int(match["replica"]) == record.rank // TP
        assert match["orig"].startswith(f"step2_rank{record.rank % TP}.")
    # TP peers of driven replicas stay where the engine wrote them; undriven replicas are untouched
    left = sorted(p.parent.name + "/" + p.name for p in source.glob("replica*/*"))
    expected_left = [
        f"replica{g // TP}/step2_rank{g % TP}.{1_790_000_000_000_000_000 + g // TP}.pt.trace.json.gz"
        for g in range(WORLD)
        if g not in set(chosen)
    ]
    undriven_frontends = [
        f"replica{n}/step2_node{n}_{4000 + n}.async_llm.1790000000000000000.pt.trace.json.gz"
        for n in range(WORLD // TP)
        if n not in set(driven)
    ]
    assert left == sorted(expected_left + undriven_frontends)


# --------------------------------------------------------------------------- the same, small worlds, any shape


@st.composite
def jobs(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...], bool]:
    gpus_per_replica = draw(st.sampled_from([1, 2, 4, 8]))
    world = gpus_per_replica * draw(st.integers(1, 6))
    selected = tuple(draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True)))
    return world, gpus_per_replica, selected, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(job=jobs())
def test_selection_replicas_and_tp_filtering_equal_the_oracle(job: tuple[int, int, tuple[int, ...], bool]) -> None:
    world, per, selected, every = job
    chosen = set(_oracle_selected(selected, every, world))
    config = ProfilerConfig(ranks=selected, all_ranks=every)
    driven = sorted({g // per for g in chosen})
    assert list(ranks.replicas_to_drive(selected, every, world, per)) == driven
    for g in range(world):
        assert config.profiles_rank(g) is (g in chosen)
        drives = g // per if g % per == 0 and g // per in driven else None
        assert engine_to_drive(g, gpus_per_replica=per, world_size=world, config=config) == drives
        keep = ranks.ranks_to_keep(g // per, selected, every, world, per)
        for name in _engine_names(g % per, step=1):
            traces = ranks.trace_names(ranks.parse_engine_trace_name(name).engine)  # type: ignore[union-attr]
            kept = ranks.keep_engine_trace(name, g // per, per, keep, parse=traces.local_rank)
            assert kept is (g in chosen)


@settings(max_examples=150, deadline=None)
@given(
    world=st.integers(1, 24),
    every=st.booleans(),
    data=st.data(),
    sched=st.builds(
        Schedule, wait=st.integers(0, 2), warmup=st.integers(0, 2), active=st.integers(1, 3), repeat=st.integers(0, 3)
    ),
    mini_batches=st.integers(0, 12),
)
def test_every_planned_name_is_distinct_and_parses_back(
    world: int, every: bool, data: st.DataObject, sched: Schedule, mini_batches: int
) -> None:
    selected = tuple(data.draw(st.lists(st.integers(0, world - 1), min_size=1, unique=True)))
    plan = plan_run(
        ProfilerConfig(ranks=selected, all_ranks=every, schedule=sched),
        num_steps=3, world_size=world, num_mini_batches=mini_batches, role="actor",
        stages=(StageSpec("gen"), StageSpec("update", scheduled=True)),
    )  # fmt: skip
    names = [name for name, _ in _process_names(plan, 0)]
    assert len(set(names)) == len(names)
    for name in names:
        parsed = naming.parse_trace_name(name)
        assert parsed is not None and parsed.world_size == world


# --------------------------------------------------------------------------- 4,096 manifests (item 4)

RECORDS_PER_PROCESS = 3


def _record(rank: int, k: int) -> TraceRecord:
    name = naming.trace_basename(
        role="actor", stage=f"stage{k}", step=1, rank=rank, world_size=WORLD, host=f"node{rank // TP}",
        pid=1000 + rank % TP, timestamp_ns=1_790_000_000_000_000_000 + k,
    ) + naming.TRACE_SUFFIX  # fmt: skip
    return TraceRecord(
        path=name, role="actor", stage=f"stage{k}", step=1, rank=rank, world_size=WORLD, bytes=1234, tool="torch"
    )


def _write_manifests(save: Path, cut: dict[int, int | None]) -> list[TraceRecord]:
    """One manifest per process (rank), as :class:`Manifest` writes them; the processes in ``cut`` were
    killed while writing one more line: only its first ``cut[rank]`` bytes reached the file (``None``:
    up to the middle of a two-byte character)."""
    written: list[TraceRecord] = []
    for rank in range(WORLD):
        manifest = Manifest(save)
        manifest.path = save / f"instrument-manifest-node{rank // TP}-pid{1000 + rank % TP}.jsonl"
        for k in range(RECORDS_PER_PROCESS):
            manifest.append(record := _record(rank, k))
            written.append(record)
        manifest.close()
        if rank in cut:
            line = (_record(rank, RECORDS_PER_PROCESS).to_json().replace("actor", "actör") + "\n").encode()
            kept = cut[rank]
            with manifest.path.open("ab") as handle:
                handle.write(line[: line.index("ö".encode()) + 1 if kept is None else kept])
    return written


CUTS: dict[int, int | None] = {7: 1, 100: 17, 2049: 120, 4095: None}  # bytes kept (None: half of a character)


def test_4096_manifests_are_read_whole_once_each_and_a_half_written_last_line_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from instrument import manifest as _manifest

    written = _write_manifests(tmp_path, CUTS)
    opened: list[Path] = []
    parsed: list[str] = []
    open_regular, record = _manifest._open_regular, _manifest._record
    monkeypatch.setattr(_manifest, "_open_regular", lambda path: opened.append(path) or open_regular(path))
    monkeypatch.setattr(_manifest, "_record", lambda text: parsed.append(text) or record(text))
    told: list[tuple[str, str]] = []
    records = list(read_manifests(tmp_path, on_skip=lambda path, reason: told.append((Path(path).name, reason))))

    by_name = sorted(written, key=lambda r: (f"instrument-manifest-node{r.rank // TP}-pid{1000 + r.rank % TP}", r.path))
    assert records == by_name  # every whole record, in manifest order, nothing else
    assert len(opened) == len(set(opened)) == WORLD  # each manifest opened once: linear in the manifests
    assert len(parsed) == len(written) + len(CUTS)  # each line parsed once
    assert told == [
        (f"instrument-manifest-node{rank // TP}-pid{1000 + rank % TP}.jsonl", f"line 4: {_manifest.CUT_SHORT}")
        for rank in sorted(CUTS, key=lambda r: f"instrument-manifest-node{r // TP}-pid{1000 + r % TP}")
    ]


def test_analysis_beside_a_half_written_manifest_line_reads_every_trace(tmp_path: Path) -> None:
    """A rank killed while writing its manifest line: its trace is complete (published before the line)
    and found by its name; the cut line is named once, the rest of the analysis is whole."""
    from instrument.analyze import analyze
    from tests.analyze.test_analyze import known_run

    known_run(tmp_path)
    (manifest,) = tmp_path.glob("instrument-manifest-*.jsonl")
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    report = analyze(tmp_path, jobs=1)
    assert report.files == len(lines)  # the last line's trace too, by its name
    assert [(Path(s.path).name, s.reason) for s in report.skipped] == [
        (manifest.name, f"line {len(lines)}: cut short (no end of line: its writer stopped mid-line, e.g. killed); "
         "the lines before it are read")
    ]  # fmt: skip
