"""CFL-GP (Kim, Kim & de Veciana, ICML 2024): cluster clients by their gradient profiles.

K models; every client belongs to one cluster (all start on model 0). Round t (0-based: fedrc's
round t + 1) is a *clustering round* when t mod P = 0 and t < T (P = `clustering_period`,
T = `clustering_termination_threshold`); afterwards the clusters are frozen. In a clustering round
every sampled client also trains the *criterion model* m = ⌊t/P⌋ mod K (an extra local training,
not folded into the models) and sends its update g_i = Δθ_i there; the server keeps the profile
matrix G ((K·P_c) × clients, one block of P_c rows per model) and
    G[m, i] ← (1 − β) G[m, i] + β g_i,   β = 1 / (⌊(t + 1)/(K·P)⌋ + 1)
(a running average over the visits of block m). Then
    G = U Σ Vᵀ (thin SVD),   Ĝ = U[:, :K]ᵀ G   (K × clients),
K-means (k-means++) on the columns of Ĝ, and the new labels are renamed by the permutation that
agrees most with the previous assignment. Every round each cluster takes the N_i-weighted mean
of its members' updates: θ_k ← θ_k + η_g Σ_i N_i Δθ_i / Σ_i N_i; a cluster without a sampled
member keeps its model.

What fedrc chooses (protocol §9):
- g_i is the update after fedrc's local epochs (the authors' "model_averaging" protocol), not
  one mini-batch gradient (their default "gradient_averaging"): `LocalTask` trains epochs.
- G keeps a seeded random subset of the coordinates (`profile_fraction`, default 1% as the
  authors' `use_reduced_G`), the same on every place; 1.0 keeps the whole vector.
- The criterion model cycles through the K models (the paper); the released code never advances
  it (always model 0): `cycle_criterion: false`, an ablation. That code also takes every
  profile at the client's own model: `own_model_profile` reproduces both (block 0 of G holds
  the update of the client's own cluster training, and no extra training runs).
- Ĝ comes from the eigen-decomposition of the clients' Gram matrix GᵀG = V Σ² Vᵀ, since
  U_Kᵀ G = Σ_K V_Kᵀ: the same numbers without the (K·P_c) × K matrix U.
- K-means: k-means++ with 10 restarts (`kmeans_starts`; the least inertia wins), seeded from the
  run seed and the round; the authors' scikit-learn KMeans uses seed 42 and, without `n_init`,
  one start in scikit-learn ≥ 1.4 (`kmeans_starts: 1`). The matching solves the assignment
  problem on the K × K agreement table (`linear_sum_assignment`), O(K³), where the authors try
  all K! permutations; both find a permutation with the most agreement.
- Partial participation: only clients with a profile are clustered; a client without one (never
  sampled in a clustering round) takes the model with the lowest loss on its data. An update is
  applied to the model it was trained from (the authors group the round's updates by the new
  clustering, which applies updates computed at one model to another).
- Held-out clients take the model with the lowest loss on their labelled part (the paper has no
  rule).
- The criterion-model trainings are local trainings like any other to the round loop: their
  loss counts in the round's train loss, and with `persistent_momentum` they carry the client's
  momentum for that model.

Where the data stays (the client part, `CFLGPStep`): the server hands each sampled client its
cluster (or, not yet clustered, leaves the choice to it) and the round's criterion model; the
client sends up ω_i, one-hot on the model it trained, beside its trained models (the criterion
model's is its gradient profile g_i, of which the server keeps the chosen coordinates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import (
    ClusterStep,
    Upload,
    one_hot,
)
from pipeline.algorithms.settings import CFLGPSettings
from pipeline.engine.rows import RowStore, client_rows
from pipeline.engine.task import LocalResult, LocalTask

LLOYD_ITERATIONS = 300
GRAM_CHUNK = 1 << 16  # profile coordinates turned into float64 at a time for GᵀG


def spectral_embedding(columns: list[torch.Tensor], k: int) -> np.ndarray:
    """(clients, k): the columns of Ĝ = U_kᵀ G = Σ_k V_kᵀ, from GᵀG = V Σ² Vᵀ (float64)."""
    gram = torch.zeros(len(columns), len(columns), dtype=torch.float64)
    for start in range(0, columns[0].numel(), GRAM_CHUNK):
        part = torch.stack([c[start : start + GRAM_CHUNK] for c in columns]).double()
        gram += part @ part.T
    values, vectors = torch.linalg.eigh(gram)  # ascending
    top = values.flip(0)[:k].clamp(min=0).sqrt()
    return (vectors.flip(1)[:, :k] * top).numpy()


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, starts: int = 10) -> np.ndarray:
    """Labels of the best of `starts` runs of Lloyd's algorithm from k-means++ seeds (the least
    inertia wins)."""
    best, best_inertia = None, np.inf
    for _ in range(starts):
        labels, inertia = lloyd(points, kmeans_plus_plus(points, k, rng))
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def kmeans_plus_plus(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k centres: the first uniform, each next with probability ∝ D², its squared distance to
    the nearest centre so far (uniform when every point sits on a centre)."""
    centres = [points[rng.integers(len(points))]]
    d2 = ((points - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = d2.sum()
        pick = rng.choice(len(points), p=d2 / total) if total > 0 else rng.integers(len(points))
        centres.append(points[pick])
        d2 = np.minimum(d2, ((points - points[pick]) ** 2).sum(1))
    return np.stack(centres)


def lloyd(points: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, float]:
    """Nearest centre, then centre ← mean of its points (an empty one stays), until stable."""
    for _ in range(LLOYD_ITERATIONS):
        d2 = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
        labels = d2.argmin(1)
        moved = centres.copy()
        for j in range(len(centres)):
            if (labels == j).any():
                moved[j] = points[labels == j].mean(0)
        if np.array_equal(moved, centres):
            break
        centres = moved
    d2 = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
    return d2.argmin(1), float(d2.min(1).sum())


def match_labels(new: np.ndarray, old: np.ndarray, k: int) -> np.ndarray:
    """`new` renamed by the permutation π maximising #{i: π(new_i) = old_i}."""
    agreement = np.zeros((k, k))
    np.add.at(agreement, (new, old), 1)
    rows, cols = linear_sum_assignment(agreement, maximize=True)
    rename = np.empty(k, dtype=np.int64)
    rename[rows] = cols
    return rename[new]


@dataclass
class CFLGPStep(ClusterStep):
    """What a CFL-GP client needs: its cluster (−1: not clustered yet, it takes the model with
    the lowest loss on its data) and the round's criterion model (−1: not a clustering round).
    It sends ω_i, one-hot on the model it trains."""

    criterion: int

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        """The client's cluster model, and in a clustering round also the criterion model
        (counted nowhere: weight 0); the cluster's own update serves when the two coincide."""
        tasks = super().local_tasks(gamma, models)
        m = self.criterion
        if m >= 0 and m != tasks[0].model:
            tasks.append(LocalTask(m, models[m], torch.ones_like(gamma[:, m]), weight=0.0))
        return tasks


@described("cfl-gp")
class CFLGP(HardClustering):
    """Memory: each profiled client's column of G, K·P_c float32 numbers (P_c = the kept
    coordinates: with the FMNIST CNN's 2.17 M parameters, 1% and K = 3, 260 kB a client; the
    whole vector would be 26 MB), in the state and its checkpoint; in a clustering round also
    the sampled clients' profile rows (P_c each) in a `RowStore` (`client_rows`), and the
    clients' Gram matrix."""

    settings: CFLGPSettings
    Step = CFLGPStep

    def init_state(self) -> None:
        super().init_state()
        self.round = 0  # t: the rounds done
        self.cluster = torch.zeros(self.num_clients, dtype=torch.long)  # all start on model 0
        self.omega = torch.stack([one_hot(0, self.num_models)] * self.num_clients)
        self.profile: dict[int, torch.Tensor] = {}  # client → its column of G, (K·P_c,)
        self._start: torch.Tensor | None = None
        self._coords: torch.Tensor | None = None  # the kept coordinates of a flat model
        self._probes: RowStore | None = None  # clustering round: g_i at the criterion model
        self._clustered = False

    @property
    def clustering(self) -> bool:
        """Is round t a clustering round: t mod P = 0 and t < T."""
        s, t = self.settings, self.round
        return t % s.clustering_period == 0 and t < s.clustering_termination_threshold

    @property
    def criterion(self) -> int:
        """m = ⌊t/P⌋ mod K, the model whose block of G this clustering round fills."""
        if not self.settings.cycle_criterion or self.as_released("own_model_profile"):
            return 0
        return self.round // self.settings.clustering_period % self.num_models

    def client_step(self, client: int) -> CFLGPStep:
        unclustered = bool(self.profile) and client not in self.profile
        return CFLGPStep(
            cluster=-1 if unclustered else int(self.cluster[client]),
            # as released the profile is the cluster's own training: no extra one
            criterion=-1
            if self.as_released("own_model_profile") or not self.clustering
            else self.criterion,
        )

    def receive(self, client: int, upload: Upload) -> None:
        super().receive(client, upload)
        self.cluster[client] = int(self.omega[client].argmax())

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        return self.client_step(client).local_tasks(gamma, models)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._start = models
        if self._coords is None:  # a seeded subset, identical on every place
            width = models.shape[1]
            kept = max(1, round(self.settings.profile_fraction * width))
            generator = torch.Generator().manual_seed(self.config.seed)
            self._coords = torch.randperm(width, generator=generator)[:kept].sort().values
        self._coords = self._coords.to(models.device)
        width = len(self._coords)
        self._probes = client_rows(width, self.num_clients) if self.clustering else None
        self._clustered = False

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        if task.weight > 0:  # the cluster's training, not the criterion model's alone
            super().fold(client, task, result)  # Σ_i N_i θ_i and Σ_i N_i of the client's cluster
        own = self.as_released("own_model_profile") and task.weight > 0
        if self._probes is not None and (own or task.model == self.criterion):
            update = result.params[self._coords] - self._start[task.model, self._coords]
            self._probes.add(client, update)

    def shared_rows(self) -> RowStore | None:
        return self._probes

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)  # θ_k ← θ_k + η_g (mean of the members' θ_ik − θ_k)
        if self._probes is not None:
            self.update_profiles(self._probes)
            self._probes.close()
            self._clustered = self.recluster()
        return new

    def update_profiles(self, probes: RowStore) -> None:
        """G[m, i] ← (1 − β) G[m, i] + β g_i,  β = 1 / (⌊(t + 1)/(K·P)⌋ + 1)."""
        k, period, width = self.num_models, self.settings.clustering_period, probes.width
        beta = 1.0 / ((self.round + 1) // (k * period) + 1)
        block = slice(self.criterion * width, (self.criterion + 1) * width)
        for keys, rows in probes.blocks():
            for client, row in zip(keys, rows):
                column = self.profile.get(client, torch.zeros(k * width))
                column[block] = (1 - beta) * column[block] + beta * row
                self.profile[client] = column

    def recluster(self) -> bool:
        """SVD projection, K-means and label matching over the profiled clients; False (the
        clusters kept) while fewer than K clients have a profile."""
        clients = sorted(self.profile)
        if len(clients) < self.num_models:
            return False
        points = spectral_embedding([self.profile[i] for i in clients], self.num_models)
        rng = np.random.default_rng([self.config.seed, self.round])
        labels = kmeans(points, self.num_models, rng, self.settings.kmeans_starts)
        labels = match_labels(labels, self.cluster[clients].numpy(), self.num_models)
        for client, k in zip(clients, labels.tolist()):
            self.cluster[client] = k
            self.omega[client] = one_hot(k, self.num_models)
        return True

    def end_round(self) -> None:
        self.round += 1

    def round_info(self) -> dict[str, Any]:
        return {"clustered": self._clustered}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "round": self.round,
            "cluster": self.cluster,
            "profile": self.profile,
        }
