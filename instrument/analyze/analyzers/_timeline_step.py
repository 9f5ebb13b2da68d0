"""One step of the step-timeline analysis, over columns: its spans read out of a :class:`~instrument.timeline.SpanTable`
by index runs, its lanes, who waited for whom, its critical path and its values (the semantics: the module docstring
of :mod:`._timeline`, which runs this step after step and judges across them).

Columns, not an object per span: a step's spans are sliced out of each part's columns (one run of a file is one
process in one step), kept as lists per process, and every per-span pass is a C-level ``map`` / ``zip`` / ``sort``
where the layout allows it. A lane whose top-level stages are disjoint with gaps between them (sequential stages,
the common case) is indexed without a Python loop per span; one with nested, overlapping or touching stages, or
stages cut off at its step's ends, goes through the general loop (:func:`_index_general`; the two agree on every
disjoint lane, a property test checks it). Stage names are numbered in their sorted order (:class:`_Names`), so
that a sort on the number is the sort on (role, stage).

One module of ~660 lines, on purpose: reading a step's columns, indexing its lanes, the waits and the critical
path share the private index types (the stage numbering, the chunks, the lanes' columns, the per-role end index);
the judgement across steps and the entry point are :mod:`._timeline`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import chain, compress, groupby, islice, repeat
from operator import add, floordiv, itemgetter, lt, mod, mul, neg, sub

from instrument.analyze.analyzers._findings import GENERATION_ROLE
from instrument.analyze.model import (
    GENERATION_STAGES,
    RankTable,
    RoleTimeline,
    StepTimeline,
    TimeShare,
)
from instrument.timeline import SpanTable

__all__ = [
    "IDLE",
    "NS_PER_MS",
    "UNATTRIBUTED",
    "WAIT_TOLERANCE_NS",
    "Lane",
    "LaneIndex",
    "Step",
    "StepSpans",
    "names_of",
    "step_runs",
]

NS_PER_MS = 1_000_000
WAIT_TOLERANCE_NS = 50_000_000  # a collective's release, an RPC or a Ray object fetch, on a busy host
IDLE = "idle"
UNATTRIBUTED = "unattributed"

_Key = tuple[str, int]  # a lane: (role, rank)
# A top-level stage in its lane role's index, sorted so that the one preferred on a tie comes last:
# (end, -lane index, -start, -thread, start, lane index, cause: stage id x lanes in the step + lane index).
_Ended = tuple[int, int, int, int, int, int, int]
# A process's stage spans in one step, as columns: (role, rank, starts, ends, threads, stage ids, in order:
# each ends before the next starts, none is empty, so that they are sorted and disjoint as they are).
_Chunk = tuple[str, int, list[int], list[int], list[int], list[int], bool]
_FAR = 1 << 62  # later than any clock (ns)
_STAGE, _STEP, _WINDOW, _OTHER = range(4)
_KINDS = {"stage": _STAGE, "step": _STEP, "window": _WINDOW}
_first = itemgetter(0)


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


class _Names:
    """The (role, stage) of every stage name in a table, numbered in their sorted order, and each part's name
    entries as kinds, roles and those numbers (-1: not a stage)."""

    __slots__ = ("causes", "generation", "keys", "kids", "kinds", "nonstage", "order", "roles", "stage_role")

    def __init__(self, table: SpanTable) -> None:
        keys = sorted({(r, s) for columns, _ in table.parts for k, r, s in columns.names if k == "stage"})
        self.keys: list[tuple[str, str]] = keys
        self.causes: list[tuple[str | None, str]] = [*keys, (None, UNATTRIBUTED)]  # a RankTable's, by number
        self.generation = [stage in GENERATION_STAGES or role == GENERATION_ROLE for role, stage in keys]
        # A wait's place in the order TimeShare values sort in, after their ms: (role or "", stage), by number.
        shown = [(role or "", stage) for role, stage in self.causes]
        place = {pair: i for i, pair in enumerate(sorted(set(shown)))}
        self.order = [place[pair] for pair in shown]
        number = {key: i for i, key in enumerate(keys)}
        self.kinds: list[list[int]] = []
        self.kids: list[list[int]] = []
        self.roles: list[list[str]] = []
        self.nonstage: list[list[int] | None] = []  # the entries that are no stage (None: too many to look for)
        self.stage_role: list[str | None] = []  # the one role the stage names have (None: several)
        for columns, _ in table.parts:
            names = columns.names
            kinds = [_KINDS.get(kind, _OTHER) for kind, _, _ in names]
            self.kinds.append(kinds)
            nonstage = [n for n, kind in enumerate(kinds) if kind != _STAGE]
            self.nonstage.append(nonstage if len(nonstage) <= 4 else None)
            stage_roles = {role for kind, role, _ in names if kind == "stage"}
            self.stage_role.append(stage_roles.pop() if len(stage_roles) == 1 else None)
            self.kids.append([number[(r, s)] if k == "stage" else -1 for k, r, s in names])
            self.roles.append([role for _, role, _ in names])


def names_of(table: SpanTable) -> _Names:
    """The stage numbering of ``table`` (see :class:`_Names`)."""
    return _Names(table)


def step_runs(table: SpanTable) -> dict[int, array[int]]:
    """Where each step's spans lie: step -> (part, first, past the last) index triples, flattened.

    A timeline file holds its spans step after step, so a part has about one run per step."""
    runs: dict[int, array[int]] = {}
    for part, (columns, _) in enumerate(table.parts):
        first = 0
        for step, same in groupby(columns.step):  # maximal runs of one step, found in C
            past = first + len(list(same))
            run = runs.get(step)
            if run is None:
                runs[step] = run = array("q")
            run.extend((part, first, past))
            first = past
    return runs


class StepSpans:
    """One step's spans out of the table: step windows by lane (``windows``), stage spans as columns per process
    and role (``chunks``, on the axis) and how many spans were bad (``skipped``)."""

    __slots__ = ("chunks", "skipped", "windows")

    def __init__(self, table: SpanTable, names: _Names, runs: Sequence[int]) -> None:
        self.windows: dict[_Key, list[int]] = {}
        self.chunks: list[_Chunk] = []
        self.skipped = 0
        for k in range(0, len(runs), 3):
            self._read(table, names, runs[k], runs[k + 1], runs[k + 2])

    def _read(self, table: SpanTable, names: _Names, part: int, lo: int, hi: int) -> None:
        columns, shift = table.parts[part]
        kinds, roles = names.kinds[part], names.roles[part]
        name, duration = columns.name[lo:hi], columns.duration_ns[lo:hi]
        least = min(duration)
        if least < 0:  # bad spans: found one by one
            drop = [i for i, (n, d) in enumerate(zip(name, duration, strict=True)) if d < 0 or kinds[n] != _STAGE]
        else:
            drop = []
            nonstage = names.nonstage[part]
            for n in set(name) if nonstage is None else nonstage:
                if kinds[n] != _STAGE:
                    at = -1
                    for _ in range(name.count(n)):
                        at = name.index(n, at + 1)
                        drop.append(at)
            drop.sort()
        written = columns.start_ns[lo:hi]
        starts = list(map(sub, written, repeat(shift))) if shift else list(written)
        ends = list(map(add, starts, duration))
        threads, kids = list(columns.thread[lo:hi]), list(map(names.kids[part].__getitem__, name))
        rank = columns.rank
        for at in drop:
            n = name[at]
            if duration[at] < 0 or kinds[n] == _OTHER:
                self.skipped += 1
            elif kinds[n] == _STEP:
                start, end = starts[at], ends[at]
                key = (roles[n], rank)
                window = self.windows.get(key)
                if window is None:
                    self.windows[key] = [start, end]
                else:  # the same process twice in one step (a retried step): its whole extent
                    window[0], window[1] = min(window[0], start), max(window[1], end)
        for at in reversed(drop):
            del kids[at], starts[at], ends[at], threads[at]
        if not kids:
            return
        keys = names.keys
        role = names.stage_role[part]
        if role is None:
            stage_roles = {keys[kid][0] for kid in set(kids)}
            if len(stage_roles) == 1:
                role = stage_roles.pop()
        if role is not None:
            ordered = least > 0 or min(map(sub, ends, starts)) > 0
            ordered = ordered and all(map(lt, ends, islice(starts, 1, None)))
            self.chunks.append((role, rank, starts, ends, threads, kids, ordered))
            return
        self.chunks.extend(_by_role(keys, rank, starts, ends, threads, kids))


def _by_role(
    keys: list[tuple[str, str]], rank: int, starts: list[int], ends: list[int], threads: list[int], kids: list[int]
) -> Iterable[_Chunk]:
    """The stage spans of a process naming stages after several roles, a chunk per role."""
    by_role: dict[str, _Chunk] = {}
    for start, end, thread, kid in zip(starts, ends, threads, kids, strict=True):
        stage_role = keys[kid][0]
        chunk = by_role.get(stage_role)
        if chunk is None:
            by_role[stage_role] = chunk = (stage_role, rank, [], [], [], [], False)
        chunk[2].append(start)
        chunk[3].append(end)
        chunk[4].append(thread)
        chunk[5].append(kid)
    return by_role.values()


# --------------------------------------------------------------------------- a lane


class Lane:
    """One process in one step, while it is analysed (mutable scratch; the result is a RankTimeline).

    Its busy runs (the merged top-level stages) are ``block_starts`` / ``block_ends``; its top-level stages
    ``top_starts`` / ``top_ends`` (ascending, both) / ``top_kids``; ``by_stage`` is stage number -> ns, the union
    of its calls, in the order the stages first start."""

    __slots__ = (
        "block_ends",
        "block_starts",
        "busy",
        "by_stage",
        "end",
        "ended",
        "generation",
        "index",
        "rank",
        "role",
        "start",
        "top_ends",
        "top_kids",
        "top_starts",
    )

    def __init__(self, key: _Key, index: int, start: int, end: int) -> None:
        self.role, self.rank = key
        self.index = index
        self.start = start
        self.end = end
        self.block_starts: Sequence[int] = ()
        self.block_ends: Sequence[int] = ()
        self.top_starts: Sequence[int] = ()
        self.top_ends: Sequence[int] = ()
        self.top_kids: Sequence[int] = ()
        self.busy = 0
        self.by_stage: dict[int, int] = {}
        self.generation = 0
        self.ended: Sequence[_Ended] = ()  # its role-index entries, while the step's index is built


LaneIndex = tuple[
    list[int], list[int], list[int], list[int], list[int], dict[int, int], int, list[tuple[int, int]], list[_Ended]
]
"""What indexing a lane gives: block starts, block ends, top starts, top ends, top stage numbers, by_stage,
generation ns, generation runs and its role-index entries."""


def _index_disjoint(
    rows: list[tuple[int, int, int, int]], generation: Sequence[bool], index: int, lanes: int
) -> LaneIndex | None:
    """A lane's index when its stages (sorted ``(start, -end, thread, stage number)``, clipped) are disjoint
    with gaps between them: every stage is top-level and a busy run of its own. ``None`` when they are not."""
    a_s, neg_b, threads, kids = zip(*rows, strict=True)
    b_s = list(map(neg, neg_b))
    if not all(map(lt, b_s, islice(a_s, 1, None))):
        return None
    return _index_ordered(list(a_s), b_s, threads, kids, generation, index, lanes)


def _index_ordered(
    starts: list[int],
    b_s: list[int],
    threads: Sequence[int],
    kids: Sequence[int],
    generation: Sequence[bool],
    index: int,
    lanes: int,
) -> LaneIndex:
    """A lane's index from its stages as columns, sorted by start, none empty, each ending before the next
    starts (what :func:`_index_general` gives for them, with no loop per stage in Python)."""
    durations = list(map(sub, b_s, starts))
    by_stage = dict(zip(kids, durations, strict=True))
    if len(by_stage) != len(kids):  # a stage called more than once: the sum of its calls
        by_stage = {}
        for kid, ns in zip(kids, durations, strict=True):
            by_stage[kid] = by_stage.get(kid, 0) + ns
    flags = list(map(generation.__getitem__, kids))
    gen_runs: list[tuple[int, int]] = []
    gen_ns = 0
    if any(flags):
        gen_runs = list(compress(zip(starts, b_s, strict=True), flags))
        gen_ns = sum(compress(durations, flags))
    causes = map(add, map(mul, kids, repeat(lanes)), repeat(index))
    ended = list(zip(b_s, repeat(-index), map(neg, starts), map(neg, threads), starts, repeat(index), causes))
    return starts, b_s, starts, b_s, list(kids), by_stage, gen_ns, gen_runs, ended


def _index_general(
    rows: list[tuple[int, int, int, int]], generation: Sequence[bool], index: int, lanes: int
) -> LaneIndex:
    """A lane's index from its stages, sorted ``(start, -end, thread, stage number)`` and clipped, one by one:
    by start, the longer first, a stage that ends within the reach of those before it is nested."""
    block_starts: list[int] = []
    block_ends: list[int] = []
    top_starts: list[int] = []
    top_ends: list[int] = []
    top_kids: list[int] = []
    ended: list[_Ended] = []
    runs: dict[int, list[int]] = {}  # stage number -> [run start, run end, total before]
    gen_runs: list[tuple[int, int]] = []
    gen_ns = 0
    gen_run: list[int] | None = None
    reach = 0
    for a, neg_b, thread, kid in rows:
        b = -neg_b
        run = runs.get(kid)
        if run is None:
            runs[kid] = [a, b, 0]
        elif a <= run[1]:
            run[1] = max(run[1], b)
        else:
            run[2] += run[1] - run[0]
            run[0], run[1] = a, b
        if generation[kid]:
            if gen_run is not None and a <= gen_run[1]:
                gen_run[1] = max(gen_run[1], b)
            else:
                if gen_run is not None:
                    gen_runs.append((gen_run[0], gen_run[1]))
                    gen_ns += gen_run[1] - gen_run[0]
                gen_run = [a, b]
        if top_starts and b <= reach:
            continue  # inside a stage of this lane that started no later
        if block_starts and a <= reach:
            block_ends[-1] = b
        else:
            block_starts.append(a)
            block_ends.append(b)
        top_starts.append(a)
        top_ends.append(b)
        top_kids.append(kid)
        reach = b
        ended.append((b, -index, -a, -thread, a, index, kid * lanes + index))
    if gen_run is not None:
        gen_runs.append((gen_run[0], gen_run[1]))
        gen_ns += gen_run[1] - gen_run[0]
    by_stage = {kid: total + b - a for kid, (a, b, total) in runs.items()}
    return block_starts, block_ends, top_starts, top_ends, top_kids, by_stage, gen_ns, gen_runs, ended


# --------------------------------------------------------------------------- one step


class Step:
    """The analysis of one step; :meth:`result` builds the step's values once the lanes are indexed."""

    def __init__(
        self, step: int, spans: StepSpans, names: _Names, aligned: bool, uncertainty: int, tolerance: int
    ) -> None:
        self.step = step
        self.aligned = aligned
        self.uncertainty = uncertainty
        self.tolerance = tolerance
        self.keys = names.keys
        self.causes = names.causes
        self.path: list[tuple[str, str, int, int]] = []  # the critical path: (role, stage, rank, ns)
        self.wall = 0
        windows = spans.windows
        members = self._assign(windows, spans.chunks)
        self.lanes: list[Lane] = []
        by_role: dict[str, list[_Ended]] = defaultdict(list)
        self.generation_runs: list[tuple[int, int]] = []
        count = len(members)
        for index, key in enumerate(sorted(members)):
            lane = self._lane(key, index, members[key], windows.get(key), names.generation, count)
            self.lanes.append(lane)
            if aligned:  # only waits need the index, and only aligned clocks have waits
                by_role[lane.role].extend(lane.ended)
            lane.ended = ()
        self.lane_ranks = [lane.rank for lane in self.lanes]
        self.order = names.order
        self.others: dict[str, list[tuple[list[int], list[_Ended]]]] = {}  # by role: the other roles' indexes
        self.by_role: dict[str, list[_Ended]] = {}
        self.ends_by_role: dict[str, list[int]] = {}
        for role in sorted(by_role):
            entries = sorted(by_role[role])  # unique on the first four: the cause is never compared
            self.by_role[role] = entries
            self.ends_by_role[role] = list(map(_first, entries))

    def _lane(
        self, key: _Key, index: int, group: list[_Chunk], window: list[int] | None, generation: list[bool], count: int
    ) -> Lane:
        """Lane ``index`` of the step, indexed (its role-index entries left in ``ended``)."""
        ordered = False
        if len(group) == 1:
            _, _, starts, ends, threads, kids, ordered = group[0]
        else:
            starts = [x for chunk in group for x in chunk[2]]
            ends = [x for chunk in group for x in chunk[3]]
            threads = [x for chunk in group for x in chunk[4]]
            kids = [x for chunk in group for x in chunk[5]]
        if window is not None:
            start, end = window
        else:
            start, end = min(starts), max(ends)
        lane = Lane(key, index, start, end)
        if ordered and starts[0] >= start and ends[-1] <= end:  # sorted, disjoint and inside: no row made
            indexed = _index_ordered(starts, ends, threads, kids, generation, index, count)
        else:
            rows = _clipped(starts, ends, threads, kids, start, end)
            if not rows:
                return lane
            rows.sort()  # equal only when equal in every field the analysis reads
            indexed = _index_disjoint(rows, generation, index, count) or _index_general(rows, generation, index, count)
        (
            lane.block_starts,
            lane.block_ends,
            lane.top_starts,
            lane.top_ends,
            lane.top_kids,
            lane.by_stage,
            lane.generation,
            gen_runs,
            lane.ended,
        ) = indexed
        lane.busy = sum(map(sub, lane.block_ends, lane.block_starts))
        self.generation_runs.extend(gen_runs)
        return lane

    @staticmethod
    def _assign(windows: dict[_Key, list[int]], chunks: list[_Chunk]) -> dict[_Key, list[_Chunk]]:
        members: dict[_Key, list[_Chunk]] = {key: [] for key in windows}
        owners: dict[int, list[_Key]] = defaultdict(list)
        for key in windows:
            owners[key[1]].append(key)
        for chunk in chunks:
            key = (chunk[0], chunk[1])
            if key not in windows:
                at_rank = owners.get(chunk[1])
                if at_rank is not None and len(at_rank) == 1:
                    key = at_rank[0]  # a fused process naming this stage after another role
            group = members.get(key)
            if group is None:
                members[key] = group = []
            group.append(chunk)
        return members

    # ---------------------------------------------------------------- who waited for whom

    def _latest(self, role: str, low: int, high: int, lane: int, before: int) -> _Ended | None:
        """The latest-ending stage of ``role`` that ended in [low, high], on a lane other than ``lane``,
        and started before ``before``."""
        ends = self.ends_by_role[role]
        entries = self.by_role[role]
        i = bisect_right(ends, high) - 1
        while i >= 0 and ends[i] >= low:
            entry = entries[i]
            if entry[5] != lane and entry[4] < before:
                return entry
            i -= 1
        return None

    def _waited_for(self, lane: Lane, gap_start: int, gap_end: int, *, at_end: bool) -> _Ended | None:
        """What ``lane`` waited for in its idle gap ``[gap_start, gap_end]`` (rules in the module docstring)."""
        unc = self.uncertainty
        if at_end:  # whatever ended last elsewhere, after this lane stopped
            low, high, before = gap_start - unc + 1, _FAR, _FAR
        else:
            low, high, before = max(gap_end - unc - self.tolerance, gap_start - unc), gap_end + unc, gap_end
        best = None
        for role in self.by_role:
            if role != lane.role or at_end:
                entry = self._latest(role, low, high, lane.index, before)
                if entry is not None and (best is None or entry > best):  # unique on the first four
                    best = entry
        if best is None and not at_end and lane.role in self.by_role:
            best = self._latest(lane.role, low, high, lane.index, before)
        return best

    def _waits(self, lane: Lane) -> list[tuple[int, int, int, int, int]]:
        """What ``lane`` waited for, by cause, largest first: (-ns, place of the cause's (role or "", stage),
        rank or -1, cause number, ns).

        The gaps inside and at the head of its step are :meth:`_waited_for`'s rule, inlined."""
        li, unc, tol = lane.index, self.uncertainty, self.tolerance
        starts, ends = lane.block_starts, lane.block_ends
        others = self._others(lane.role, starts[-1] + unc if starts else _FAR)
        count = len(self.lanes)
        unattributed = len(self.keys) * count  # the cause number of no cause, on lane 0
        own = self.by_role.get(lane.role)
        own_ends = self.ends_by_role.get(lane.role, [])
        waited: dict[int, int] = {}
        head = ((lane.start, starts[0]),) if starts and starts[0] > lane.start else ()
        one = others[0] if len(others) == 1 else None  # two roles: one index to look in first, no comparing
        slack = unc + tol
        for a, b in chain(head, zip(ends, islice(starts, 1, None), strict=False)):
            low = b - slack
            if a - unc > low:  # noqa: PLR1730  # no call: once a gap, millions of times
                low = a - unc
            high = b + unc
            best = None
            if one is not None:  # another role's lane is never this one: only the start is checked
                role_ends, entries = one
                i = bisect_right(role_ends, high) - 1
                while i >= 0 and role_ends[i] >= low:
                    entry = entries[i]
                    if entry[4] < b:
                        best = entry
                        break
                    i -= 1
            else:
                for role_ends, entries in others:
                    i = bisect_right(role_ends, high) - 1
                    while i >= 0 and role_ends[i] >= low:
                        entry = entries[i]
                        if entry[4] < b:
                            if best is None or entry > best:
                                best = entry
                            break
                        i -= 1
            if best is None and own is not None:
                i = bisect_right(own_ends, high) - 1
                while i >= 0 and own_ends[i] >= low:
                    entry = own[i]
                    if entry[5] != li and entry[4] < b:
                        best = entry
                        break
                    i -= 1
            code = unattributed if best is None else best[6]
            waited[code] = waited.get(code, 0) + b - a
        previous = ends[-1] if starts else lane.start
        if lane.end > previous:  # it finished early (or ran no stage at all)
            cause = self._waited_for(lane, previous, lane.end, at_end=True)
            code = unattributed if cause is None else cause[6]
            waited[code] = waited.get(code, 0) + lane.end - previous
        return self._rows(waited, count, unattributed)

    def _others(self, role: str, latest: int) -> list[tuple[list[int], list[_Ended]]]:
        """The index (ends, entries) of every role but ``role``; none when no stage of theirs ended by ``latest``
        (a lane's last resume, plus the uncertainty: none of them was waited for)."""
        others = self.others.get(role)
        if others is None:
            others = [(self.ends_by_role[r], entries) for r, entries in self.by_role.items() if r != role]
            self.others[role] = others
        if all(not role_ends or role_ends[0] > latest for role_ends, _ in others):
            return []
        return others

    def _rows(self, waited: dict[int, int], count: int, unattributed: int) -> list[tuple[int, int, int, int, int]]:
        """A lane's waits (cause code -> ns) as :meth:`_waits` gives them, sorted."""
        codes, ns = list(waited), list(waited.values())
        kids = list(map(floordiv, codes, repeat(count)))
        ranks = list(map(self.lane_ranks.__getitem__, map(mod, codes, repeat(count))))
        if unattributed in waited:
            ranks[codes.index(unattributed)] = -1
        # The order TimeShare values sort in: by their ms (the float a reader gets; ns order is the same), then
        # the cause; no two causes are equal.
        rows = list(zip(map(neg, ns), map(self.order.__getitem__, kids), ranks, kids, ns, strict=True))
        rows.sort()
        return rows

    # ---------------------------------------------------------------- the critical path

    def _critical_path(self, w0: int, w1: int) -> list[tuple[str, str, int, int]]:
        parts: list[tuple[str, str, int, int]] = []  # (role, stage, rank, ns), from the end backwards

        def add_part(role: str, stage: str, rank: int, ns: int) -> None:
            if ns <= 0:
                return
            if parts and parts[-1][:3] == (role, stage, rank):
                parts[-1] = (role, stage, rank, parts[-1][3] + ns)
            else:
                parts.append((role, stage, rank, ns))

        last_lane = max(self.lanes, key=lambda lane: (lane.end, -lane.index))
        ended = [entries[-1] for entries in self.by_role.values() if entries]
        if not ended:
            add_part(last_lane.role, IDLE, last_lane.rank, w1 - w0)
            return parts
        last = max(ended)
        add_part(last_lane.role, IDLE, last_lane.rank, w1 - last[0])
        lane, t = self.lanes[last[5]], last[0]
        while t > w0:
            starts, ends = lane.block_starts, lane.block_ends
            k = bisect_right(starts, t) - 1  # the last block that starts at or before t
            if k >= 0 and starts[k] < t <= ends[k]:
                # The first top-level stage ending at or after t covers t (t is busy) and started first.
                j = bisect_left(lane.top_ends, t)
                a = lane.top_starts[j]
                role, stage = self.keys[lane.top_kids[j]]
                add_part(role, stage, lane.rank, t - max(a, w0))
                t = a
                continue
            # t starts a busy run: what did the lane wait for in the gap before it?
            if k >= 0 and starts[k] == t:
                k -= 1
            gap_start = ends[k] if k >= 0 else lane.start
            cause = self._waited_for(lane, gap_start, t, at_end=False)
            if cause is not None:
                resume = min(cause[0], t)  # the cause may end after t, within the clocks' uncertainty
                add_part(lane.role, IDLE, lane.rank, t - max(resume, w0))
                lane, t = self.lanes[cause[5]], resume
            elif k >= 0:
                add_part(lane.role, IDLE, lane.rank, t - gap_start)
                t = gap_start
            else:  # before the lane's first stage, and nothing it waited for: idle since the step began
                add_part(lane.role, IDLE, lane.rank, t - w0)
                t = w0
        parts.reverse()
        return parts

    # ---------------------------------------------------------------- the step's values

    def result(self) -> StepTimeline:
        lanes = self.lanes
        if self.aligned:
            w0, w1 = min(lane.start for lane in lanes), max(lane.end for lane in lanes)
            self.wall = wall = w1 - w0
            self.path = self._critical_path(w0, w1)
            path = tuple(TimeShare(r, s, k, _ms(ns)) for r, s, k, ns in self.path)
            generation = _union_length(self.generation_runs, w0, w1)
        else:
            self.wall = wall = max(lane.end - lane.start for lane in lanes)
            path = ()
            generation = max(lane.generation for lane in lanes)
        table = RankTable(self.causes)  # the step's lanes and waits as columns: millions of waits at 4,096 ranks
        role_sums: dict[str, list[int]] = {}
        role_causes: dict[str, dict[int, float]] = {}
        nothing: tuple[int, ...] = ()
        for lane in lanes:
            idle = lane.end - lane.start - lane.busy
            causes = role_causes.get(lane.role)
            if causes is None:
                role_causes[lane.role] = causes = {}
            waits = self._waits(lane) if self.aligned else None
            if waits:
                _, _, ranks, kids, ns = zip(*waits, strict=True)
                table.add_numbered(lane.rank, lane.role, lane.busy, idle, kids, ranks, ns)
                for kid, n in zip(kids, ns, strict=True):  # in the lane's order, as the reader sums them
                    causes[kid] = causes.get(kid, 0.0) + n / NS_PER_MS
            else:
                table.add_numbered(lane.rank, lane.role, lane.busy, idle, nothing, nothing, nothing)
            sums = role_sums.get(lane.role)
            if sums is None:
                role_sums[lane.role] = sums = [0, 0, 0]
            sums[0] += 1
            sums[1] += lane.busy
            sums[2] += idle
        roles = {}
        for role, (count, busy, idle) in role_sums.items():
            named = [(self.causes[kid], ms) for kid, ms in role_causes[role].items()]
            ranked = sorted(named, key=lambda kv: (-kv[1], kv[0][0] or "", kv[0][1]))
            shares = tuple(TimeShare(r, s, None, ms) for (r, s), ms in ranked)
            roles[role] = RoleTimeline(role, count, _ms(busy), _ms(idle), shares)
        return StepTimeline(self.step, _ms(wall), path, roles, table, _ms(generation))

    def stage_time(self) -> dict[tuple[str, str], int]:
        """(role, stage) -> ns of the step it accounts for: on the critical path; unaligned, its longest lane."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        if self.aligned:
            for role, stage, _, ns in self.path:
                if stage != IDLE:
                    totals[(role, stage)] += ns
        else:
            keys = self.keys
            for lane in self.lanes:
                for kid, ns in lane.by_stage.items():
                    key = keys[kid]
                    totals[key] = max(totals[key], ns)
        return totals


def _clipped(
    starts: list[int], ends: list[int], threads: list[int], kids: list[int], low: int, high: int
) -> list[tuple[int, int, int, int]]:
    """A lane's stages as (start, -end, thread, stage number), cut to ``[low, high]``; those left empty go."""
    if not starts:
        return []
    if min(starts) >= low and max(ends) <= high and min(map(sub, ends, starts)) > 0:
        return list(zip(starts, map(neg, ends), threads, kids, strict=True))
    rows = []
    for start, end, thread, kid in zip(starts, ends, threads, kids, strict=True):
        a = max(start, low)
        b = min(end, high)
        if b > a:
            rows.append((a, -b, thread, kid))
    return rows


def _union_length(runs: list[tuple[int, int]], low: int, high: int) -> int:
    total, reach = 0, low
    for start, end in sorted(runs):
        a, b = max(start, reach), min(end, high)
        if b > a:
            total += b - a
            reach = b
    return total
