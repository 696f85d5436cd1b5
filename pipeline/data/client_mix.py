"""Client types: which concept each participating client has and whether it is corrupted.

Presets for K concepts (the first concept is the original task), as (concept, corrupted, share):
- `paper` (FedRC appendix H.8): 30% clean and 20% corrupted of concept 0; the other concepts
  share the remaining 50% equally, one fifth of each also corrupted (K = 3: 30/20/25/25).
- `reference` (the authors' data scripts, protocol §4): 20% corrupted and 20% clean of concept 0;
  the others share 40% clean and 20% corrupted (K = 3: concepts 40/30/30, 40% corrupted).
- `imbalanced` (Table 12, clients per concept 8:1:1): concept 0 has 80% of the clients, the
  others share 20%; 30% of every concept group corrupted (the paper mix's overall share).
- `custom`: `partition.client_shares`, [clean, corrupted] per concept in order, summing to 1.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.sampling import largest_remainder

MIXES = ("paper", "reference", "imbalanced", "custom")
Group = tuple[int, bool, float]  # (concept index, corrupted, share of clients)


def mix_groups(mix: str, num_concepts: int, shares: list[float] | None = None) -> list[Group]:
    """The (concept, corrupted, share) groups of a mix; shares are normalised when drawn."""
    others = range(1, num_concepts)
    each = 1 / max(1, num_concepts - 1)
    if mix == "paper":
        rest = [g for c in others for g in ((c, False, 0.4 * each), (c, True, 0.1 * each))]
        return [(0, False, 0.3), (0, True, 0.2), *rest]
    if mix == "reference":
        clean = [(c, False, 0.4 * each) for c in others]
        return [(0, True, 0.2), *clean, *[(c, True, 0.2 * each) for c in others], (0, False, 0.2)]
    if mix == "imbalanced":
        rest = [g for c in others for g in ((c, False, 0.14 * each), (c, True, 0.06 * each))]
        return [(0, False, 0.56), (0, True, 0.24), *rest]
    if mix == "custom":
        check_shares(shares, num_concepts)
        return [(i // 2, i % 2 == 1, s) for i, s in enumerate(shares)]  # type: ignore[arg-type]
    raise FedrcError(f"partition.client_mix: expected one of {MIXES}, got {mix!r}")


def check_shares(shares: list[float] | None, num_concepts: int) -> None:
    key = "partition.client_shares"
    if shares is None or len(shares) != 2 * num_concepts:
        raise FedrcError(
            f"{key}: client_mix custom needs 2 × {num_concepts} shares ([clean, corrupted] per "
            f"concept), got {shares!r}"
        )
    if any(not math.isfinite(s) or s < 0 for s in shares):
        raise FedrcError(f"{key}: shares must be numbers >= 0, got {shares!r}")
    if abs(sum(shares) - 1) > 1e-6:
        raise FedrcError(f"{key}: shares must sum to 1, got {sum(shares):g}")


def client_types(
    clients: int, groups: list[Group], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Concept (int) and corrupted (bool) per client, the groups spread over a shuffled list."""
    counts = largest_remainder(clients, [share for _, _, share in groups])
    concept = np.concatenate([np.full(n, c) for (c, _, _), n in zip(groups, counts)])
    corrupted = np.concatenate([np.full(n, x) for (_, x, _), n in zip(groups, counts)])
    order = rng.permutation(clients)
    return concept[order].astype(np.int64), corrupted[order].astype(bool)
