"""What the cluster figures show, computed from ω: the last evaluated round's ω, and the share
of each class, style and concept that falls in each cluster."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.records import Manifest


def final_omega(assignments: pa.Table) -> tuple[int, np.ndarray]:
    """The last evaluated round and its ω table (clients in id order)."""
    rounds = assignments.column("round").to_numpy()
    last = int(rounds.max())
    rows = assignments.filter(pc.equal(assignments.column("round"), last))
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    omega = np.stack([rows.column(f"omega_{j}").to_numpy() for j in range(k)], 1)
    order = np.argsort(rows.column("client_id").to_numpy())
    return last, omega[order]


def cluster_shares(
    omega: np.ndarray, manifest: Manifest
) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """For every class, style and concept: the share of its training samples in each cluster,
    and how many participating clients hold it (a style of one client reads 1.00 as plainly as
    one of a hundred). Classes are the labels after the concept's mapping, as trained on."""
    part = [c for c in manifest.clients if c.participating]
    w = omega[manifest.participating]
    hist = np.asarray([c.label_histogram for c in part], dtype=float)  # (M, C)
    sizes = hist.sum(1)
    styles = sorted({c.style for c in part})
    concepts = list(manifest.concepts)

    def by_group(keys: list[Any], values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        mass, clients = np.zeros((len(keys), w.shape[1])), np.zeros(len(keys), dtype=int)
        for value, row, n in zip(values, w, sizes):
            mass[keys.index(value)] += n * row
            clients[keys.index(value)] += 1
        return mass, clients

    shares = {
        "class": ([str(y) for y in range(hist.shape[1])], hist.T @ w, (hist > 0).sum(0)),
        "style": (styles, *by_group(styles, [c.style for c in part])),
        "concept": (
            concepts,
            *by_group(list(range(len(concepts))), [c.concept for c in part]),
        ),
    }
    return {
        name: (labels, mass / np.maximum(mass.sum(1, keepdims=True), 1e-12), clients)
        for name, (labels, mass, clients) in shares.items()
    }


def class_rows(manifest: Manifest) -> str:
    """What the class rows count: the labels after the concept's mapping, which are the
    original labels where no concept remaps them."""
    mapped = any(c.label_histogram != c.true_label_histogram for c in manifest.clients)
    return (
        "label after the concept's mapping"
        if mapped
        else "original label (no concept remaps labels)"
    )


def with_counts(labels: list[str], clients: np.ndarray) -> list[str]:
    """Row labels with the number of participating clients behind each row."""
    return [f"{label} (n={n})" for label, n in zip(labels, clients)]
