"""Label shift: which training samples each participating client gets.

- `sequential_dirichlet`: the FedRC benchmark's scheme (appendix H.8, protocol §4).
- `dirichlet`: the textbook split, each class divided over clients by Dir(α · 1) (Hsu et al.;
  NIID-Bench's cap on clients that already hold their even share).
- `n_class`: every client holds `classes_per_client` classes (McMahan et al.; Fed-CAM n-class(n)).
- `cluster_dirichlet`: Fed-CAM's cluster-wise Dir(α, α_within) (protocol §3): each class divided
  over `label_groups` groups by Dir(α · 1), then within a group over its clients by
  Dir(α_within · 1).
- `cluster_n_class`: Fed-CAM's cluster-wise n-class(a, b): each group holds `group_classes`
  classes, each of its clients `classes_per_client` of them.
- `iid` (when `label` is not among `partition.shifts`): a uniform random split.

Sizes: `sequential_dirichlet`, `iid` and the n-class splits give each client
`samples_per_client` samples (default: the pool divided evenly; n-class without a quota divides
each class evenly among the clients holding it). The Dirichlet splits divide a pool of
clients × samples_per_client samples (default: the whole pool), so sizes vary; they are redrawn,
at most MAX_DRAWS times, until every client has `min_samples`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.partition_config import LABEL_SPLITS as LABEL_SPLITS  # kept with the settings
from pipeline.data.partition_config import PartitionConfig
from pipeline.data.sampling import largest_remainder

MAX_DRAWS = 100


@dataclass(frozen=True)
class LabelSplit:
    indices: list[np.ndarray]  # per client: sorted indices into the training pool
    groups: np.ndarray | None  # per client: its Fed-CAM label group (cluster_* splits only)
    # natural ids (`pipeline.data.natural`): each held-out client's indices into the pool
    held: list[np.ndarray] | None = None
    # a recorded stream: per client, the time step of each of its rows (its order kept)
    steps: list[np.ndarray] | None = None


def _check_pool(pool: int, clients: int, per_client: int) -> None:
    if clients * per_client > pool:
        raise FedrcError(
            f"--clients: {clients} clients × {per_client} samples = {clients * per_client} "
            f"exceeds the {pool} training samples"
        )


def _dirichlet(concentration: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    draw = rng.dirichlet(concentration)
    if not np.all(np.isfinite(draw)):  # tiny concentrations underflow: all mass on one part
        draw = np.eye(concentration.size)[
            rng.choice(concentration.size, p=concentration / concentration.sum())
        ]
    return draw


def sequential_dirichlet_split(
    labels: np.ndarray,
    num_classes: int,
    clients: int,
    per_client: int,
    alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """The FedRC benchmark's label split (protocol §4), not the textbook per-class Dirichlet.

    Clients are filled one after another. For each, q ~ Dir(α · p_rem) with p_rem the
    normalised remaining class counts (so the concentration sums to α), then `per_client`
    samples are drawn by class from q without replacement; a class that runs out passes its
    draws to the others in proportion to q. Returns each client's sample indices.
    """
    _check_pool(labels.size, clients, per_client)
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


def iid_split(
    size: int, clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """No label shift: `per_client` samples drawn uniformly without replacement per client."""
    _check_pool(size, clients, per_client)
    order = rng.permutation(size)[: clients * per_client].reshape(clients, per_client)
    return [np.sort(row) for row in order]


def _divide(
    pool: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    parts: int,
    alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each class of `pool` divided over `parts` by proportions drawn from Dir(α · 1).

    As in NIID-Bench (Li et al., 2022), a part that already holds its even share of the pool
    gets no more, which keeps small α from starving most parts.
    """
    pieces: list[list[np.ndarray]] = [[] for _ in range(parts)]
    sizes = np.zeros(parts)
    for c in range(num_classes):
        members = rng.permutation(pool[labels[pool] == c])
        p = _dirichlet(np.full(parts, alpha), rng) * (sizes < pool.size / parts)
        p = p / p.sum() if p.sum() > 0 else np.full(parts, 1 / parts)
        cuts = (np.cumsum(p)[:-1] * members.size).astype(int)
        for j, chunk in enumerate(np.split(members, cuts)):
            pieces[j].append(chunk)
            sizes[j] += chunk.size
    return [np.sort(np.concatenate(p)) for p in pieces]


def _group_sizes(clients: int, groups: int) -> np.ndarray:
    return largest_remainder(clients, [1.0] * groups)


def dirichlet_split(
    labels: np.ndarray,
    num_classes: int,
    pool: np.ndarray,
    group_sizes: list[int],
    alpha: float,
    alpha_within: float,
    min_samples: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Textbook (one group) or cluster-wise Dirichlet split of `pool`, redrawn until every
    client has `min_samples` samples (at most MAX_DRAWS draws)."""
    for _ in range(MAX_DRAWS):
        if len(group_sizes) == 1:
            parts = _divide(pool, labels, num_classes, group_sizes[0], alpha, rng)
        else:
            groups = _divide(pool, labels, num_classes, len(group_sizes), alpha, rng)
            parts = [
                client
                for group, size in zip(groups, group_sizes)
                for client in _divide(group, labels, num_classes, size, alpha_within, rng)
            ]
        if min(p.size for p in parts) >= min_samples:
            return parts
    raise FedrcError(
        f"partition.min_samples: after {MAX_DRAWS} Dirichlet draws some client still had fewer "
        f"than {min_samples} samples; raise alpha, or lower clients or min_samples"
    )


def class_sets(
    sets: int, classes: np.ndarray, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """`sets` random sets of `k` distinct classes, each class used as evenly as possible.

    Every class gets ⌊sets·k/|classes|⌋ or one more slots; a class with as many slots left as
    sets left must be taken, which keeps the remaining assignment always feasible.
    """
    slots = largest_remainder(sets * k, [1.0] * classes.size)[rng.permutation(classes.size)]
    result = []
    for left in range(sets, 0, -1):
        forced = np.flatnonzero(slots == left)
        free = np.flatnonzero((slots > 0) & (slots < left))
        chosen = forced
        if forced.size < k:
            p = slots[free] / slots[free].sum()
            chosen = np.concatenate([forced, rng.choice(free, k - forced.size, replace=False, p=p)])
        slots[chosen] -= 1
        result.append(classes[rng.permutation(chosen)])
    return result


def allocate_classes(
    labels: np.ndarray,
    sets: list[np.ndarray],
    per_client: int | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Samples for clients holding the class `sets`: a quota split evenly over a client's
    classes, or (no quota) each class divided evenly among the clients holding it."""
    pools = {
        int(c): rng.permutation(np.flatnonzero(labels == c))
        for c in np.unique(np.concatenate(sets))
    }
    holders: dict[int, list[int]] = {c: [] for c in pools}
    for i, s in enumerate(sets):
        for c in s:
            holders[int(c)].append(i)
    parts: list[list[np.ndarray]] = [[] for _ in sets]
    for c, owners in holders.items():
        if per_client is None:
            counts = largest_remainder(pools[c].size, [1.0] * len(owners))
        else:
            counts = np.array([_share(per_client, sets[i], c) for i in owners])
            if counts.sum() > pools[c].size:
                raise FedrcError(
                    f"partition.samples_per_client: {per_client} samples over "
                    f"{sets[0].size} classes each needs {counts.sum()} of class {c}, which has "
                    f"{pools[c].size}; lower samples_per_client or clients"
                )
        taken = pools[c][: counts.sum()]
        for owner, chunk in zip(owners, np.split(taken, np.cumsum(counts)[:-1])):
            parts[owner].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def _share(per_client: int, classes: np.ndarray, c: int) -> int:
    """A client's quota of class `c`: the quota split evenly, the first classes rounding up."""
    counts = largest_remainder(per_client, [1.0] * classes.size)
    return int(counts[int(np.flatnonzero(classes == c)[0])])


def split_labels(
    config: PartitionConfig, labels: np.ndarray, num_classes: int, rng: np.random.Generator
) -> LabelSplit:
    """The label split `config` asks for, over the training pool `labels`."""
    clients, spc = config.clients, config.samples_per_client
    per_client = spc or labels.size // clients
    if per_client < 2:
        raise FedrcError(f"--clients: {clients} clients leave fewer than 2 samples each")
    kind = config.label_split if "label" in config.shifts else "iid"
    if kind == "iid":
        return LabelSplit(iid_split(labels.size, clients, per_client, rng), None)
    if kind == "sequential_dirichlet":
        parts = sequential_dirichlet_split(
            labels, num_classes, clients, per_client, config.alpha, rng
        )
        return LabelSplit(parts, None)
    _check_pool(labels.size, clients, per_client)
    grouped = kind.startswith("cluster_")
    sizes = _group_sizes(clients, config.label_groups) if grouped else np.array([clients])
    groups = np.repeat(np.arange(sizes.size), sizes) if grouped else None
    if kind in ("dirichlet", "cluster_dirichlet"):
        pool = np.arange(labels.size)
        if spc:  # a random pool of clients × samples_per_client samples
            pool = np.sort(rng.choice(labels.size, clients * spc, replace=False))
        parts = dirichlet_split(
            labels,
            num_classes,
            pool,
            sizes.tolist(),
            config.alpha,
            config.alpha_within,
            config.min_samples,
            rng,
        )
        return LabelSplit(parts, groups)
    k = config.classes_per_client
    if kind == "n_class":
        sets = class_sets(clients, np.arange(num_classes), k, rng)
    else:
        group_sets = class_sets(sizes.size, np.arange(num_classes), config.group_classes, rng)
        sets = [
            s for g, n in zip(group_sets, sizes) for s in class_sets(int(n), np.sort(g), k, rng)
        ]
    return LabelSplit(allocate_classes(labels, sets, spc, rng), groups)
