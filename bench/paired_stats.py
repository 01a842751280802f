"""Paired statistics of a benchmark whose variants share a unit per seed (same warm start, same data order, same
held-out puzzles): per-seed differences d_i = variant_i - reference_i, tested and bounded as one sample.

- :func:`paired_t`: mean of the d_i with the Student-t interval mean ± t_{(1+level)/2, n-1} s / sqrt(n) and the
  two-sided p-value 2 P(T_{n-1} >= |mean| / (s / sqrt(n))) (scipy's t distribution);
- :func:`sign_flip_p`: the exact two-sided sign-flip permutation p-value, #{s in {-1, 1}^n : |sum s_i d_i| >=
  |sum d_i|} / 2^n, which needs no normality (under "no difference" each d_i is as likely as -d_i); counted
  exactly by meeting in the middle (the 2^(n/2) signed sums of each half, one half sorted), up to n = 40;
- :func:`holm`: Holm's step-down adjustment over a family of m p-values: with p_(1) <= ... <= p_(m),
  p~_(k) = max_{j <= k} min(1, (m - j + 1) p_(j));
- :func:`wins_ties_losses`: how many d_i favour the variant, are zero, favour the reference;
- :func:`paired_t_power` and :func:`seeds_for_power`: the power of the two-sided paired t test at level alpha
  for a true mean difference delta and per-seed standard deviation sigma, P(|T'| > t_{1-alpha/2, n-1}) with T'
  noncentral t (n - 1 degrees of freedom, noncentrality delta sqrt(n) / sigma), and the least n reaching a power.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

MAX_SIGN_FLIP_N = 40  # exact count over 2^n sign vectors from two halves of 2^20 signed sums at most
TIE_TOLERANCE = 1e-9  # |d| at or below this is a tie (accuracies are multiples of 1 / num_eval)


@dataclass(frozen=True)
class PairedT:
    """Paired t summary of differences: n, mean, interval, t statistic, two-sided p-value, sample sd of the d_i.
    With n < 2 the interval, t and p are None (no spread to estimate); with s = 0 the interval is the point and
    p is 1 when the mean is 0, else 0 (every difference the same nonzero value)."""

    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    t: float | None
    p_value: float | None
    sd: float | None


def paired_t(diffs: Sequence[float], level: float = 0.95) -> PairedT:
    """Mean of ``diffs`` with its ``level`` Student-t interval and the two-sided paired t p-value."""
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")
    n = len(diffs)
    if n == 0:
        return PairedT(0, None, None, None, None, None, None)
    mean = statistics.fmean(diffs)
    if n == 1:
        return PairedT(1, mean, None, None, None, None, None)
    sd = statistics.stdev(diffs)
    if sd == 0:
        return PairedT(
            n, mean, mean, mean, 0.0 if mean == 0 else math.copysign(math.inf, mean), 1.0 if mean == 0 else 0.0, 0.0
        )
    se = sd / math.sqrt(n)
    t = mean / se
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * se
    return PairedT(n, mean, mean - half, mean + half, t, float(2 * stats.t.sf(abs(t), n - 1)), sd)


def _signed_sums(d: np.ndarray) -> np.ndarray:
    """The 2^len(d) sums sum_i s_i d_i over every sign vector s (each once)."""
    sums = np.zeros(1)
    for x in d:
        sums = np.concatenate([sums + x, sums - x])
    return sums


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-flip p-value of ``diffs``: the share of the 2^n sign vectors s with |sum s_i d_i| >=
    |sum d_i| (the identity included, so p >= 2 / 2^n when some d_i != 0; 1 for no differences).

    Counted without listing the 2^n vectors: with a the signed sums of the first half and b those of the second,
    |a + b| >= c exactly when b >= c - a or b <= -c - a (c > 0), two counts per a by binary search in sorted b."""
    n = len(diffs)
    if n > MAX_SIGN_FLIP_N:
        raise ValueError(f"sign_flip_p: exact enumeration needs at most {MAX_SIGN_FLIP_N} differences, got {n}")
    if n == 0:
        return 1.0
    d = np.asarray(diffs, dtype=np.float64)
    tolerance = 1e-9 * max(1.0, float(np.abs(d).sum()))  # sums equal up to rounding count as equal
    c = abs(float(d.sum())) - tolerance
    if c <= 0:
        return 1.0
    first, second = _signed_sums(d[: n // 2]), np.sort(_signed_sums(d[n // 2 :]))
    at_least = second.size - np.searchsorted(second, c - first, side="left")
    at_most = np.searchsorted(second, -c - first, side="right")
    return float(int(at_least.sum()) + int(at_most.sum())) / 2**n


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the order given; None entries stay None and are not counted in m."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        if not 0 <= p <= 1:
            raise ValueError(f"holm: p-values must lie in [0, 1], got {p}")
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def wins_ties_losses(diffs: Sequence[float], better: str = "higher") -> tuple[int, int, int]:
    """(wins, ties, losses) of the variant: a win is a difference in the ``better`` direction ("higher": d > 0,
    "lower": d < 0), a tie |d| <= TIE_TOLERANCE."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better: 'higher' or 'lower', got {better!r}")
    sign = 1 if better == "higher" else -1
    wins = sum(1 for d in diffs if sign * d > TIE_TOLERANCE)
    ties = sum(1 for d in diffs if abs(d) <= TIE_TOLERANCE)
    return wins, ties, len(diffs) - wins - ties


def paired_t_power(n: int, delta: float, sigma: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with ``n`` pairs when the differences have mean
    ``delta`` and standard deviation ``sigma`` (> 0): P(|T'| > t_{1-alpha/2, n-1}), T' ~ noncentral t."""
    if n < 2:
        raise ValueError(f"n: the paired t test needs at least 2 pairs, got {n}")
    if sigma <= 0:
        raise ValueError(f"sigma: must be > 0, got {sigma}")
    df, nc = n - 1, delta * math.sqrt(n) / sigma
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    # P(T' < -crit) for noncentrality nc is P(T' > crit) for -nc (scipy's nct.cdf far in the tail can return nan)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))


def seeds_for_power(
    delta: float, sigma: float, alpha: float = 0.05, power: float = 0.8, max_n: int = 100_000
) -> int | None:
    """Least n >= 2 with :func:`paired_t_power` >= ``power``; None when delta is 0 or no n up to ``max_n`` does."""
    if delta == 0:
        return None
    if paired_t_power(max_n, delta, sigma, alpha) < power:
        return None
    lo, hi = 2, max_n  # power grows with n: bisect for the first n that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_t_power(mid, delta, sigma, alpha) >= power else (mid + 1, hi)
    return lo
