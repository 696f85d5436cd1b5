"""The number of clusters by the silhouette of k-means partitions (FedDAA's NCD module): for
each k of the candidates, k-means of the points; the partition with the highest mean
silhouette wins. scikit-learn's `silhouette_score` and the authors' loop over `KMeans`
(LeegerPENG/FedDAA, `determine_cluster_number_return_centers`), in NumPy: fedrc does not depend
on scikit-learn (the tests compare the silhouette with it where it is installed).
"""

from __future__ import annotations

import numpy as np

from pipeline.algorithms.cflgp import kmeans


def silhouette(points: np.ndarray, labels: np.ndarray) -> float:
    """The mean over points of s = (b − a) / max(a, b): a the mean Euclidean distance to the
    other points of its cluster, b the least mean distance to the points of another cluster
    (s = 0 for a point alone in its cluster, as scikit-learn). Needs 2 ≤ clusters < points."""
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    names = np.unique(labels)
    member = labels[None] == names[:, None]  # (clusters, n)
    sums = distance @ member.T  # (n, clusters): Σ distances to each cluster's points
    sizes = member.sum(1)
    own = names.searchsorted(labels)
    alone = sizes[own] == 1
    a = sums[np.arange(len(points)), own] / np.maximum(sizes[own] - 1, 1)
    others = sums / sizes
    others[np.arange(len(points)), own] = np.inf
    b = others.min(1)
    s = np.where(alone, 0.0, (b - a) / np.maximum(np.maximum(a, b), 1e-300))
    return float(s.mean())


def count_clusters(
    points: np.ndarray, candidates: range, rng: np.random.Generator, starts: int
) -> tuple[np.ndarray, np.ndarray]:
    """(labels, centres) of the candidate k whose k-means partition has the highest mean
    silhouette (the first of equal scores); a partition with one cluster, or one per point,
    has no score. No candidate scored: one cluster, the mean of the points."""
    best, score = None, -np.inf
    for k in candidates:
        labels = kmeans(points, k, rng, starts)
        if not 1 < len(np.unique(labels)) < len(points):
            continue
        value = silhouette(points, labels)
        if value > score:
            best, score = labels, value
    if best is None:
        return np.zeros(len(points), dtype=np.int64), points.mean(0, keepdims=True)
    _, best = np.unique(best, return_inverse=True)  # 0 … C−1 when k-means left one empty
    return best, np.stack([points[best == j].mean(0) for j in range(best.max() + 1)])
