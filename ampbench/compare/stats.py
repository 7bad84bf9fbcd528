"""Figures over a handful of seeds with 95 % confidence intervals (Student's t).

Differences (accuracy in pp) get the arithmetic mean of the per-seed values and its t-interval.
Ratios (speedup, memory) get the geometric mean of the per-seed ratios and the t-interval of
their logarithms, mapped back: the interval is centred, on the log scale, on the figure shown,
and a ratio and its reciprocal have reciprocal intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ampbench.comparison import Estimate


def _t_half_width(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95 % t-interval; None with fewer than two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    from scipy import stats  # only where there is an interval to make

    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, float(stats.t.ppf(0.975, n - 1)) * math.sqrt(variance / n)


def mean_estimate(values: Sequence[float]) -> Estimate:
    mean, half = _t_half_width(values)
    if half is None:
        return Estimate(mean, None, None, len(values))
    return Estimate(mean, mean - half, mean + half, len(values))


def ratio_estimate(ratios: Sequence[float]) -> Estimate:
    """Geometric mean of positive ratios, with the t-interval of their logarithms."""
    if any(not r > 0 for r in ratios):
        raise ValueError(f"ratios must be positive: {list(ratios)}")
    log_mean, half = _t_half_width([math.log(r) for r in ratios])
    if half is None:
        return Estimate(math.exp(log_mean), None, None, len(ratios))
    return Estimate(
        math.exp(log_mean), math.exp(log_mean - half), math.exp(log_mean + half), len(ratios)
    )
