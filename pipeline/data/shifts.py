"""Label, feature and concept shift: who gets which samples, labels and corruptions.

All functions take a numpy Generator so a partition is a pure function of its seed.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import FedrcError

# Concept c relabels true class y as CONCEPT_MAPS[c](y, C). Concept 0 is the original task.
CONCEPT_NAMES = ("identity", "reverse", "shift")


def apply_concept(labels: np.ndarray, concept: int, num_classes: int) -> np.ndarray:
    """FedRC's concept shift: identity, y → C−1−y, y → (y+1) mod C."""
    if concept == 0:
        return labels.copy()
    if concept == 1:
        return num_classes - 1 - labels
    if concept == 2:
        return (labels + 1) % num_classes
    raise ValueError(f"unknown concept {concept}")


def sequential_dirichlet_split(
    labels: np.ndarray,
    num_classes: int,
    clients: int,
    per_client: int,
    alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """The FedRC benchmark's label split (NOTES §4), not the textbook per-class Dirichlet.

    Clients are filled one after another. For each, q ~ Dir(α · p_rem) with p_rem the
    normalised remaining class counts (so the concentration sums to α), then `per_client`
    samples are drawn by class from q without replacement; a class that runs out passes its
    draws to the others in proportion to q. Returns each client's sample indices.
    """
    if clients * per_client > labels.size:
        raise FedrcError(
            f"--clients: {clients} clients × {per_client} samples = {clients * per_client} "
            f"exceeds the {labels.size} training samples"
        )
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    remaining = np.array([p.size for p in pools])
    used = np.zeros(num_classes, dtype=np.int64)
    result = []
    for _ in range(clients):
        live = remaining > 0
        q = np.zeros(num_classes)
        concentration = alpha * remaining[live] / remaining.sum()
        draw = rng.dirichlet(concentration)
        if not np.all(np.isfinite(draw)):  # tiny concentrations underflow: all mass on one class
            draw = np.eye(live.sum())[rng.choice(live.sum(), p=remaining[live] / remaining.sum())]
        q[live] = draw
        take = np.zeros(num_classes, dtype=np.int64)
        need = per_client
        while need > 0:  # each pass fills the quota or exhausts a class: at most C + 1 passes
            room = remaining - take
            weights = q * (room > 0)
            if weights.sum() <= 0:
                weights = (room > 0).astype(float)
            more = np.minimum(rng.multinomial(need, weights / weights.sum()), room)
            take += more
            need -= int(more.sum())
        chosen = [pools[c][used[c] : used[c] + take[c]] for c in range(num_classes)]
        used += take
        remaining -= take
        result.append(np.sort(np.concatenate(chosen)))
    return result


def _largest_remainder(n: int, shares: list[float]) -> np.ndarray:
    exact = np.asarray(shares) * n / sum(shares)
    counts = np.floor(exact).astype(int)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: n - counts.sum()]] += 1
    return counts


# (concept, corrupted, share of clients). "paper": appendix H.8's text; "reference": the
# authors' data scripts, which produced the paper's tables (NOTES §4).
CLIENT_MIXES: dict[str, list[tuple[int, bool, float]]] = {
    "paper": [
        (0, False, 0.30),
        (0, True, 0.20),
        (1, False, 0.20),
        (1, True, 0.05),
        (2, False, 0.20),
        (2, True, 0.05),
    ],
    "reference": [
        (0, True, 0.20),
        (1, False, 0.20),
        (2, False, 0.20),
        (1, True, 0.10),
        (2, True, 0.10),
        (0, False, 0.20),
    ],
}


def client_types(clients: int, mix: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Concept (int) and corrupted (bool) per client, the groups spread over a shuffled list."""
    groups = CLIENT_MIXES[mix]
    counts = _largest_remainder(clients, [share for _, _, share in groups])
    concept = np.concatenate([np.full(n, c) for (c, _, _), n in zip(groups, counts)])
    corrupted = np.concatenate([np.full(n, x) for (_, x, _), n in zip(groups, counts)])
    order = rng.permutation(clients)
    return concept[order].astype(np.int64), corrupted[order].astype(bool)


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
    per_class = _largest_remainder(size, [1.0] * num_classes)
    picks = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in enumerate(per_class)]
    return np.sort(np.concatenate(picks))
