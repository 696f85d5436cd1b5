"""Clients the data itself defines: one per value of a column (natural ids: FEMNIST's writers,
Airlines' carriers, what Flower's NaturalIdPartitioner splits by), and the time order of a
recorded stream.

Natural ids (`partition_by`): the ids with enough samples (two a step; in a recorded stream two
in every time window) are shuffled by the partition seed; the first `clients` take part (in id
order), the next `holdout_ids` per concept form the held-out clients, so every held-out client
is made of ids no participating client holds. A recorded stream without `partition_by` is cut
into T time windows, each into `clients` contiguous segments: client i holds segment i of every
window. In a recorded stream a row's time step is its window, so the order is kept.
"""

from __future__ import annotations

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.label_splits import LabelSplit


def time_windows(n: int, steps: int) -> np.ndarray:
    """The time step of each of `n` rows in order: T contiguous windows of near-equal size."""
    return np.repeat(np.arange(steps), [w.size for w in np.array_split(np.arange(n), steps)])


def segment_split(n: int, clients: int, steps: int) -> LabelSplit:
    """A recorded stream's clients as contiguous segments of every time window."""
    if n < 2 * clients * steps:
        raise FedrcError(
            f"partition.clients: {clients} clients × {steps} time steps need 2 rows each; the "
            f"stream's training part has {n}; lower clients or time_steps"
        )
    windows = [np.array_split(w, clients) for w in np.array_split(np.arange(n), steps)]
    indices = [np.concatenate([w[i] for w in windows]) for i in range(clients)]
    rows = [
        np.concatenate([np.full(w[i].size, t) for t, w in enumerate(windows)])
        for i in range(clients)
    ]
    return LabelSplit(indices, None, steps=rows)


def natural_split(
    ids: np.ndarray,
    column: str,
    clients: int,
    held_out: int,
    per_held: int,
    steps: int,
    ordered: bool,
    rng: np.random.Generator,
) -> LabelSplit:
    """`clients` participating ids and `held_out` clients of `per_held` unseen ids each."""
    names, inverse = np.unique(ids, return_inverse=True)
    window = time_windows(ids.size, steps) if ordered else np.zeros(ids.size, dtype=np.int64)
    counts = np.zeros((names.size, steps if ordered else 1), dtype=np.int64)
    np.add.at(counts, (inverse, window), 1)
    least = 2 if ordered else 2 * steps  # a train and a test row in each step
    eligible = np.flatnonzero(counts.min(axis=1) >= least)
    needed = clients + held_out * per_held
    if eligible.size < needed:
        raise FedrcError(
            f"partition.clients: {clients} clients + {held_out} held-out × {per_held} ids need "
            f"{needed} values of {column} with at least {least} samples{' a step' * ordered}; "
            f"it has {eligible.size} (of {names.size})"
        )
    chosen = rng.permutation(eligible)
    order = np.argsort(inverse, kind="stable")  # the rows of each id, in pool order
    members = np.split(order, np.cumsum(np.bincount(inverse, minlength=names.size))[:-1])
    taking = np.sort(chosen[:clients])
    indices = [members[k] for k in taking]
    held = [
        np.sort(np.concatenate([members[k] for k in chosen[clients + h * per_held :][:per_held]]))
        for h in range(held_out)
    ]
    rows = [window[i] for i in indices] if ordered else None
    return LabelSplit(indices, None, held=held, steps=rows)
