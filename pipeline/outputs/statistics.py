"""The statistics of a report's cells: over seeds, mean, sample std and a 95 % confidence
interval, and a paired test of a row against the baseline's row.

- Spread: the sample std (ddof = 1: the seeds are a sample of the seeds one could run); the
  interval is Student's t, mean ± t(0.975, n − 1) · s / √n, which is right for a handful of
  seeds where a normal interval would be too narrow. One seed has neither: a single value.
- Tests are paired by seed: runs with the same seed share the initial models and the order in
  which clients are sampled, so the difference of two algorithms at one seed cancels what the
  seed alone does. The default is the paired t-test (scipy.stats.ttest_rel): with 3 to 5
  seeds it is the only common paired test that can reach p < 0.05 at all. The Wilcoxon
  signed-rank test (scipy.stats.wilcoxon, `--test wilcoxon`) assumes no normality but its
  exact two-sided p-value cannot go below 2 / 2^n: 0.25 at 3 seeds, 0.0625 at 5, below 0.05
  only from 6 seeds on. No correction for testing many rows and columns is applied.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

TESTS = ("t", "wilcoxon")
CONFIDENCE = 0.95
MARKS = ((0.01, "‡"), (0.05, "†"))  # p below → the mark after a cell


@dataclass(frozen=True)
class Summary:
    """A cell: n values, their mean, sample std and the 95 % t-interval (None with n < 2)."""

    n: int
    mean: float | None
    std: float | None
    low: float | None
    high: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.high is None or self.mean is None else self.high - self.mean


def summary(values: list[float], scale: float = 1.0) -> Summary:
    """The cell of `values` (each multiplied by `scale`: 100 for accuracies in %)."""
    x = np.asarray(values, dtype=float) * scale
    if x.size == 0:
        return Summary(0, None, None, None, None)
    mean = float(x.mean())
    if x.size == 1:
        return Summary(1, mean, None, None, None)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1)) * std / math.sqrt(x.size)
    return Summary(int(x.size), mean, std, mean - half, mean + half)


def paired_p(row: dict[int, float], baseline: dict[int, float], test: str) -> float | None:
    """The two-sided p-value of `row` against `baseline`, values keyed by seed, over the seeds
    both have; None with fewer than 2 pairs, or where the test is undefined (every pair
    differs by the same amount: no spread to test against)."""
    seeds = sorted(set(row) & set(baseline))
    if len(seeds) < 2:
        return None
    a = np.asarray([row[s] for s in seeds], dtype=float)
    b = np.asarray([baseline[s] for s in seeds], dtype=float)
    differences = a - b
    if np.allclose(differences, differences[0], rtol=0.0, atol=1e-12):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # tiny samples: scipy's own caveats
        run = stats.ttest_rel if test == "t" else stats.wilcoxon
        p = run(a, b).pvalue
    return None if p is None or not math.isfinite(p) else float(p)


def mark(p: float | None) -> str:
    """The significance mark of a p-value: ‡ below 0.01, † below 0.05, else none."""
    if p is None:
        return ""
    return next((symbol for limit, symbol in MARKS if p < limit), "")
