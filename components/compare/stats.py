"""Means with 95 % confidence intervals from a handful of seeds (Student's t)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Estimate:
    mean: float
    ci95: float | None  # half-width; None with fewer than two values
    n: int

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.ci95 is None else (self.mean - self.ci95, self.mean + self.ci95)

    def as_dict(self) -> dict[str, float | int | list[float] | None]:
        interval = self.interval
        return {
            "mean": self.mean,
            "ci95_half_width": self.ci95,
            "ci95": None if interval is None else list(interval),
            "n": self.n,
        }


def estimate(values: Sequence[float]) -> Estimate:
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean, None, n)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half_width = float(stats.t.ppf(0.975, n - 1)) * math.sqrt(variance / n)
    return Estimate(mean, half_width, n)
