"""How far the clients' clusters agree with their true concepts, as partitions of the clients.

Each participating client counts once and sits in its arg-max-ω cluster. Two standard scores,
both 1 when the clusters are the concepts up to renaming:
- ARI, the adjusted Rand index (Hubert & Arabie, 1985): agreement of every pair of clients
  (same cluster? same concept?), corrected for chance, so a random assignment scores about 0;
- NMI, normalised mutual information with the arithmetic mean of the two entropies
  (I(U; V) / ((H(U) + H(V)) / 2), the default of most libraries).

A step where every client holds the same concept scores 1 when they share one cluster and 0
when they are split (both scores are 0 / 0 there; these are the limits every library uses):
a single cluster is the perfect answer to a single concept. `concept_purity`
(`pipeline.evaluation.accuracy`) is the third, different score: the share of the ω-mass in
clusters matched one to one with the concepts ("matched share" in reports).
"""

from __future__ import annotations

import numpy as np


def contingency(truth: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Counts n[i, j] of items with the i-th true label and the j-th found one (labels in
    sorted order, absent ones left out)."""
    _, rows = np.unique(truth, return_inverse=True)
    _, cols = np.unique(found, return_inverse=True)
    table = np.zeros((rows.max(initial=-1) + 1, cols.max(initial=-1) + 1))
    np.add.at(table, (rows, cols), 1)
    return table


def _pairs(counts: np.ndarray) -> float:
    return float((counts * (counts - 1) / 2).sum())


def adjusted_rand_index(truth: np.ndarray, found: np.ndarray) -> float:
    """ARI = (Σ_ij C(n_ij, 2) − E) / (M − E), with E = Σ_i C(a_i, 2) Σ_j C(b_j, 2) / C(n, 2)
    and M = (Σ_i C(a_i, 2) + Σ_j C(b_j, 2)) / 2 (a, b: the row and column sums). When M = E
    (one group on both sides, or every item alone on both sides) the partitions are equal: 1."""
    table = contingency(truth, found)
    n = table.sum()
    rows, cols = _pairs(table.sum(1)), _pairs(table.sum(0))
    expected = rows * cols / max(n * (n - 1) / 2, 1.0)
    best = (rows + cols) / 2
    if best == expected:
        return 1.0
    return (_pairs(table) - expected) / (best - expected)


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def normalized_mutual_info(truth: np.ndarray, found: np.ndarray) -> float:
    """NMI = I(U; V) / ((H(U) + H(V)) / 2) in nats; 1 when both partitions are one group."""
    table = contingency(truth, found)
    h_truth, h_found = _entropy(table.sum(1)), _entropy(table.sum(0))
    if h_truth == h_found == 0.0:
        return 1.0
    joint = table / table.sum()
    outer = np.outer(joint.sum(1), joint.sum(0))
    held = joint > 0
    mutual = float((joint[held] * np.log(joint[held] / outer[held])).sum())
    return max(mutual, 0.0) / ((h_truth + h_found) / 2)


def cluster_agreement(omega: np.ndarray, concepts: np.ndarray) -> dict[str, float | None]:
    """ARI and NMI of the clients' arg-max-ω clusters against their `concepts`; None for
    both with one model (nothing was clustered)."""
    if omega.shape[1] < 2:
        return {"concept_ari": None, "concept_nmi": None}
    found = omega.argmax(1)
    return {
        "concept_ari": adjusted_rand_index(concepts, found),
        "concept_nmi": normalized_mutual_info(concepts, found),
    }
