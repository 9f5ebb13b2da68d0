"""What the page shows beside the numbers (:func:`with_details`): the run's facts from its manifests and file
names (:class:`~..model.RunFacts`), and each role's stage's top ops by self time (:class:`~..model.StageOps`).

The facts cost a read of the manifests (a line per file). The ops cost a second read of a bounded set: per
role x stage, the files of one instance (its slowest rank in its last step), each file once for every stage
asked of it (:func:`~._ops.read_ops`, the reader the comparison's causes use): the analysis's scan
sums time, not names, and keeping every op's name there would slow every analysis for the page alone.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from instrument import naming
from instrument.analyze.model import Report, RunFacts, StageOps, StageStats, label_key
from instrument.analyze.traces._ops import read_ops
from instrument.analyze.traces._reader import TraceError
from instrument.manifest import read_manifests

__all__ = ["TOP_OPS", "run_facts", "stage_ops", "with_details"]

TOP_OPS = 5
"""Ops listed per role x stage."""


def with_details(report: Report, top_ops: int = TOP_OPS) -> Report:
    """``report`` with :attr:`~..model.Report.run` and :attr:`~..model.Report.stage_ops` filled in."""
    return replace(report, run=run_facts(report), stage_ops=stage_ops(report, top_ops))


def run_facts(report: Report) -> RunFacts:
    """Hosts, dates, tools, roles with their world sizes and ranks, steps, modes and windows of the files the
    analysis read (a manifest that cannot be read only leaves the tools out)."""
    read = {os.path.basename(f) for s in report.stages for r in s.ranks for f in r.files}
    names = [parsed for f in sorted(read) if (parsed := naming.parse_trace_name(f)) is not None]
    hosts = {n.host for n in names}
    if report.timeline_spans is not None:
        hosts.update(lane.host for lane in report.timeline_spans.lanes if lane.host)
    tools: set[str] = set()
    manifests = 0
    world: dict[str, int] = {}
    try:
        manifests = sum(1 for _ in Path(report.directory).glob("instrument-manifest-*.jsonl"))
        for record in read_manifests(report.directory):
            if os.path.basename(record.path) in read:
                tools.add(record.tool)
                world[label_key(record.role)] = max(record.world_size, world.get(label_key(record.role), 0))
    except OSError:
        pass
    for n in names:
        key = label_key(n.role)
        world[key] = max(n.world_size, world.get(key, 0))
    ranks: dict[str, set[int]] = defaultdict(set)
    for stage in report.stages:
        ranks[stage.role].update(r.rank for r in stage.ranks if r.rank is not None)
    stamps = [n.timestamp_ns for n in names]
    modes = {"continuous" if n.stage == naming.CONTINUOUS_STAGE else "discrete" for n in names}
    return RunFacts(
        hosts=tuple(sorted(hosts)),
        first_ns=min(stamps, default=None),
        last_ns=max(stamps, default=None),
        tools=tuple(sorted(tools)),
        roles=tuple((role, world.get(label_key(role)), tuple(sorted(ranks[role]))) for role in sorted(ranks)),
        steps=report.steps,
        modes=tuple(sorted(modes)),
        windows=tuple(sorted({w for s in report.stages for w in s.windows})),
        manifests=manifests,
        triggered=sum(1 for n in names if n.triggered),
        partial=sum(1 for n in names if n.partial),
    )


def _instance(rows: list[StageStats]) -> tuple[StageStats, str, tuple[str, ...]] | None:
    """The row of the last step and, in it, the slowest rank by what the table judges (the straggler where one is
    named) with its files."""
    row = max(rows, key=lambda s: -1 if s.step is None else s.step)
    if not row.ranks:
        return None
    rank = max(row.ranks, key=lambda r: (r.label == row.straggler, r.judged_ms))
    return row, rank.label, rank.files


def stage_ops(report: Report, top: int = TOP_OPS) -> tuple[StageOps, ...]:
    """Per role x stage (in pipeline order), its ``top`` ops by self time; a file that cannot be read again
    leaves its stage out."""
    if top <= 0:
        return ()
    by_stage: dict[tuple[str, str], list[StageStats]] = defaultdict(list)
    for stage in report.pipeline:  # the stages in the order they ran, as the page lists them
        by_stage[label_key(stage.role), label_key(stage.stage)].append(stage)
    chosen: list[tuple[StageStats, str, tuple[str, ...]]] = []
    asks: dict[str, dict[str, frozenset[int] | None]] = defaultdict(dict)
    for rows in by_stage.values():
        picked = _instance(rows)
        if picked is None:
            continue
        chosen.append(picked)
        row, _, files = picked
        for path in files:
            # an SDK file is of one step (its name's); any other may hold several (ProfilerStep#N)
            one_step = naming.parse_trace_name(os.path.basename(path)) is not None
            asks[path][label_key(row.stage)] = None if one_step or row.step is None else frozenset({row.step})
    read: dict[str, dict[str, dict[str, list[float]]]] = {}
    for path, stages in asks.items():
        try:
            tables = read_ops(path, stages)
        except (TraceError, OSError):
            continue
        read[path] = {}
        for stage_key, per_step in tables.items():
            ops = read[path].setdefault(stage_key, {})
            for table in per_step.values():
                for (kind, name), (spent, calls) in table.rows.items():
                    if kind == "op":
                        held = ops.setdefault(name, [0.0, 0.0])
                        held[0] += spent
                        held[1] += calls
    out: list[StageOps] = []
    for row, label, files in chosen:
        if not files or any(path not in read for path in files):
            continue
        totals: dict[str, list[float]] = {}
        for path in files:
            for name, (spent, calls) in read[path].get(label_key(row.stage), {}).items():
                held = totals.setdefault(name, [0.0, 0.0])
                held[0] += spent
                held[1] += calls
        ranked = sorted(totals.items(), key=lambda item: (-item[1][0], item[0]))[:top]
        top_ops = tuple((name, spent, int(calls)) for name, (spent, calls) in ranked)
        out.append(StageOps(row.role, row.stage, row.step, label, top_ops, files))
    return tuple(out)
