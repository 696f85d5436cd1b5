"""Clusters matched to concepts, so that a run's figures agree with each other.

A cluster's index is arbitrary (IFCA's cluster 2 may hold concept 0); a figure that colours
clusters by index and concepts by name leaves the reader to pair them. Each cluster is matched
one to one with the concept it holds most often (Hungarian, over every client and evaluated
round drawn), takes that concept's colour, and is drawn in the concept's place; clusters left
unmatched (K above the number of concepts) are drawn after the others in shades of grey.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import linear_sum_assignment

from pipeline.data.records import Manifest

CONCEPT_PALETTE = "Set2"  # concepts, and the clusters matched to them


def match_clusters(cluster: np.ndarray, concept: np.ndarray, k: int, concepts: int) -> list[int]:
    """For each cluster 0..k−1, the concept matched to it, or −1; `cluster` and `concept` are
    paired arrays of any shape (a client's cluster and true concept at a round)."""
    counts = np.zeros((k, concepts))
    np.add.at(counts, (cluster.ravel(), concept.ravel()), 1)
    rows, cols = linear_sum_assignment(-counts)
    matched = [-1] * k
    for r, c in zip(rows, cols):
        if counts[r, c] > 0:
            matched[r] = int(c)
    return matched


def cluster_order(matched: list[int]) -> list[int]:
    """Clusters in the order of their concepts, the unmatched ones after, by index."""
    return sorted(range(len(matched)), key=lambda j: (matched[j] < 0, matched[j], j))


def concept_colours(concepts: int) -> list[Any]:
    palette = plt.get_cmap(CONCEPT_PALETTE).colors
    return [palette[c % len(palette)] for c in range(concepts)]


def cluster_colours(matched: list[int], concepts: int) -> list[Any]:
    """Each cluster's colour: its concept's, or a grey (lighter to darker) when unmatched."""
    own = concept_colours(concepts)
    spare = sum(c < 0 for c in matched)
    greys = iter(plt.get_cmap("Greys")(np.linspace(0.45, 0.85, max(spare, 1))))
    return [own[c] if c >= 0 else tuple(next(greys)) for c in matched]


def static_matching(omega: np.ndarray, manifest: Manifest) -> list[int]:
    """Each cluster's matched concept (−1: none) from the participating clients' arg-max ω."""
    part = manifest.participating
    concepts = np.asarray([manifest.clients[i].concept for i in part])
    return match_clusters(omega[part].argmax(1), concepts, omega.shape[1], len(manifest.concepts))
