"""One step of the step-timeline analysis, over columns: its spans read out of a :class:`~instrument.timeline.SpanTable`
by index runs, its lanes, who waited for whom, its critical path and its values (the semantics: the module docstring
of :mod:`._timeline`, which runs this step after step and judges across them).

Columns, not an object per span: a step's spans are sliced out of each part's columns (one run of a file is one
process in one step), kept as lists per process, and every per-span pass is a C-level ``map`` / ``zip`` / ``sort``
where the layout allows it. A lane whose top-level stages are disjoint with gaps between them (sequential stages,
the common case) is indexed without a Python loop per span; one with nested, overlapping or touching stages, or
stages cut off at its step's ends, goes through the general loop (:func:`_index_general`; the two agree on every
disjoint lane, a property test checks it). Stage names are numbered in their sorted order (:class:`_Names`), so
that a sort on the number is the sort on (role, stage). The waits are found for all the lanes of a role at once:
their gaps gathered as columns and attributed in one loop over them (:func:`_attribute`, against each role's index
as columns, :data:`_Columns`), summed by (lane, cause) in one dict of ints and sorted once, a role at a time (the
step's peak memory), and added to its :class:`~instrument.analyze.model.RankTable` as columns
(:meth:`~instrument.analyze.model.RankTable.add_lanes`).

One module of ~800 lines, on purpose: reading a step's columns, indexing its lanes, the waits and the critical
path share the private index types (the stage numbering, the chunks, the lanes' columns, the per-role end index
as tuples and as columns, the cause numbers); the judgement across steps and the entry point are :mod:`._timeline`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import reduce
from itertools import accumulate, compress, groupby, islice, repeat
from operator import add, attrgetter, floordiv, itemgetter, lt, mod, mul, neg, sub, truediv

from instrument.analyze.analyzers._findings import GENERATION_ROLE
from instrument.analyze.model import (
    GENERATION_STAGES,
    RankTable,
    RoleTimeline,
    StepTimeline,
    TimeShare,
)
from instrument.naming import SDK_STAGE_PREFIX
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
# (end, -lane index, -start, -thread, start, lane index, cause: stage id x (lanes in the step + 1) + lane index).
_Ended = tuple[int, int, int, int, int, int, int]
# A process's stage spans in one step, as columns: (role, rank, starts, ends, threads, stage ids, in order:
# each ends before the next starts, none is empty, so that they are sorted and disjoint as they are).
_Chunk = tuple[str, int, list[int], list[int], list[int], list[int], bool]
_FAR = 1 << 62  # later than any clock (ns)
_STAGE, _STEP, _WINDOW, _OTHER = range(4)
_KINDS = {"stage": _STAGE, "step": _STEP, "window": _WINDOW}
_first, _fourth, _fifth, _sixth, _seventh = itemgetter(0), itemgetter(3), itemgetter(4), itemgetter(5), itemgetter(6)
_role_of = attrgetter("role")


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


class _Names:
    """The (role, stage) of every stage name in a table, numbered in their sorted order, and each part's name
    entries as kinds, roles and those numbers (-1: not a stage)."""

    __slots__ = (
        "causes",
        "generation",
        "keys",
        "kids",
        "kinds",
        "nonstage",
        "order",
        "own",
        "roles",
        "sdk",
        "stage_role",
    )

    def __init__(self, table: SpanTable) -> None:
        keys = sorted({(r, s) for columns, _ in table.parts for k, r, s in columns.names if k == "stage"})
        self.keys: list[tuple[str, str]] = keys
        self.causes: list[tuple[str | None, str]] = [*keys, (None, UNATTRIBUTED)]  # a RankTable's, by number
        # The SDK's own spans (instrument:<what>), by number: neither the user's stage time nor idle.
        self.sdk = [stage.startswith(SDK_STAGE_PREFIX) for _, stage in keys]
        self.own = frozenset(kid for kid, sdk in enumerate(self.sdk) if sdk)
        self.generation = [
            not sdk and (stage in GENERATION_STAGES or role == GENERATION_ROLE)
            for (role, stage), sdk in zip(keys, self.sdk, strict=True)
        ]
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
    of its calls, in the order the stages first start, for the user's stages only: the SDK's own spans are
    ``instrument`` ns, taken out of ``busy`` and out of the top-level stage they lie in (``nested``)."""

    __slots__ = (
        "block_ends",
        "block_starts",
        "busy",
        "by_stage",
        "end",
        "ended",
        "generation",
        "index",
        "instrument",
        "nested",
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
        self.instrument = 0  # ns of the SDK's own spans (not in busy, not in by_stage)
        self.nested: list[tuple[int, int, int]] = []  # SDK spans inside a top-level user stage: (start, end, kid)
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
        self.own = names.own
        self.aligned = aligned
        self.uncertainty = uncertainty
        self.tolerance = tolerance
        self.keys = names.keys
        self.causes = names.causes
        self.path: list[tuple[str, str, int, int]] = []  # the critical path: (role, stage, rank, ns)
        self.path_codes: list[int] = []  # each part's cause number (-1: no stage, an idle part)
        self.path_ends: list[int] = []  # where each part ends (the parts tile the step, in time order)
        self.wall = 0
        windows = spans.windows
        members = self._assign(windows, spans.chunks)
        self.lanes: list[Lane] = []
        by_role: dict[str, list[_Ended]] = defaultdict(list)
        self.generation_runs: list[tuple[int, int]] = []
        count = len(members) + 1  # cause numbers: stage number x (lanes + 1) + lane index; no lane: + lanes
        self.unattributed = len(self.keys) * count + count - 1  # the cause number of no cause
        for index, key in enumerate(sorted(members)):
            lane = self._lane(key, index, members[key], windows.get(key), names.generation, count)
            self.lanes.append(lane)
            if aligned:  # only waits need the index, and only aligned clocks have waits
                by_role[lane.role].extend(lane.ended)
            lane.ended = ()
        self.order = names.order
        self.by_role: dict[str, list[_Ended]] = {}
        self.ends_by_role: dict[str, list[int]] = {}
        self.columns: dict[str, _Columns] = {}  # by role: its index as columns, for the step's gaps at once
        self.tops: list[tuple[_Ended, _Ended | None]] = []  # by role: its last-ending stage, the last on another lane
        for role in sorted(by_role):
            entries = sorted(by_role[role])  # unique on the first four: the cause is never compared
            self.by_role[role] = entries
            self.ends_by_role[role] = ends = list(map(_first, entries))
            self.columns[role] = _columns(ends, entries, self.unattributed)
            if entries:
                top, i = entries[-1], len(entries) - 2
                while i >= 0 and entries[i][5] == top[5]:
                    i -= 1
                self.tops.append((top, entries[i] if i >= 0 else None))

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
        if self.own and not self.own.isdisjoint(lane.by_stage):
            _own_time(lane, starts, ends, kids, self.own)
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

    def _waited_for(self, lane: Lane, gap_start: int, gap_end: int) -> _Ended | None:
        """What ``lane`` waited for in its idle gap ``[gap_start, gap_end]`` (rules in the module docstring)."""
        unc = self.uncertainty
        low, high, before = max(gap_end - unc - self.tolerance, gap_start - unc), gap_end + unc, gap_end
        best = None
        for role in self.by_role:
            if role != lane.role:
                entry = self._latest(role, low, high, lane.index, before)
                if entry is not None and (best is None or entry > best):  # unique on the first four
                    best = entry
        if best is None and lane.role in self.by_role:
            best = self._latest(lane.role, low, high, lane.index, before)
        return best

    def _ended_last(self, lane: int, low: int) -> _Ended | None:
        """The latest-ending stage of the step, of any role, on a lane other than ``lane``, ended at ``low`` or
        later (:meth:`_latest` of every role with no upper bound, from each role's top two lanes)."""
        best = None
        for top, other in self.tops:
            entry = top if top[5] != lane else other
            if entry is not None and entry[0] >= low and (best is None or entry > best):
                best = entry
        return best

    def _waits(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """What every lane waited for, all lanes at once: each lane's causes (numbers into :attr:`causes`),
        their ranks (-1: unattributed) and ns, lane after lane, largest first (in the order TimeShare values
        sort in: by their ms, then the cause's (role or "", stage), rank), and where each lane's rows begin.

        A gap inside or at the head of a step is :meth:`_waited_for`'s rule, over the gaps of a role's lanes
        at once (:func:`_attribute`); one at the end, :meth:`_end_gap` (along the critical path)."""
        unc, slack, count, lanes = self.uncertainty, self.uncertainty + self.tolerance, len(self.lanes), self.lanes
        width = self.unattributed + 1
        ranks = [lane.rank for lane in lanes]
        ranks.append(-1)  # no lane: unattributed
        kids_out: list[int] = []
        ranks_out: list[int] = []
        ns_out: list[int] = []
        bounds = [0]
        first = 0
        for role, same in groupby(map(_role_of, lanes)):  # a role's lanes are next to each other: one at a time
            past = first + len(list(same))
            waited: dict[int, int] = {}  # lane index x width + cause number -> ns
            a_s: list[int] = []
            b_s: list[int] = []
            at: list[int] = []  # the lane index, a gap
            for lane in islice(lanes, first, past):
                starts, ends = lane.block_starts, lane.block_ends
                blocks = len(starts)
                if blocks and starts[0] > lane.start:
                    a_s.append(lane.start)
                    b_s.append(starts[0])
                    at.append(lane.index)
                if blocks > 1:
                    a_s.extend(islice(ends, blocks - 1))
                    b_s.extend(islice(starts, 1, None))
                    at.extend(repeat(lane.index, blocks - 1))
                previous = ends[-1] if blocks else lane.start
                if lane.end > previous:  # it finished early (or ran no stage at all)
                    self._end_gap(lane, previous, waited, width)
            if a_s:
                others = [self.columns[r] for r in self.columns if r != role]
                own = self.columns.get(role)
                _attribute(a_s, b_s, at, others, own, unc, slack, width, self.unattributed, waited)
            del a_s, b_s, at
            keys, ns = list(waited), list(waited.values())
            del waited
            codes = list(map(mod, keys, repeat(width)))
            kids = list(map(floordiv, codes, repeat(count + 1)))
            rows = list(
                zip(
                    map(floordiv, keys, repeat(width)),
                    map(neg, ns),
                    map(self.order.__getitem__, kids),
                    map(ranks.__getitem__, map(mod, codes, repeat(count + 1))),
                    kids,
                    ns,
                    strict=True,
                )
            )
            del keys, codes, kids, ns
            rows.sort()  # by lane, then as TimeShare values sort: by their ms (ns order is the same), then the cause
            lane_of = list(map(_first, rows))
            bounds.extend(map(add, map(bisect_right, repeat(lane_of), range(first, past)), repeat(len(ns_out))))
            kids_out.extend(map(_fifth, rows))
            ranks_out.extend(map(_fourth, rows))
            ns_out.extend(map(_sixth, rows))
            first = past
        return kids_out, ranks_out, ns_out, bounds

    def _end_gap(self, lane: Lane, low: int, waited: dict[int, int], width: int) -> None:
        """Adds ``lane``'s idle from ``low`` to its end (it finished early) to ``waited``, in at most two rows: while
        the critical path runs on one other lane from ``low`` on (a slow peer), the wait is for it (its last stage
        there); the rest, for the latest-ending stage elsewhere (:meth:`_ended_last`), as before the path went on."""
        base, high, codes, ends = lane.index * width, lane.end, self.path_codes, self.path_ends
        count = len(self.lanes) + 1
        i = bisect_right(ends, low)
        if i < len(ends) and codes[i] >= 0 and codes[i] % count != lane.index:
            on = codes[i] % count
            while i + 1 < len(ends) and codes[i + 1] >= 0 and codes[i + 1] % count == on:
                i += 1
            past = min(ends[i], high)
            waited[base + codes[i]] = waited.get(base + codes[i], 0) + past - low
            low = past
        if low < high:
            cause = self._ended_last(lane.index, low - self.uncertainty + 1)
            code = self.unattributed if cause is None else cause[6]
            waited[base + code] = waited.get(base + code, 0) + high - low

    # ---------------------------------------------------------------- the critical path

    def _critical_path(self, w0: int, w1: int) -> list[tuple[str, str, int, int]]:
        parts: list[tuple[str, str, int, int]] = []  # (role, stage, rank, ns), from the end backwards
        codes = self.path_codes
        count = len(self.lanes) + 1

        def add_part(role: str, stage: str, rank: int, ns: int, code: int = -1) -> None:
            if ns <= 0:
                return
            if parts and parts[-1][:3] == (role, stage, rank):
                parts[-1] = (role, stage, rank, parts[-1][3] + ns)
            else:
                parts.append((role, stage, rank, ns))
                codes.append(code)

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
                low, own = max(a, w0), 0
                for kid, ns in _inside(lane.nested, low, t):  # the SDK's own time inside it is its own part
                    add_part(*self.keys[kid], lane.rank, ns, kid * count + lane.index)
                    own += ns
                add_part(role, stage, lane.rank, t - low - own, lane.top_kids[j] * count + lane.index)
                t = a
                continue
            # t starts a busy run: what did the lane wait for in the gap before it?
            if k >= 0 and starts[k] == t:
                k -= 1
            gap_start = ends[k] if k >= 0 else lane.start
            cause = self._waited_for(lane, gap_start, t)
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
        codes.reverse()
        return parts

    # ---------------------------------------------------------------- the step's values

    def result(self) -> StepTimeline:
        lanes = self.lanes
        if self.aligned:
            w0, w1 = min(lane.start for lane in lanes), max(lane.end for lane in lanes)
            self.wall = wall = w1 - w0
            self.path = self._critical_path(w0, w1)
            self.path_ends = list(accumulate((ns for *_, ns in self.path), initial=w0))[1:]
            path = tuple(TimeShare(r, s, k, _ms(ns)) for r, s, k, ns in self.path)
            generation = _union_length(self.generation_runs, w0, w1)
        else:
            self.wall = wall = max(lane.end - lane.start for lane in lanes)
            path = ()
            generation = max(lane.generation for lane in lanes)
        table = RankTable(self.causes)  # the step's lanes and waits as columns: millions of waits at 4,096 ranks
        busy = [lane.busy for lane in lanes]
        own = [lane.instrument for lane in lanes]
        idle = [lane.end - lane.start - lane.busy - lane.instrument for lane in lanes]
        if self.aligned:
            kids, ranks, ns, bounds = self._waits()
        else:
            kids, ranks, ns, bounds = [], [], [], [0] * (len(lanes) + 1)
        if self.own and not self.own.isdisjoint(kids):  # waits for the SDK's own spans are its time, not idle
            for j in compress(range(len(kids)), map(self.own.__contains__, kids)):
                i = bisect_right(bounds, j) - 1
                own[i] += ns[j]
                idle[i] -= ns[j]
        table.add_lanes(
            [lane.rank for lane in lanes], [lane.role for lane in lanes], busy, idle, bounds, kids, ranks, ns, own
        )
        roles = {}
        first = 0
        for role, same in groupby(map(_role_of, lanes)):  # a role's lanes are next to each other
            past = first + len(list(same))
            lo, hi = bounds[first], bounds[past]
            summed = _ms_sums(kids[lo:hi], ns[lo:hi])  # in the lanes' order, as the reader sums them
            named = [(self.causes[kid], ms) for kid, ms in summed.items()]
            ranked = sorted(named, key=lambda kv: (-kv[1], kv[0][0] or "", kv[0][1]))
            shares = tuple(TimeShare(r, s, None, ms) for (r, s), ms in ranked)
            role_busy, role_idle, role_own = sum(busy[first:past]), sum(idle[first:past]), sum(own[first:past])
            roles[role] = RoleTimeline(role, past - first, _ms(role_busy), _ms(role_idle), shares, _ms(role_own))
            first = past
        if self.aligned:
            instrument = sum(ns for _, stage, _, ns in self.path if stage.startswith(SDK_STAGE_PREFIX))
        else:
            instrument = max(own, default=0)
        traced = any(lane.instrument for lane in lanes)
        return StepTimeline(self.step, _ms(wall), path, roles, table, _ms(generation), _ms(instrument), traced=traced)

    def stage_time(self) -> dict[tuple[str, str], int]:
        """(role, stage) -> ns of the step it accounts for: on the critical path; unaligned, its longest lane (the
        user's stages only: the SDK's own spans are the step's ``instrument_ms``)."""
        totals: dict[tuple[str, str], int] = defaultdict(int)
        if self.aligned:
            for role, stage, _, ns in self.path:
                if stage != IDLE and not stage.startswith(SDK_STAGE_PREFIX):
                    totals[(role, stage)] += ns
        else:
            keys = self.keys
            for lane in self.lanes:
                for kid, ns in lane.by_stage.items():
                    key = keys[kid]
                    totals[key] = max(totals[key], ns)
        return totals


def _own_time(lane: Lane, starts: list[int], ends: list[int], kids: list[int], own: frozenset[int]) -> None:
    """Takes the SDK's own spans out of ``lane``'s user time: their ns (each one's calls' union, as ``by_stage``
    gives it) go from ``by_stage`` and ``busy`` to ``instrument``; one inside a top-level user stage (an export in a
    profiler's schedule step) is taken out of that stage's time too, and kept in ``nested`` for the critical path."""
    by_stage = lane.by_stage
    lane.instrument = sum(by_stage.pop(kid) for kid in own.intersection(by_stage))
    lane.busy = max(0, lane.busy - lane.instrument)
    top_starts, top_ends, top_kids = lane.top_starts, lane.top_ends, lane.top_kids
    for start, end, kid in zip(starts, ends, kids, strict=True):
        if kid not in own:
            continue
        a, b = max(start, lane.start), min(end, lane.end)
        j = bisect_right(top_starts, a) - 1
        if b <= a or j < 0 or top_kids[j] in own or top_ends[j] < b:
            continue  # top-level itself (or across a stage's edge: left to the stage)
        parent = top_kids[j]
        by_stage[parent] = max(0, by_stage[parent] - (b - a))
        lane.nested.append((a, b, kid))
    lane.nested.sort()


def _inside(nested: list[tuple[int, int, int]], low: int, high: int) -> list[tuple[int, int]]:
    """The SDK's nested spans' ns within ``[low, high]``, by stage number."""
    found: dict[int, int] = {}
    for a, b, kid in nested:
        ns = min(b, high) - max(a, low)
        if ns > 0:
            found[kid] = found.get(kid, 0) + ns
    return sorted(found.items())


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


# The index of a role's top-level stages in a step, as columns, each with a first row that no gap finds:
# (ends, ends, starts, lane indexes, cause numbers, entries); the ends first without it, for bisection.
_Columns = tuple[list[int], list[int], list[int], list[int], list[int], list[_Ended | None]]
_NEVER = -(1 << 80)  # earlier than any window


def _columns(ends: list[int], entries: list[_Ended], unattributed: int) -> _Columns:
    """``entries`` (sorted, their ``ends``) as :data:`_Columns`; the first row's cause: ``unattributed``."""
    return (
        ends,
        [_NEVER, *ends],
        [_FAR, *map(_fifth, entries)],
        [-1, *map(_sixth, entries)],
        [unattributed, *map(_seventh, entries)],
        [None, *entries],
    )


def _attribute(
    a_s: list[int],
    b_s: list[int],
    lanes: list[int],
    others: list[_Columns],
    own: _Columns | None,
    unc: int,
    slack: int,
    width: int,
    unattributed: int,
    waited: dict[int, int],
) -> None:
    """Adds each gap ``a_s[j]`` to ``b_s[j]`` of lane ``lanes[j]`` to ``waited[lane x width + cause]`` (ns): the
    latest-ending stage of another role (in ``others``) that ended in ``[max(b - slack, a - unc), b + unc]`` and
    started before ``b``, else one of its own role (``own``) on another lane, else ``unattributed``; what
    :meth:`Step._waited_for` finds for a gap inside or at the head of a step, one loop turn a gap."""
    get = waited.get
    reach = max(b_s) + unc
    others = [index for index in others if index[0] and index[0][0] <= reach]  # the others no window reaches go
    one = others[0] if len(others) == 1 else None
    several = others if len(others) > 1 else []
    if own is not None and own[0]:
        ends, end, start, lane, cause = own[0], own[1], own[2], own[3], own[4]
    else:  # no stage of its role: nothing found there
        ends, end, start, lane, cause = [], [_NEVER], [_FAR], [-1], [unattributed]
    own_last, own_top = ends[-1] if ends else _NEVER, len(ends)
    if one is not None:
        one_ends, one_end, one_start, one_cause = one[0], one[1], one[2], one[4]
        one_last, one_top = one_ends[-1], len(one_ends)
    else:
        one_ends, one_end, one_start, one_cause, one_last, one_top = [], [], [], [], _NEVER, 0
    for a, b, li in zip(a_s, b_s, lanes, strict=True):
        low = b - slack
        if a - unc > low:  # noqa: PLR1730  # no call: once a gap, millions of times
            low = a - unc
        code = -1
        if one_last >= low:  # one other role, whose last stage ended in reach (another lane): only the start checked
            i = one_top if b + unc >= one_last else bisect_right(one_ends, b + unc)
            while one_end[i] >= low:  # the first row ends before any window
                if one_start[i] < b:
                    code = one_cause[i]
                    break
                i -= 1
        elif several:  # several other roles: the latest-ending of what each gives
            best = None
            for index in several:
                index_end, index_start = index[1], index[2]
                i = bisect_right(index[0], b + unc)
                while index_end[i] >= low:
                    if index_start[i] < b:
                        entry = index[5][i]
                        if best is None or entry > best:  # type: ignore[operator]
                            best = entry
                        break
                    i -= 1
            if best is not None:
                code = best[6]
        if code < 0:
            i = own_top if b + unc >= own_last else bisect_right(ends, b + unc)
            while end[i] >= low:
                if lane[i] != li and start[i] < b:
                    break
                i -= 1
            else:
                i = 0
            code = cause[i]
        key = li * width + code
        waited[key] = get(key, 0) + b - a


def _ms_sums(kids: list[int], ns: list[int]) -> dict[int, float]:
    """Each cause's ns in ms, summed in the order given (0.0 + ms + ms ...), the causes in the order they first
    come (what ``sums[kid] = sums.get(kid, 0.0) + n / NS_PER_MS`` over them gives)."""
    order = sorted(range(len(kids)), key=kids.__getitem__)  # stable: in the order given within a cause
    by_kid = list(map(kids.__getitem__, order))
    ms = list(map(truediv, map(ns.__getitem__, order), repeat(NS_PER_MS)))
    sums = {}
    for kid in dict.fromkeys(kids):
        lo = bisect_left(by_kid, kid)
        sums[kid] = reduce(add, ms[lo : bisect_right(by_kid, kid, lo)], 0.0)
    return sums
