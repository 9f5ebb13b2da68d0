"""Finding the step timelines of a run and putting their spans on one time axis.

Every process of a run writes one timeline file (:mod:`instrument.timeline`). Processes of one host
read the same monotonic clock, so their spans line up as written. Every process records its best clock
estimate — its clock minus one reference clock (rank 0's; on Ray the controller's choice), measured by a
round trip at ``configure`` or at the finish barrier, with its uncertainty — and is put on the reference
clock by it, whatever its host (see :func:`align`). When a timeline on another host than the lowest rank's
has no estimate (nor a host-mate with one), the axis is not aligned across hosts: the analysis then keeps
to durations, as it does for traces.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from instrument.analyze.model import Skipped
from instrument.naming import TIMELINE_SUFFIX
from instrument.timeline import ClockEstimate, SpanColumns, SpanTable, Timeline, TimelineError, read_timeline

__all__ = ["AlignedSpans", "align", "find_timelines"]


@dataclass(frozen=True)
class AlignedSpans:
    """The spans of every timeline on one axis (ns), or on their own clocks when ``aligned`` is false.

    ``spans`` holds each timeline's columns, in the order of ``timelines``, with the shift that puts it on
    the axis: a :class:`~instrument.timeline.Span` is made, shifted, only as one is read."""

    spans: SpanTable
    aligned: bool
    max_uncertainty_ns: int | None
    timelines: tuple[Timeline, ...]


def find_timelines(root: str | os.PathLike[str]) -> tuple[list[Timeline], list[Skipped]]:
    """Read every timeline file directly in ``root`` (never through a symlink); bad ones are skipped, named."""
    found: list[Timeline] = []
    skipped: list[Skipped] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        return [], [Skipped(str(root), f"cannot list timelines: {exc.strerror or exc}")]
    for entry in entries:
        if not entry.name.endswith(TIMELINE_SUFFIX):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                skipped.append(Skipped(entry.path, "a timeline name on something that is not a regular file"))
                continue
            timeline = read_timeline(entry.path)
        except TimelineError as exc:
            skipped.append(Skipped(entry.path, str(exc).removeprefix(f"{entry.path}: ")))
            continue
        except OSError as exc:
            skipped.append(Skipped(entry.path, f"cannot read: {exc.strerror or exc}"))
            continue
        if timeline.torn:
            skipped.append(Skipped(entry.path, "cut short (its writer stopped mid-record); the spans before are read"))
        found.append(timeline)
    return found, skipped


def align(timelines: list[Timeline]) -> AlignedSpans:
    """Put every span on the reference clock; ``aligned`` false when some timeline cannot be put on it.

    Every process records its clock minus one reference clock (rank 0's, or the Ray controller's choice), so a
    timeline with an estimate is shifted by it, on whatever host: the lowest (rank, pid) of the timelines
    analysed need not be the one measured against (a filtered or partial run). One without an estimate reads
    its host's clock: it takes the best estimate of a host-mate; with none, it is on the axis when it shares the
    host of the lowest (rank, pid), else the axis is not aligned.

    Nothing is copied: each timeline's columns get the shift (its clock estimate's offset) applied as read."""
    if not timelines:
        return AlignedSpans(SpanTable(), aligned=False, max_uncertainty_ns=None, timelines=())
    reference = min(timelines, key=lambda t: (t.rank, t.pid)).host
    by_host: dict[str, ClockEstimate] = {}
    for timeline in timelines:
        own = timeline.clock
        held = by_host.get(timeline.host)
        if own is not None and (held is None or own.uncertainty_ns < held.uncertainty_ns):
            by_host[timeline.host] = own
    aligned = True
    uncertainty = 0
    parts = []
    for timeline in timelines:
        estimate = timeline.clock or by_host.get(timeline.host)  # host-mates read one clock
        if estimate is not None:
            offset = estimate.offset_ns
            uncertainty = max(uncertainty, estimate.uncertainty_ns)
        elif timeline.host == reference:
            offset = 0
        else:
            offset, aligned = 0, False
        spans = timeline.spans
        if isinstance(spans, SpanColumns):
            parts.append((spans, offset))
        else:  # a Timeline made of Span values of several ranks: packed here, a part per rank
            parts.extend((columns, offset) for columns, _ in SpanTable.of(spans).parts)
    return AlignedSpans(
        SpanTable(parts),
        aligned=aligned,
        max_uncertainty_ns=uncertainty if aligned else None,
        timelines=tuple(timelines),
    )
