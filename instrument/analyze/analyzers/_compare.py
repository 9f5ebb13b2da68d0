"""Two runs compared: what changed beyond the noise, by the run's own structure (pure: plain values in and out).

Input: each run as a :class:`RunSide` — per (role, stage) the duration of every stage instance (one rank's
stage in one step) from the step timeline and from the traces, the step times, the timeline's summary, the
windows and stages nested in each stage — made from a :class:`~instrument.analyze.Report` by
:func:`side_from_report`. Output:
the :mod:`..model` values. Beside it: the test and interval (:mod:`._compare_stats`) and the words
(:mod:`._compare_words`).

- **Samples.** Per (role, stage), the per-(step, rank) durations: from the timeline when both runs have it
  for that stage (every step, every rank), else from the traces; ranks only one run has are left out when
  the runs share some. The step: each step's wall time.
- **Judged** by :func:`~._compare_stats.judge`: Mann-Whitney U at ``alpha``, reported from ``min_change_pct``.
- **The machine.** A change common to the stages (:func:`~._compare_stats.machine_shift`: the median of their
  log ratios) is the machine's, not a stage's: when most stages moved with it, each stage is judged against
  the baseline times it, and is its own change only when it also stands out from the stages' spread.
- **Causes** of a reported change: the ops and kernels whose time per stage instance changed most
  (:func:`op_causes`, from the trace files :func:`pick_files` chose), the windows and nested stages of the
  timeline (:func:`inner_causes`); medians over the instances, 0 where one did not run.
- **The timeline's view** (:func:`timeline_comparison`): idle share per role, the critical path per step.

See ``docs/compare.md``. The inputs, the judgement and the causes all work on :class:`RunSide` and its
per-instance maps; the rulers mark the parts (inputs, comparing, causes, the timeline's view).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from instrument import naming
from instrument.analyze.analyzers._compare_stats import Judged, judge, machine_shift, stands_out
from instrument.analyze.model import (
    Cause,
    Change,
    Filters,
    MachineShift,
    Method,
    OpTable,
    Overlap,
    PathShare,
    Report,
    RoleIdle,
    TimelineComparison,
    TimelineReport,
    Verdict,
    label_key,
)

__all__ = [
    "TOP_CAUSES",
    "Instance",
    "RunSide",
    "StageSamples",
    "TimelineSummary",
    "compare_sides",
    "hosts_of",
    "inner_causes",
    "instances_of",
    "op_causes",
    "pick_files",
    "rank_order",
    "side_from_report",
    "steps_of",
    "timeline_comparison",
    "timeline_samples",
    "with_causes",
]

TOP_CAUSES = 5
"""Ops and kernels listed per change (and as many windows or nested stages)."""

_NS_PER_MS = 1_000_000

Instance = tuple[int | None, str]
"""One stage instance: (step, rank label)."""
Key = tuple[str, str]
"""(role, stage) as label keys."""


# --------------------------------------------------------------------------- the inputs


@dataclass
class StageSamples:
    """One (role, stage) of one run from one source: every instance's duration (ms)."""

    role: str
    stage: str
    values: dict[Instance, float] = field(default_factory=dict)
    comm: dict[Instance, float] = field(default_factory=dict)
    """Time (ms) the CPU side was blocked in collectives, per instance (traces)."""
    files: dict[Instance, tuple[str, ...]] = field(default_factory=dict)
    """The trace files each instance was measured from (traces)."""


@dataclass
class TimelineSummary:
    """A run's step timeline summed over its steps: rank-time busy and idle per role, the critical path."""

    steps: int
    aligned: bool
    wall_ms: float
    """Summed over steps."""
    busy_ms: dict[str, float] = field(default_factory=dict)
    idle_ms: dict[str, float] = field(default_factory=dict)
    lanes: dict[str, int] = field(default_factory=dict)
    """(step, lane) pairs per role: what idle time per rank and step is over."""
    path_ms: dict[tuple[str | None, str], float] = field(default_factory=dict)
    """(role, stage) -> time on the critical path, summed over steps."""


@dataclass
class RunSide:
    """One run, as the comparison takes it."""

    label: str
    timeline: dict[Key, StageSamples] = field(default_factory=dict)
    traces: dict[Key, StageSamples] = field(default_factory=dict)
    step_ms: dict[int, float] = field(default_factory=dict)
    step_source: str = "traces"
    summary: TimelineSummary | None = None
    inner: dict[Key, dict[tuple[str, str], dict[Instance, list[float]]]] = field(default_factory=dict)
    """Per (role, stage): (``window`` | ``stage``, name) -> instance -> [ms, calls] of what ran inside it."""
    json_input: bool = False
    hosts: tuple[str, ...] = ()
    """The host names its files carry."""

    def keys(self) -> set[Key]:
        """Every (role, stage) the run holds, from either source."""
        return set(self.timeline) | set(self.traces)

    def ranks(self) -> set[str]:
        """Every rank label of every sample."""
        return {inst[1] for held in (self.timeline, self.traces) for s in held.values() for inst in s.values}

    def names(self, key: Key) -> tuple[str, str]:
        """(role, stage) as the run writes them."""
        held = self.timeline.get(key) or self.traces[key]
        return held.role, held.stage


def _ms(value: float) -> float:
    """``value`` at the precision ``--json`` keeps (µs): a saved analysis compares as the live one."""
    return round(value, 3)


def side_from_report(
    label: str,
    report: Report,
    *,
    filters: Filters | None = None,
    timeline_rows: Iterable[tuple[str, str, str, int, int, int, int, int]] | None = None,
    json_input: bool = False,
) -> RunSide:
    """One run from its analysis (live, or :meth:`~instrument.analyze.Report.from_dict` of a saved one) and,
    when there are any, its timeline spans (kind, role, stage, step, rank, start ns, end ns, thread), kept by
    ``filters``; durations at the precision ``--json`` keeps."""
    ranks = None if filters is None else filters.ranks
    steps = None if filters is None else filters.steps
    side = RunSide(label=label, json_input=json_input, hosts=hosts_of(report))
    for row in report.stages:
        if (
            (steps is not None and (row.step is None or row.step not in steps))
            or (filters is not None and not filters.keeps_stage(row.stage))
            or row.stage.startswith(naming.SDK_STAGE_PREFIX)
        ):
            continue
        key = (label_key(row.role), label_key(row.stage))
        held = side.traces.setdefault(key, StageSamples(row.role, row.stage))
        for member in row.ranks:
            if ranks is not None and (member.rank is None or member.rank not in ranks):
                continue
            instance = (row.step, member.label)
            held.values[instance] = held.values.get(instance, 0.0) + _ms(member.wall_ms)
            held.comm[instance] = held.comm.get(instance, 0.0) + _ms(member.comm_ms)
            held.files[instance] = held.files.get(instance, ()) + member.files
        if not held.values:
            del side.traces[key]
    if report.timeline is not None:
        _timeline_from(side, report.timeline, steps)
    if timeline_rows is not None:
        side.timeline, side.inner = timeline_samples(timeline_rows)
    if not side.step_ms:  # no timeline: a step is as long as its stages' median wall times together
        sums: dict[int, float] = defaultdict(float)
        for held in side.traces.values():
            by_step: dict[int, list[float]] = defaultdict(list)
            for (step, _), ms in held.values.items():
                if step is not None:
                    by_step[step].append(ms)
            for step, walls in by_step.items():
                sums[step] += statistics.median(walls)
        side.step_ms, side.step_source = dict(sums), "traces"
    return side


def hosts_of(report: Report) -> tuple[str, ...]:
    """The host names the run's trace file names and timeline headers carry, sorted."""
    if report.run is not None and report.run.hosts:
        return report.run.hosts
    hosts = {
        parsed.host
        for row in report.stages
        for member in row.ranks
        for path in member.files
        if (parsed := naming.parse_trace_name(path)) is not None and parsed.host
    }
    if report.timeline_spans is not None:
        hosts.update(lane.host for lane in report.timeline_spans.lanes if lane.host)
    return tuple(sorted(hosts))


def _timeline_from(side: RunSide, timeline: TimelineReport, steps: Container[int] | None) -> None:
    """The step times and the summary, from the analysis's timeline."""
    if timeline.source == "traces":  # only the traced steps and ranks: the traces' rows compare them
        return
    summary = TimelineSummary(steps=0, aligned=timeline.clock.aligned, wall_ms=0.0)
    for row in timeline.steps:
        if steps is not None and row.step not in steps:
            continue
        wall = _ms(row.user_wall_ms)  # the user's step: the SDK's own time on a traced step is no change of theirs
        side.step_ms[row.step] = wall
        summary.steps += 1
        summary.wall_ms += wall
        for role, part in sorted(row.roles.items()):  # as --json orders them
            summary.busy_ms[role] = summary.busy_ms.get(role, 0.0) + _ms(part.busy_ms)
            summary.idle_ms[role] = summary.idle_ms.get(role, 0.0) + _ms(part.idle_ms)
            summary.lanes[role] = summary.lanes.get(role, 0) + part.ranks
        for share in row.critical_path:
            if share.stage.startswith(naming.SDK_STAGE_PREFIX):  # the SDK's own time: never a user's stage
                continue
            where = (share.role, share.stage)
            summary.path_ms[where] = summary.path_ms.get(where, 0.0) + _ms(share.ms)
    side.step_source = "timeline"
    side.summary = summary if summary.steps else None


def _union_ms(pairs: list[tuple[int, int]]) -> float:
    pairs.sort()
    total, reach_start, reach_end = 0, pairs[0][0], pairs[0][1]
    for start, end in pairs[1:]:
        if start > reach_end:
            total += reach_end - reach_start
            reach_start, reach_end = start, end
        elif end > reach_end:
            reach_end = end
    return (total + reach_end - reach_start) / _NS_PER_MS


def timeline_samples(
    rows: Iterable[tuple[str, str, str, int, int, int, int, int]],
) -> tuple[dict[Key, StageSamples], dict[Key, dict[tuple[str, str], dict[Instance, list[float]]]]]:
    """Per (role, stage), each (step, rank)'s time in it (the union of its calls), and what ran inside
    each stage: windows and nested stages, per instance (by containment on the same thread)."""
    calls: dict[tuple[Key, Instance], list[tuple[int, int]]] = defaultdict(list)
    names: dict[Key, tuple[str, str]] = {}
    threads: dict[tuple[int, int, int], list[tuple[int, int, str, str, str]]] = defaultdict(list)
    for kind, role, stage, step, rank, start, end, thread in rows:
        if kind == "step" or end < start or stage.startswith(naming.SDK_STAGE_PREFIX):
            continue
        if kind == "stage":
            key = (label_key(role), label_key(stage))
            names.setdefault(key, (role, stage))
            calls[(key, (step, str(rank)))].append((start, end))
        threads[(rank, step, thread)].append((start, end, kind, role, stage))
    samples: dict[Key, StageSamples] = {}
    for (key, instance), pairs in calls.items():
        held = samples.setdefault(key, StageSamples(*names[key]))
        held.values[instance] = _union_ms(pairs)
    inner: dict[Key, dict[tuple[str, str], dict[Instance, list[float]]]] = {}
    for (rank, step, _), spans in threads.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_stages: list[tuple[int, int, str, str]] = []  # end, start, role, stage
        for start, end, kind, role, stage in spans:
            while open_stages and open_stages[-1][0] < end:  # not inside: closed before this one ends
                open_stages.pop()
            if open_stages:
                _, _, parent_role, parent_stage = open_stages[-1]
                name = stage if kind == "window" or role == parent_role else f"{role} {stage}"
                what = (kind, name)
                parent = (label_key(parent_role), label_key(parent_stage))
                cell = inner.setdefault(parent, {}).setdefault(what, {}).setdefault((step, str(rank)), [0.0, 0.0])
                cell[0] += (end - start) / _NS_PER_MS
                cell[1] += 1
            if kind == "stage":
                open_stages.append((end, start, role, stage))
    return samples, inner


# --------------------------------------------------------------------------- comparing


def _median_by_rank(values: Mapping[Instance, float]) -> dict[str, float]:
    by_rank: dict[str, list[float]] = defaultdict(list)
    for (_, rank), ms in values.items():
        by_rank[rank].append(ms)
    return {rank: statistics.median(v) for rank, v in by_rank.items()}


def _moved(
    b: Mapping[Instance, float], c: Mapping[Instance, float], change_pct: float, least: float, against: float = 1.0
) -> tuple[str, ...]:
    """The ranks whose own median moved the way the stage did (beyond the factor ``against``), by at least
    ``least`` %."""
    before, after = _median_by_rank(b), _median_by_rank(c)
    out = []
    for rank in set(before) & set(after):
        if before[rank] <= 0:
            continue
        own = 100.0 * (after[rank] / (before[rank] * against) - 1.0)
        if own * change_pct > 0 and abs(own) >= least:
            out.append(rank)
    return tuple(sorted(out, key=rank_order))


def rank_order(label: str) -> tuple[int, int | str]:
    return (0, int(label)) if label.isdigit() else (1, label)


def _share(comm: Mapping[Instance, float], values: Mapping[Instance, float]) -> float | None:
    shares = [100.0 * comm.get(i, 0.0) / ms for i, ms in values.items() if ms > 0]
    return statistics.median(shares) if shares else None


def compare_sides(
    baseline: RunSide, candidate: RunSide, method: Method
) -> tuple[Change, list[Change], Overlap, list[str], MachineShift | None]:
    """The step and every (role, stage) both runs hold, judged (causes not yet added) against the machine-wide
    shift where one is common; what they share; notes; the shift."""
    notes: list[str] = []
    ranks_b, ranks_c = baseline.ranks(), candidate.ranks()
    common = ranks_b & ranks_c
    if ranks_b and ranks_c and not common:
        notes.append("the runs share no rank: every rank of each is compared")
    keep = common if common else ranks_b | ranks_c

    keys_b, keys_c = baseline.keys(), candidate.keys()
    measured: list[tuple[Key, str, dict[Instance, float], dict[Instance, float], Judged]] = []
    for key in sorted(keys_b & keys_c):
        source, before, after = _pick(key, baseline, candidate)
        b = {i: v for i, v in before.values.items() if i[1] in keep}
        c = {i: v for i, v in after.values.items() if i[1] in keep}
        measured.append((key, source, b, c, _judge(list(b.values()), list(c.values()), method)))
    machine = _machine(measured, method)
    against = machine.factor if machine is not None and machine.common else None

    changes: list[Change] = []
    for key, source, b, c, raw in measured:
        judged = raw
        relative: Judged | None = None
        if against is not None and raw.verdict != Verdict.TOO_FEW:
            relative = _judge(list(b.values()), list(c.values()), method, against)
            verdict = relative.verdict
            if (
                verdict == Verdict.CHANGED
                and machine is not None
                and raw.baseline_ms > 0  # from nothing to something stands out of any shift
                and raw.candidate_ms > 0
                and not stands_out(raw.candidate_ms / raw.baseline_ms, machine)
            ):
                verdict = Verdict.MACHINE  # beyond noise, yet no further from the shift than the stages scatter
            judged = raw._replace(p_value=relative.p_value, verdict=verdict)
        role, stage = baseline.names(key)
        moved: tuple[str, ...] = ()
        size = relative.change_pct if relative is not None else judged.change_pct
        if judged.verdict == Verdict.CHANGED and size is not None:
            moved = _moved(b, c, size, method.min_change_pct, against or 1.0)
        comm = None
        held_b, held_c = baseline.traces.get(key), candidate.traces.get(key)
        if held_b is not None and held_c is not None and (held_b.comm or held_c.comm):
            comm = (_share(held_b.comm, held_b.values), _share(held_c.comm, held_c.values))
        changes.append(
            Change(
                role=role,
                stage=stage,
                **judged._asdict(),
                samples=(len(b), len(c)),
                source=source,
                ranks=(len({i[1] for i in b}), len({i[1] for i in c})),
                steps=(len({i[0] for i in b}), len({i[0] for i in c})),
                moved_ranks=moved,
                comm_share=comm,
                machine_pct=None if relative is None or machine is None else machine.pct,
                relative_pct=None if relative is None else relative.change_pct,
                relative_ci_pct=None if relative is None else relative.ci_pct,
            )
        )
    changes.sort(key=lambda ch: (-abs(ch.delta_ms), ch.label))

    step_b, step_c = list(baseline.step_ms.values()), list(candidate.step_ms.values())
    judged = _judge(step_b, step_c, method)
    step_source = baseline.step_source if baseline.step_source == candidate.step_source else "mixed"
    step = Change(
        role=None,
        stage=None,
        **judged._asdict(),
        samples=(len(step_b), len(step_c)),
        source=step_source,
        steps=(len(step_b), len(step_c)),
    )

    roles_b = {k[0]: baseline.names(k)[0] for k in keys_b}
    roles_c = {k[0]: candidate.names(k)[0] for k in keys_c}
    overlap = Overlap(
        ranks=(len(ranks_b), len(ranks_c)),
        common_ranks=tuple(sorted(common, key=rank_order)),
        only_baseline_ranks=tuple(sorted(ranks_b - ranks_c, key=rank_order)) if common else (),
        only_candidate_ranks=tuple(sorted(ranks_c - ranks_b, key=rank_order)) if common else (),
        only_baseline_roles=tuple(sorted(roles_b[r] for r in set(roles_b) - set(roles_c))),
        only_candidate_roles=tuple(sorted(roles_c[r] for r in set(roles_c) - set(roles_b))),
        only_baseline_stages=tuple(sorted(baseline.names(k) for k in keys_b - keys_c)),
        only_candidate_stages=tuple(sorted(candidate.names(k) for k in keys_c - keys_b)),
        hosts=(baseline.hosts, candidate.hosts),
    )
    return step, changes, overlap, notes, machine


def _machine(
    measured: Sequence[tuple[Key, str, dict[Instance, float], dict[Instance, float], Judged]], method: Method
) -> MachineShift | None:
    """The shift common to the stages with a verdict (each stage's ratio of medians, and its own direction)."""
    ratios: list[float] = []
    directions: list[int] = []
    for *_, judged in measured:
        if judged.verdict == Verdict.TOO_FEW or judged.baseline_ms <= 0 or judged.candidate_ms <= 0:
            continue
        ratios.append(judged.candidate_ms / judged.baseline_ms)
        beyond = judged.verdict in (Verdict.CHANGED, Verdict.SMALL)
        directions.append(0 if not beyond else 1 if judged.candidate_ms > judged.baseline_ms else -1)
    return machine_shift(ratios, directions, min_change_pct=method.min_change_pct)


def _judge(baseline: list[float], candidate: list[float], method: Method, against: float = 1.0) -> Judged:
    return judge(
        baseline,
        candidate,
        alpha=method.alpha,
        min_change_pct=method.min_change_pct,
        min_samples=method.min_samples,
        against=against,
    )


def _pick(key: Key, baseline: RunSide, candidate: RunSide) -> tuple[str, StageSamples, StageSamples]:
    """The source both runs have for ``key``: the timeline first (every step and rank), else the traces."""
    if key in baseline.timeline and key in candidate.timeline:
        return "timeline", baseline.timeline[key], candidate.timeline[key]
    if key in baseline.traces and key in candidate.traces:
        source = "json" if baseline.json_input or candidate.json_input else "traces"
        return source, baseline.traces[key], candidate.traces[key]
    before = baseline.timeline.get(key) or baseline.traces[key]
    after = candidate.timeline.get(key) or candidate.traces[key]
    return "mixed", before, after


# --------------------------------------------------------------------------- causes


def _median_of(values: Sequence[float], size: int) -> float:
    """The median of ``values`` padded with zeros to ``size`` (the instances where it did not run)."""
    return float(statistics.median([*values, *([0.0] * (size - len(values)))])) if size else 0.0


def _cause(
    kind: str,
    name: str,
    before: Sequence[list[float]],
    after: Sequence[list[float]],
    sizes: tuple[int, int],
    comm: bool,
) -> Cause:
    return Cause(
        kind=kind,
        name=name,
        baseline_ms=_median_of([v[0] for v in before], sizes[0]),
        candidate_ms=_median_of([v[0] for v in after], sizes[1]),
        baseline_count=_median_of([v[1] for v in before], sizes[0]),
        candidate_count=_median_of([v[1] for v in after], sizes[1]),
        communication=comm,
    )


def op_causes(baseline: Sequence[OpTable], candidate: Sequence[OpTable], limit: int = TOP_CAUSES) -> tuple[Cause, ...]:
    """The ops and kernels whose time per stage instance (the median over the instances read, 0 where one did
    not run) changed most, new and vanished ones included; one table per instance and side."""
    if not baseline or not candidate:
        return ()
    keys = {key for table in (*baseline, *candidate) for key in table.rows}
    comm = {key for table in (*baseline, *candidate) for key in table.comm}
    sizes = (len(baseline), len(candidate))
    causes = [
        _cause(
            key[0],
            key[1],
            [t.rows[key] for t in baseline if key in t.rows],
            [t.rows[key] for t in candidate if key in t.rows],
            sizes,
            key in comm,
        )
        for key in keys
    ]
    causes.sort(key=lambda cause: (-abs(cause.delta_ms), cause.kind, cause.name))
    return tuple(c for c in causes[:limit] if c.delta_ms != 0)


def inner_causes(
    baseline: Mapping[tuple[str, str], Mapping[Instance, list[float]]],
    candidate: Mapping[tuple[str, str], Mapping[Instance, list[float]]],
    instances: tuple[int, int],
    limit: int = TOP_CAUSES,
) -> tuple[Cause, ...]:
    """The windows and nested stages (timeline) whose time per stage instance (the median over the stage's
    ``instances`` on each side, 0 where one did not run) changed most."""
    if not instances[0] or not instances[1]:
        return ()
    causes = [
        _cause(
            key[0],
            key[1],
            list(baseline.get(key, {}).values()),
            list(candidate.get(key, {}).values()),
            instances,
            False,
        )
        for key in set(baseline) | set(candidate)
    ]
    causes.sort(key=lambda cause: (-abs(cause.delta_ms), cause.kind, cause.name))
    return tuple(c for c in causes[:limit] if c.delta_ms != 0)


def with_causes(
    change: Change,
    causes: Sequence[Cause],
    *,
    causes_from: str | None,
    note: str | None,
    kernel_comm: tuple[float | None, float | None] | None = None,
) -> Change:
    """``change`` with its causes, largest ``|delta_ms|`` first."""
    ordered = tuple(sorted(causes, key=lambda c: (-abs(c.delta_ms), c.kind, c.name)))
    return replace(change, causes=ordered, causes_from=causes_from, causes_note=note, kernel_comm_share=kernel_comm)


def instances_of(samples: StageSamples) -> dict[str, set[Instance]]:
    """Each trace file and the stage instances it was measured for."""
    out: dict[str, set[Instance]] = defaultdict(set)
    for instance, files in samples.files.items():
        for path in files:
            out[path].add(instance)
    return out


def pick_files(samples: StageSamples, want: int) -> tuple[list[str], set[Instance]]:
    """Files spread across ranks, then steps, until they stand for ``want`` whole instances (or all; half as
    many where each file stands for two or more)."""
    by_rank: dict[str, list[Instance]] = defaultdict(list)
    for instance in sorted(samples.files, key=lambda i: (-1 if i[0] is None else i[0], i[1])):
        by_rank[instance[1]].append(instance)
    order: list[Instance] = []
    queues = [by_rank[r] for r in sorted(by_rank, key=rank_order)]
    while any(queues):
        for queue in queues:
            if queue:
                order.append(queue.pop(0))
    users = instances_of(samples)
    chosen: list[str] = []
    covered: set[Instance] = set()
    for instance in order:
        # enough: ``want`` instances, or half as many where each file holds several (a rank's file of many steps)
        if len(covered) >= want or (2 * len(covered) >= want and len(covered) >= 2 * len(chosen)):
            break
        for path in samples.files[instance]:
            if path not in chosen:
                chosen.append(path)
        held = set(chosen)
        covered = {i for path in chosen for i in users[path] if set(samples.files[i]) <= held}
    return chosen, covered


def steps_of(instances: Iterable[Instance]) -> frozenset[int]:
    """The steps of ``instances`` (those that have one)."""
    return frozenset(step for step, _ in instances if step is not None)


# --------------------------------------------------------------------------- the timeline's view


def timeline_comparison(
    baseline: TimelineSummary | None, candidate: TimelineSummary | None
) -> TimelineComparison | None:
    """Idle share per role and the critical path's composition in both runs (``None`` unless both have a timeline)."""
    if baseline is None or candidate is None:
        return None
    roles = []
    for role in sorted(set(baseline.busy_ms) | set(candidate.busy_ms)):
        roles.append(RoleIdle(role, _idle_pct(baseline, role), _idle_pct(candidate, role)))
    path: list[PathShare] = []
    note = None
    if baseline.path_ms and candidate.path_ms:
        wall_b, wall_c = baseline.wall_ms / baseline.steps, candidate.wall_ms / candidate.steps
        for where in set(baseline.path_ms) | set(candidate.path_ms):
            b = baseline.path_ms.get(where, 0.0) / baseline.steps
            c = candidate.path_ms.get(where, 0.0) / candidate.steps
            path.append(
                PathShare(
                    where[0], where[1], b, c, 100 * b / wall_b if wall_b else 0.0, 100 * c / wall_c if wall_c else 0.0
                )
            )
        path.sort(key=lambda p: (-max(p.baseline_ms, p.candidate_ms), p.role or "", p.stage))
    else:
        note = "no critical path on a side: its hosts' clocks are not aligned"
    return TimelineComparison((baseline.steps, candidate.steps), tuple(roles), tuple(path), note)


def _idle_pct(summary: TimelineSummary, role: str) -> float | None:
    if role not in summary.busy_ms:
        return None
    total = summary.busy_ms[role] + summary.idle_ms.get(role, 0.0)
    return 100.0 * summary.idle_ms.get(role, 0.0) / total if total > 0 else 0.0
