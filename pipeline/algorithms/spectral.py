"""Spectral clustering of a dense affinity matrix, as scikit-learn computes it, in NumPy: the
embedding (`SpectralEmbedding`, `SpectralClustering`'s maps), the `cluster_qr` labels and the
Davies–Bouldin score that FedGWC's authors choose the number of clusters by (fedrc does not
depend on scikit-learn; the tests compare these with it where it is installed).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh, qr, svd


def spectral_embedding(affinity: np.ndarray, n_components: int, drop_first: bool) -> np.ndarray:
    """(n, n_components) coordinates: the eigenvectors of the smallest eigenvalues of the
    normalised Laplacian I − D^{-1/2} A D^{-1/2} (its diagonal set to 1), divided by √degree,
    each signed so that its largest entry is positive; `drop_first` drops the first (the
    constant direction), as `SpectralEmbedding` does and `SpectralClustering` does not."""
    count = n_components + 1 if drop_first else n_components
    a = np.array(affinity, dtype=np.float64)
    np.fill_diagonal(a, 0.0)
    degree = a.sum(0)
    root = np.where(degree == 0, 1.0, np.sqrt(degree))
    laplacian = -a / root / root[:, None]
    np.fill_diagonal(laplacian, 1.0)
    _, vectors = eigh(laplacian)
    embedding = vectors.T[:count] / root
    largest = np.abs(embedding).argmax(1)
    embedding *= np.sign(embedding[np.arange(count), largest])[:, None]
    return (embedding[1:count] if drop_first else embedding).T


def cluster_qr(maps: np.ndarray) -> np.ndarray:
    """Labels from spectral maps (n, k) by the column-pivoted QR rule (Damle et al.)."""
    k = maps.shape[1]
    _, _, pivots = qr(maps.T, pivoting=True)
    u, _, v = svd(maps[pivots[:k], :].T)
    return np.abs(maps @ (u @ v.conj())).argmax(1)


def davies_bouldin(points: np.ndarray, labels: np.ndarray) -> float:
    """The mean over clusters of the largest (s_i + s_j) / d(c_i, c_j): s the mean distance of
    a cluster's points to its centroid c (lower is better; 0 when it is undefined)."""
    names = np.unique(labels)
    centroids = np.stack([points[labels == k].mean(0) for k in names])
    spread = np.array(
        [np.linalg.norm(points[labels == k] - c, axis=1).mean() for k, c in zip(names, centroids)]
    )
    gaps = np.linalg.norm(centroids[:, None] - centroids[None], axis=-1)
    if np.allclose(spread, 0) or np.allclose(gaps, 0):
        return 0.0
    gaps[gaps == 0] = np.inf
    ratio = (spread[:, None] + spread[None]) / gaps
    return float(ratio.max(1).mean())


def best_partition(affinity: np.ndarray, candidates: range) -> tuple[int, np.ndarray | None]:
    """The number of clusters among `candidates` whose spectral partition has the lowest
    Davies–Bouldin score on the spectral embedding, if it is below 1 (FedGWC's rule; else 1,
    no partition): (count, labels)."""
    best, score, labels = 1, 1.0, None
    for n in candidates:
        found = cluster_qr(spectral_embedding(affinity, n, drop_first=False))
        if not 1 < len(np.unique(found)) < len(found):  # no score (scikit-learn refuses it)
            continue
        value = davies_bouldin(spectral_embedding(affinity, n, drop_first=True), found)
        if value < score:
            best, score, labels = n, value, found
    return best, labels
