"""The test and the interval a comparison of two runs rests on (pure; the standard library only).

- :func:`mann_whitney`: the two-sided Mann-Whitney U test (Wilcoxon rank-sum): exact up to :data:`EXACT_MAX`
  samples a side when there are no ties (the U distribution from the Gaussian binomial coefficients), else
  the normal approximation with the tie and continuity corrections. Under "no change" — both runs' samples
  drawn independently from one distribution, whatever its shape — it rejects at level ``alpha`` with
  probability at most ``alpha``.
- :func:`ratio_interval`: the Hodges-Lehmann interval of the log ratio — the k-th smallest and largest of the
  pairwise differences of log durations, ``k`` the test's critical value — found by bisection on its value
  (never the m*n differences themselves), so it excludes 0 exactly when the test rejects (ties aside).
- :func:`judge`: medians, change, interval, p-value and the verdict (:class:`~..model.Verdict`); ``against``
  judges the candidate against the baseline times a factor (the machine-wide shift) instead of the baseline.
- :func:`machine_shift`: a change common to every stage of a run (a machine that got slower or faster): the
  median of the stages' log ratios, so one stage that changed, or a few, cannot move it; and whether it is
  common (most stages moved that way beyond noise), in which case each stage is judged against it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from instrument.analyze.model import MachineShift, Verdict

__all__ = [
    "ALPHA",
    "EXACT_MAX",
    "MAX_TEST_SAMPLES",
    "MIN_CHANGE_PCT",
    "MIN_SAMPLES",
    "MIN_SHIFT_ALONG",
    "MIN_SHIFT_STAGES",
    "Judged",
    "judge",
    "machine_shift",
    "mann_whitney",
    "ratio_interval",
    "stands_out",
]

ALPHA = 0.01
"""Level of the test: the false-positive rate it promises per (role, stage) compared."""
MIN_CHANGE_PCT = 5.0
"""A change beyond noise is reported only from this size (``--min-change``)."""
MIN_SAMPLES = 5
"""Samples a side below which there is no verdict (5 and 5 is the least that can reach p < 0.01)."""
EXACT_MAX = 30
"""Samples a side up to which the test's distribution is exact (no ties)."""
MAX_TEST_SAMPLES = 20_000
"""Samples a side the test and interval take at most (a fixed-seed subsample; medians use all)."""

MIN_SHIFT_STAGES = 3
"""Stages with a verdict below which no machine-wide shift is looked for: of two, neither can be told from the
machine."""
MIN_SHIFT_ALONG = 1
"""Stages beyond noise the shift's way it needs to be common: without one, the stages' medians moved by noise."""
OUTLIER_SPREADS = 3.0
"""Under a machine-wide shift, a stage is its own change only when it is this many robust spreads (1.4826 x the
median absolute deviation of the stages' log ratios around the shift) from it: a loaded machine does not slow
every stage by exactly one factor."""

_FLOOR_MS = 1e-6  # log of a zero duration: a nanosecond


def _ranked(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """The rank sum of ``y`` in the pooled sample (ties at their mean rank) and the ties' sum of t^3 - t."""
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    rank_y = 0.0
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        rank_y += mean_rank * sum(1 for k in range(i, j + 1) if pooled[k][1])
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return rank_y, ties


def _exact_counts(m: int, n: int) -> list[int]:
    """How many orderings give U = 0 .. m*n: the coefficients of the Gaussian binomial [m+n choose m]_q."""
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)  # times (1 - q^(n+i))
        for j in range(len(grown) - 1, n + i - 1, -1):
            grown[j] -= grown[j - n - i]
        for j in range(i, len(grown)):  # over (1 - q^i): exact
            grown[j] += grown[j - i]
        poly = grown[: m * n + 1]
    return poly


def _exact(m: int, n: int, ties: float) -> bool:
    return not ties and max(m, n) <= EXACT_MAX


def _sd(m: int, n: int, ties: float) -> float:
    total = m + n
    return math.sqrt(m * n / 12.0 * ((total + 1) - ties / (total * (total - 1))))


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> float:
    """The two-sided p-value of the Mann-Whitney U test of ``x`` against ``y`` (1.0 when it cannot tell)."""
    m, n = len(x), len(y)
    if not m or not n:
        return 1.0
    rank_y, ties = _ranked(x, y)
    u = rank_y - n * (n + 1) / 2
    if _exact(m, n, ties):
        counts = _exact_counts(m, n)
        whole = sum(counts)
        low = sum(counts[: int(u) + 1]) / whole
        high = sum(counts[int(u) :]) / whole
        return min(1.0, 2 * min(low, high))
    sd = _sd(m, n, ties)
    if sd == 0:
        return 1.0
    z = (abs(u - m * n / 2) - 0.5) / sd
    return 1.0 if z <= 0 else math.erfc(z / math.sqrt(2))


def _critical(m: int, n: int, ties: float, alpha: float) -> int:
    """``k``: the interval is the k-th smallest and k-th largest pairwise difference (0: unbounded)."""
    if _exact(m, n, ties):
        counts = _exact_counts(m, n)
        whole = sum(counts)
        k, below = 0, 0
        while k < len(counts) and (below + counts[k]) / whole <= alpha / 2:
            below += counts[k]
            k += 1
        return k
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return max(0, math.floor(m * n / 2 - z * _sd(m, n, ties) + 0.5))


def _kth_difference(xs: Sequence[float], ys: Sequence[float], k: int) -> float:
    """The k-th smallest (1-based) of every ``y - x``, by bisection on its value: O((m + n) log range)."""
    m = len(xs)

    def at_most(value: float) -> int:
        count, i = 0, 0
        for y in ys:  # ys ascending: y - value ascends, so the first x above it only moves right
            while i < m and xs[i] < y - value:
                i += 1
            count += m - i
        return count

    lo, hi = ys[0] - xs[-1], ys[-1] - xs[0]
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, abs(hi)):
            break
        mid = (lo + hi) / 2
        if at_most(mid) >= k:
            hi = mid
        else:
            lo = mid
    return hi


def ratio_interval(x: Sequence[float], y: Sequence[float], alpha: float) -> tuple[float, float] | None:
    """The (1 - alpha) interval of ``y`` over ``x``, in % change (Hodges-Lehmann on logs); ``None``: unbounded."""
    m, n = len(x), len(y)
    if not m or not n:
        return None
    _, ties = _ranked(x, y)
    k = _critical(m, n, ties, alpha)
    if k < 1:
        return None
    xs = sorted(math.log(max(v, _FLOOR_MS)) for v in x)
    ys = sorted(math.log(max(v, _FLOOR_MS)) for v in y)
    lo = _kth_difference(xs, ys, k)
    hi = _kth_difference(xs, ys, m * n - k + 1)
    return 100.0 * math.expm1(lo), 100.0 * math.expm1(hi)


class Judged(NamedTuple):
    """Two sets of durations judged: medians, change, interval, p-value and verdict."""

    baseline_ms: float
    candidate_ms: float
    change_pct: float | None
    ci_pct: tuple[float, float] | None
    p_value: float | None
    verdict: str


def _capped(values: Sequence[float]) -> Sequence[float]:
    if len(values) <= MAX_TEST_SAMPLES:
        return values
    return random.Random(len(values)).sample(list(values), MAX_TEST_SAMPLES)  # fixed seed: same answer each run


def judge(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    alpha: float = ALPHA,
    min_change_pct: float = MIN_CHANGE_PCT,
    min_samples: int = MIN_SAMPLES,
    against: float = 1.0,
) -> Judged:
    """Whether ``candidate`` differs from ``baseline`` beyond noise, and by how much (medians; ms).

    ``against``: a factor the baseline is multiplied by first (a machine-wide shift): the change, interval,
    p-value and verdict are then the candidate's against it; the medians stay the measured ones."""
    b = statistics.median(baseline) if baseline else 0.0
    c = statistics.median(candidate) if candidate else 0.0
    expected = b * against
    change = 100.0 * (c / expected - 1.0) if expected > 0 else (0.0 if c == 0 else None)
    if len(baseline) < min_samples or len(candidate) < min_samples:
        return Judged(b, c, change, None, None, Verdict.TOO_FEW)
    x, y = _capped(baseline), _capped(candidate)
    if against != 1.0:
        x = [v * against for v in x]
    p = mann_whitney(x, y)
    interval = ratio_interval(x, y, alpha)
    if p >= alpha:
        verdict = Verdict.NOISE
    elif change is None or abs(change) >= min_change_pct:
        verdict = Verdict.CHANGED
    else:
        verdict = Verdict.SMALL
    return Judged(b, c, change, interval, p, verdict)


def machine_shift(
    ratios: Sequence[float], directions: Sequence[int], *, min_change_pct: float = MIN_CHANGE_PCT
) -> MachineShift | None:
    """The machine-wide shift of stages whose medians moved by ``ratios`` (candidate over baseline, each > 0);
    ``directions``: each stage's verdict against the baseline itself (+1 slower, -1 faster beyond noise, 0
    not). ``None`` under :data:`MIN_SHIFT_STAGES` stages.

    Common when more than half of the stages moved by ``min_change_pct`` or more its way (so the median is
    no average of a changed and an unchanged stage, and one stage that changed alone cannot make it) and at
    least :data:`MIN_SHIFT_ALONG` of them beyond noise that way (a loaded machine makes most stages too noisy
    for a verdict of their own, yet they all moved)."""
    if len(ratios) < MIN_SHIFT_STAGES:
        return None
    logs = [math.log(r) for r in ratios]
    centre = statistics.median(logs)
    spread = 1.4826 * statistics.median(abs(v - centre) for v in logs)
    pct = 100.0 * math.expm1(centre)
    way = 1 if centre > 0 else -1 if centre < 0 else 0
    bar = math.log1p(min_change_pct / 100.0)
    moved = sum(1 for v in logs if way and v * way >= bar * (1 - 1e-12))  # 1e-12: rounding at the bar itself
    along = sum(1 for d in directions if way and d == way)
    common = 2 * moved > len(ratios) and along >= MIN_SHIFT_ALONG
    return MachineShift(pct, len(ratios), moved, along, 100.0 * math.expm1(spread), common)


def stands_out(ratio: float, shift: MachineShift) -> bool:
    """Whether a stage whose median moved by ``ratio`` is beyond what the machine-wide shift's spread explains
    (:data:`OUTLIER_SPREADS` robust spreads from it)."""
    spread = math.log1p(shift.spread_pct / 100.0)
    return abs(math.log(ratio) - math.log(shift.factor)) > max(OUTLIER_SPREADS * spread, 1e-9)  # 1e-9: rounding
