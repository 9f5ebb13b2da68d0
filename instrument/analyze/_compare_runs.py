"""From two runs to a :class:`~instrument.analyze.Comparison`: :func:`compare`.

Each side is a :class:`~instrument.analyze.Report`: given, analysed from a ``save_path`` by
:func:`~instrument.analyze.analyze` (its traces and timeline files, under the same filters), or read back from
the ``--json`` output of ``instrument analyze`` by :meth:`~instrument.analyze.Report.from_dict` (so a saved
analysis compares as the live one). The sides become plain values
(:func:`~.analyzers._compare.side_from_report`), are judged (:func:`~.analyzers._compare.compare_sides`),
and each reported change gets its causes: the ops and kernels of a few of its instances' trace files, read
once each (:func:`.traces._ops.read_ops`), and the windows and nested stages of the timeline.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Container, Iterable, Iterator
from pathlib import Path
from typing import Any

from instrument import naming
from instrument.analyze._analyze import PARALLEL_MIN_BYTES, analyze
from instrument.analyze.analyzers._compare import (
    Instance,
    RunSide,
    compare_sides,
    inner_causes,
    op_causes,
    pick_files,
    side_from_report,
    steps_of,
    timeline_comparison,
    with_causes,
)
from instrument.analyze.analyzers._compare_stats import ALPHA, MIN_CHANGE_PCT, MIN_SAMPLES
from instrument.analyze.analyzers._compare_words import findings
from instrument.analyze.model import Cause, Change, Comparison, Filters, Method, OpTable, Report, label_key
from instrument.analyze.traces._ops import read_ops
from instrument.analyze.traces._reader import TraceError

__all__ = ["CAUSE_INSTANCES", "compare"]

CAUSE_INSTANCES = 8
"""Stage instances a side whose trace files are read again for a reported change's causes (spread across
ranks, then steps; half as many where each file holds several, as a rank's file of many steps does): enough
for a mean per instance, and a bound on what is read twice."""

_MAX_JSON_BYTES = 1 << 30

SpanRow = tuple[str, str, str, int, int, int, int, int]


def compare(
    baseline: Report | str | os.PathLike[str],
    candidate: Report | str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    stages: Iterable[str] | None = None,
    all_ranks: bool = True,
    min_change_pct: float = MIN_CHANGE_PCT,
    alpha: float = ALPHA,
    jobs: int | None = None,
) -> Comparison:
    """Compare ``candidate`` against ``baseline``: each a :class:`~instrument.analyze.Report`, a ``save_path`` or
    an ``instrument analyze --json`` file.

    ``ranks`` / ``steps`` / ``stages`` / ``all_ranks`` filter as in :func:`~instrument.analyze.analyze` (a
    report given is kept to them too); a
    change is reported when the Mann-Whitney U test rejects "no change" at ``alpha`` and it is at least
    ``min_change_pct`` percent. ``jobs``: processes reading files (default as ``analyze``'s).

    Raises ``ValueError`` (bad arguments; a file that is no analysis; a run with no trace and no timeline)
    and ``OSError`` (a path that cannot be read), naming the side.
    """
    started = time.perf_counter()
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ValueError(f"'alpha' must be a number between 0 and 1 (got {alpha!r})")
    if isinstance(min_change_pct, bool) or not isinstance(min_change_pct, int | float) or min_change_pct < 0:
        raise ValueError(f"'min_change_pct' must be a number >= 0 (got {min_change_pct!r})")
    stages = [stages] if isinstance(stages, str) else None if stages is None else list(stages)
    ranks, steps = _reusable(ranks), _reusable(steps)  # each is read by the filters and both analyses
    filters = Filters.of(ranks, steps, stages, all_ranks)
    method = Method(alpha=float(alpha), min_change_pct=float(min_change_pct), min_samples=MIN_SAMPLES)
    opts: dict[str, Any] = {"ranks": ranks, "steps": steps, "stages": stages, "all_ranks": all_ranks, "jobs": jobs}
    label_b, side_b, skipped_b = _load(baseline, "baseline", filters, opts)
    label_c, side_c, skipped_c = _load(candidate, "candidate", filters, opts)

    step, changes, overlap, notes, machine = compare_sides(side_b, side_c, method)
    keep = set(overlap.common_ranks) or None
    changes = _with_causes(changes, side_b, side_c, keep, jobs, notes)
    timeline = timeline_comparison(side_b.summary, side_c.summary)
    said = findings(step, changes, overlap, timeline, method, (side_b.summary, side_c.summary), machine)
    return Comparison(
        baseline=label_b,
        candidate=label_c,
        step=step,
        changes=tuple(changes),
        findings=said,
        method=method,
        overlap=overlap,
        timeline=timeline,
        machine=machine,
        skipped=tuple(skipped_b + skipped_c),
        notes=tuple(notes),
        elapsed_s=time.perf_counter() - started,
    )


def _reusable(values: Iterable[int] | None) -> Iterable[int] | None:
    """``values`` as something that can be read more than once; intervals (``--ranks 0-99999``) kept as they are."""
    if values is None or isinstance(values, Container):
        return values
    return tuple(values)


# --------------------------------------------------------------------------- a side


def _load(
    source: Report | str | os.PathLike[str], which: str, filters: Filters, opts: dict[str, Any]
) -> tuple[str, RunSide, list[tuple[str, str]]]:
    """One side: its label, its values, the files its analysis skipped."""
    if isinstance(source, Report):
        side = side_from_report(which, source, filters=filters, timeline_rows=_timeline_rows(source))
        return source.directory, side, [(s.path, s.reason) for s in source.skipped]
    root = Path(source)
    if root.is_dir():
        report = analyze(root, **opts)
        if not report.stages and report.timeline is None:
            raise ValueError(f"{which} {root}: {_nothing(report)}")
        side = side_from_report(which, report, filters=filters, timeline_rows=_timeline_rows(report))
        return str(source), side, [(s.path, s.reason) for s in report.skipped]
    if not root.exists():
        raise FileNotFoundError(f"{which} {root}: no such directory or file")
    try:
        saved = Report.from_dict(_read_json(root, which))
    except ValueError as exc:
        raise ValueError(f"{which} {root}: not the --json output of instrument analyze ({exc})") from None
    side = side_from_report(which, saved, filters=filters, json_input=True)
    if not side.traces and side.summary is None:
        raise ValueError(f"{which} {root}: the analysis holds no stage and no timeline step the filters keep")
    return str(source), side, []


def _nothing(report: Report) -> str:
    if report.skipped:
        first = report.skipped[0]
        return f"no trace could be read ({len(report.skipped)} skipped; {first.path}: {first.reason})"
    if report.files:
        return "its traces hold no stage the filters keep, and there is no step timeline"
    return "no trace and no step timeline in it (is it a save_path?)"


def _read_json(path: Path, which: str) -> Any:
    """The JSON in ``path`` (an ``instrument analyze --json`` output, :meth:`Report.from_dict` checks)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(_MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise OSError(f"{which} {path}: cannot read ({exc.strerror or exc})") from None
    if len(text) > _MAX_JSON_BYTES:
        raise ValueError(f"{which} {path}: over {_MAX_JSON_BYTES >> 20} MiB: not an analysis")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        words = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ValueError(f"{which} {path}: neither a directory nor JSON ({words})") from None


def _timeline_rows(report: Report) -> Iterator[SpanRow] | None:
    """The timeline spans the analysis kept (its filters applied), as rows with their rank; ``None``: none."""
    if report.timeline is None or report.timeline_spans is None or report.timeline.source == "traces":
        return None  # a timeline from traces holds what the stage table does: compared as traces
    return (
        (kind, role, stage, step, lane.rank, start, end, thread)
        for lane in report.timeline_spans.lanes
        for kind, role, stage, step, start, end, thread in lane.rows()
    )


# --------------------------------------------------------------------------- causes


def _with_causes(
    changes: list[Change], side_b: RunSide, side_c: RunSide, keep: set[str] | None, jobs: int | None, notes: list[str]
) -> list[Change]:
    """Every reported change with its causes: ops and kernels (traces on both sides), windows and nested
    stages (timelines on both sides)."""
    reported = [
        (i, (label_key(c.role or ""), label_key(c.stage or ""))) for i, c in enumerate(changes) if c.significant
    ]
    if not reported:
        return changes
    before, after = _op_tables((side_b, side_c), [key for _, key in reported], jobs, notes)
    out = list(changes)
    for i, key in reported:
        change = changes[i]
        causes: list[Cause] = []
        sources: list[str] = []
        missing: list[str] = []
        kernel_comm = None
        table_b, table_c = before.get(key), after.get(key)
        if table_b and table_c:
            causes.extend(op_causes(table_b, table_c))
            sources.append(f"traces: {len(table_b)} and {len(table_c)} stage instances")
            kernels = [
                (sum(t.kernel_comm_ms for t in side), sum(t.kernel_ms for t in side)) for side in (table_b, table_c)
            ]
            if kernels[0][1] or kernels[1][1]:
                kernel_comm = (_pct(*kernels[0]), _pct(*kernels[1]))
        else:
            side = (
                "either run"
                if table_b is None and table_c is None
                else "the baseline"
                if table_b is None
                else "the candidate"
            )
            missing.append(f"no trace of it in {side}: ops and kernels unknown")
        inner_b, inner_c = side_b.inner.get(key), side_c.inner.get(key)
        held_b, held_c = side_b.timeline.get(key), side_c.timeline.get(key)
        if held_b is not None and held_c is not None and (inner_b or inner_c):
            n_b = sum(1 for i_ in held_b.values if keep is None or i_[1] in keep)
            n_c = sum(1 for i_ in held_c.values if keep is None or i_[1] in keep)
            causes.extend(inner_causes(_kept(inner_b or {}, keep), _kept(inner_c or {}, keep), (n_b, n_c)))
            sources.append(f"timeline: {n_b} and {n_c} stage instances")
        out[i] = with_causes(
            change,
            causes,
            causes_from="; ".join(sources) or None,
            note="; ".join(missing) or None,
            kernel_comm=kernel_comm,
        )
    return out


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


def _kept(
    inner: dict[tuple[str, str], dict[Instance, list[float]]], keep: set[str] | None
) -> dict[tuple[str, str], dict[Instance, list[float]]]:
    if keep is None:
        return inner
    return {what: {i: v for i, v in cells.items() if i[1] in keep} for what, cells in inner.items()}


def _op_tables(
    sides: tuple[RunSide, RunSide], keys: list[tuple[str, str]], jobs: int | None, notes: list[str]
) -> list[dict[tuple[str, str], list[OpTable]]]:
    """Per side and reported (role, stage), the ops and kernels of each stage instance of the files picked for
    it; every file is read once, those of both sides in one pool."""
    chosen: list[dict[tuple[str, str], tuple[list[str], set[Instance]]]] = [{}, {}]
    asks: dict[str, dict[str, frozenset[int] | None]] = defaultdict(dict)
    for side, picked in zip(sides, chosen, strict=True):
        for key in keys:
            held = side.traces.get(key)
            if held is None or not held.files:
                continue
            files, covered = pick_files(held, CAUSE_INSTANCES)
            files = [f for f in files if os.path.isfile(f)]  # an analysis read elsewhere: its files may be gone
            if not files:
                continue
            picked[key] = (files, covered)
            for path in files:
                listed = {i for i, paths in held.files.items() if path in paths and i in covered}
                # A file of the SDK is one step (its name's); any other may hold several (ProfilerStep#N)
                steps = None if naming.parse_trace_name(path) is not None else steps_of(listed) or None
                asked = asks[path]
                if key[1] in asked:  # asked twice (both runs one folder): the steps of both
                    before = asked[key[1]]
                    steps = None if steps is None or before is None else steps | before
                asked[key[1]] = steps
    read: dict[str, dict[str, dict[int | None, OpTable]]] = {}
    failed: set[str] = set()
    for path, result in zip(asks, _read_all(list(asks.items()), jobs), strict=True):
        if isinstance(result, str):
            failed.add(path)
            notes.append(f"{path}: its ops could not be read for the causes: {result}")
        else:
            read[path] = result
    out: list[dict[tuple[str, str], list[OpTable]]] = []
    for side, picked in zip(sides, chosen, strict=True):
        tables: dict[tuple[str, str], list[OpTable]] = {}
        for key, (files, covered) in picked.items():
            held = side.traces[key]
            lost = {i for i, paths in held.files.items() if failed & set(paths)}
            kept = covered - lost
            per_instance: dict[Instance, OpTable] = {i: OpTable() for i in kept}
            for path in files:
                owners = sorted((i for i in kept if path in held.files[i]), key=_instance_order)
                for step, part in read.get(path, {}).get(key[1], {}).items():
                    # split by step: the instance of that step; else the file's own (the first, if it names several)
                    if step is None:
                        where = owners[0] if owners else None
                    else:
                        where = next((i for i in owners if i[0] == step), None)
                    if where is not None:
                        per_instance[where].add(part)
            tables[key] = [per_instance[i] for i in sorted(kept, key=_instance_order)]
        out.append(tables)
    return out


def _instance_order(instance: Instance) -> tuple[int, str]:
    return (-1 if instance[0] is None else instance[0], instance[1])


def _read_one(item: tuple[str, dict[str, frozenset[int] | None]]) -> dict[str, dict[int | None, OpTable]] | str:
    path, stages = item
    try:
        return read_ops(path, stages)
    except (TraceError, OSError) as exc:
        return str(exc)


def _read_all(
    items: list[tuple[str, dict[str, frozenset[int] | None]]], jobs: int | None
) -> list[dict[str, dict[int | None, OpTable]] | str]:
    """Each file's tables, in worker processes when they are large (as the analysis reads them)."""
    total = sum(_size(path) for path, _ in items)
    workers = jobs if jobs is not None else (min(os.cpu_count() or 1, 8) if total >= PARALLEL_MIN_BYTES else 1)
    if workers <= 1 or len(items) < 2:
        return [_read_one(item) for item in items]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork only a process with one thread (the command line), as the analysis does; spawn otherwise
    forkable = (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1
        and "torch" not in sys.modules
    )
    context = multiprocessing.get_context("fork" if forkable else "spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context) as pool:
        return list(pool.map(_read_one, items))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
