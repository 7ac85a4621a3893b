"""Uncertainty of the report's means (docs/output.md, "Standard errors"): the standard error of
a mean over cases (``Spread``) and the paired comparison of two jobs on the cases both ran
(``paired``). Samples of one case are not independent (same prompt, same grader), so every
estimate here treats the case as the unit: one value per case, the case's mean over its samples.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

Z975 = 1.959963984540054
"""The standard normal's 97.5% quantile."""

_T975 = (
    12.706204736,
    4.302652730,
    3.182446305,
    2.776445105,
    2.570581836,
    2.446911851,
    2.364624252,
    2.306004135,
    2.262157163,
    2.228138852,
    2.200985160,
    2.178812830,
    2.160368656,
    2.144786688,
    2.131449546,
    2.119905299,
    2.109815578,
    2.100922040,
    2.093024054,
    2.085963447,
    2.079613845,
    2.073873068,
    2.068657610,
    2.063898562,
    2.059538553,
    2.055529439,
    2.051830516,
    2.048407142,
    2.045229642,
    2.042272456,
)
"""Student's t 97.5% quantiles for 1..30 degrees of freedom."""


def t975(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` >= 1 degrees of freedom: the table up to 30, above it
    the Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5; within 1e-4 of the exact
    value from 31 on)."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


class Spread:
    """Mean and standard error of values added one at a time (Welford's running sums: memory
    stays flat). ``stderr`` = sample standard deviation (n - 1) / sqrt(n), None under 2 values."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0

    def add(self, value: float, times: int = 1) -> None:
        """Add ``value`` ``times`` times."""
        for _ in range(times):
            self.n += 1
            delta = value - self.mean
            self.mean += delta / self.n
            self._m2 += delta * (value - self.mean)

    @property
    def stderr(self) -> float | None:
        """The standard error of the mean, None for fewer than 2 values."""
        if self.n < 2:
            return None
        return math.sqrt(max(self._m2, 0.0) / (self.n - 1) / self.n)


def stderr(values: Iterable[float]) -> float | None:
    """The standard error of the mean of ``values`` (``Spread``), None for fewer than 2."""
    spread = Spread()
    for v in values:
        spread.add(v)
    return spread.stderr


@dataclass(frozen=True)
class PairedDiff:
    """Two jobs on the cases both scored: ``common`` such cases, ``only_a`` / ``only_b`` the cases
    one job scored and the other did not; ``mean_a`` / ``mean_b`` the mean over the common cases of
    each case's mean score; ``diff`` = mean_b - mean_a; ``stderr`` = sd(d) / sqrt(common) of the
    per-case differences d (None under 2 common cases); ``ci95`` = diff -+ t(0.975, common - 1) *
    stderr (None with it, and None when every d is the same: no spread to make an interval from,
    which would otherwise read as a certain difference)."""

    common: int
    only_a: int
    only_b: int
    mean_a: float | None
    mean_b: float | None
    diff: float | None
    stderr: float | None
    ci95: tuple[float, float] | None


def paired(a: Mapping[K, float], b: Mapping[K, float]) -> PairedDiff:
    """Compare per-case mean scores ``a`` and ``b`` (case key -> mean) on the keys both have."""
    common = sorted(a.keys() & b.keys(), key=repr)
    if not common:
        return PairedDiff(0, len(a), len(b), None, None, None, None, None)
    mean_a = math.fsum(a[c] for c in common) / len(common)
    mean_b = math.fsum(b[c] for c in common) / len(common)
    diff = mean_b - mean_a
    se = stderr(b[c] - a[c] for c in common)
    ci = None if not se else (diff - t975(len(common) - 1) * se, diff + t975(len(common) - 1) * se)
    return PairedDiff(len(common), len(a) - len(common), len(b) - len(common), mean_a, mean_b, diff, se, ci)
