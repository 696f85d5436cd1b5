"""Small sampling helpers shared by the benchmark builder: counts, splits, balanced subsets."""

from __future__ import annotations

import numpy as np


def largest_remainder(n: int, shares: list[float]) -> np.ndarray:
    """Integer counts summing to `n` in proportion to `shares` (Hamilton's method)."""
    exact = np.asarray(shares, dtype=float) * n / sum(shares)
    counts = np.floor(exact).astype(int)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: n - counts.sum()]] += 1
    return counts


def train_test_split(n: int, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A boolean mask of the `round(n · test_fraction)` (at least one) test samples."""
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[:n_test]] = True
    return mask


def balanced_subset(
    labels: np.ndarray, num_classes: int, size: int | None, rng: np.random.Generator
) -> np.ndarray:
    """Indices of `size` samples with (as near as possible) equal class counts; None: all."""
    if size is None or size >= labels.size:
        return np.arange(labels.size)
    per_class = largest_remainder(size, [1.0] * num_classes)
    picks = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in enumerate(per_class)]
    return np.sort(np.concatenate(picks))
