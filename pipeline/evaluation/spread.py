"""How evenly a model serves its clients: the spread of the per-client accuracies behind a mean.

Two clustering methods with one mean local accuracy can differ in who pays for it; the fairness
literature reports the spread (std over clients) and the worst clients' mean. The clients are
the whole population described here, not a sample of one, so the std divides by N (ddof = 0).
"""

from __future__ import annotations

import math

import numpy as np

WORST_SHARE = 0.1  # the worst 10 % of the clients


def client_spread(accuracies: list[float], prefix: str) -> dict[str, float]:
    """`<prefix>_std`: the std of the accuracies over clients; `<prefix>_worst10`: the mean of
    the lowest ⌈10 %⌉ of them (at least one client)."""
    values = np.sort(np.asarray(accuracies, dtype=float))
    worst = max(1, math.ceil(WORST_SHARE * values.size))
    return {
        f"{prefix}_std": float(values.std()),
        f"{prefix}_worst10": float(values[:worst].mean()),
    }
