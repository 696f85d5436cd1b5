"""CFL (Sattler et al., IEEE TNNLS 2021): split a cluster when its clients pull apart.

All clients start in one cluster. Each round the members of cluster c train θ_c and send their
updates Δ_i = w_i − θ_c. For a cluster with more than two sampled members, when the mean update
is small but some client's is large,
    ‖Σ_i (N_i/N) Δ_i‖ < ε1   and   max_i ‖Δ_i‖ > ε2,
the cluster has reached a stationary point of the joint objective while its clients disagree:
it is split in two by complete-linkage clustering of the pairwise cosine similarities of the Δ_i
(up to `max_clusters` clusters: "CFL(3)"). Each cluster then averages its members' models.
The max-norm is over clients (the FedRC/FedEM ports take it over the wrong axis: a bug,
protocol §2; `max_entry` reproduces it: the largest |entry| of any update, against the port's
ε2 = 0.6 under `profile: released`).
Members that were not sampled when their cluster split join the half whose model has the lower
loss on their data the next time they are sampled.

Where the data stays (the client part, `CFLStep`): the server hands each sampled client its
cluster, or the two halves it may join; the client sends up ω_i, one-hot on the model it trains,
beside its trained model (from which the server takes its update Δ_i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import (
    HardStep,
    Memory,
    Rows,
    Upload,
    hard_outcome,
    lowest_loss,
    one_hot,
)
from pipeline.algorithms.settings import CFLSettings, released_suffix
from pipeline.common.settings import Settings
from pipeline.engine.rows import BLOCK, RowStore, client_rows
from pipeline.engine.task import LocalResult, LocalTask


def bipartition(gram: torch.Tensor) -> np.ndarray:
    """Complete-linkage split by cosine similarity, from the Gram matrix of the updates
    (G_ij = Δ_i·Δ_j, float64) → labels 0/1."""
    norms = gram.diagonal().sqrt().clamp(min=1e-12)
    distance = (1.0 - gram / norms[:, None] / norms[None, :]).clamp(min=0).numpy()
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform(distance, checks=False), method="complete")
    return fcluster(tree, 2, criterion="maxclust") - 1


def gram_matrix(store: RowStore, keys: list[int]) -> torch.Tensor:
    """Δ_i·Δ_j (float64) of the stored rows `keys`, two blocks in memory at a time."""
    gram = torch.zeros(len(keys), len(keys), dtype=torch.float64)
    blocks = list(range(0, len(keys), BLOCK))
    for a in blocks:
        ((_, left),) = store.blocks(keys[a : a + BLOCK])
        left = left.double()
        for b in blocks:
            if b < a:
                continue
            ((_, right),) = store.blocks(keys[b : b + BLOCK])
            product = left @ right.double().T
            gram[a : a + len(left), b : b + len(right)] = product
            gram[b : b + len(right), a : a + len(left)] = product.T
    return gram


@dataclass
class CFLStep(HardStep):
    """What a CFL client needs: its cluster, or the two halves of a split it missed (empty
    otherwise), and the number of clusters (a held-out client chooses among them)."""

    cluster: int
    halves: torch.Tensor  # int64, () or the two halves
    clusters: int

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        k = self.cluster
        if self.halves.numel():  # the half whose model has the lower loss on its data
            halves = self.halves.tolist()
            k = halves[int(losses[:, halves].mean(0).argmin())]
        return hard_outcome(losses, k)

    def reads(self, predictors: int) -> Rows:
        """The two halves' losses for a client that missed its cluster's split; else none."""
        return tuple(self.halves.tolist())

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lowest_loss(losses, losses.shape[1], list(range(self.clusters)))


@described("cfl")
class CFL(HardClustering):
    """Memory: the round's sums (K × model) and, while a split is still possible (fewer than
    `max_clusters` clusters), every sampled client's update Δ_i in a `RowStore` (`client_rows`):
    the split needs all pairwise cosines of a cluster's updates and the mean update of each half.
    Once the cap is reached nothing per client is kept beyond its norm."""

    settings: CFLSettings
    Step = CFLStep

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        cap = getattr(settings, "max_clusters", None)
        return clusters if cap is None else cap

    @classmethod
    def label(cls, settings: Settings) -> str:
        cap = getattr(settings, "max_clusters", None)
        return (cls.title if cap is None else f"CFL({cap})") + released_suffix(settings)

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.zeros(self.num_clients, dtype=torch.long)
        self.clusters = 1
        self.pending: dict[int, list[int]] = {}  # client → the two halves it may join
        self.omega = torch.stack([one_hot(0, self.num_models)] * self.num_clients)
        self._start: torch.Tensor | None = None
        self._member: torch.Tensor | None = None  # (clients,): 1 + the cluster it trained
        self._weight: torch.Tensor | None = None  # (clients,): N_i
        self._norm: torch.Tensor | None = None  # (clients,): ‖Δ_i‖
        self._updates: RowStore | None = None

    def client_step(self, client: int) -> CFLStep:
        halves = torch.tensor(self.pending.get(client, []), dtype=torch.long)
        return CFLStep(int(self.cluster[client]), halves, self.clusters)

    def receive(self, client: int, upload: Upload) -> None:
        super().receive(client, upload)
        self.cluster[client] = int(self.omega[client].argmax())
        self.pending.pop(client, None)

    @property
    def can_split(self) -> bool:
        return self.clusters < self.num_models

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._start = models
        per_client = dict(dtype=torch.float64, device=models.device)
        self._member = torch.zeros(self.num_clients, **per_client)
        self._weight = torch.zeros(self.num_clients, **per_client)
        self._norm = torch.zeros(self.num_clients, **per_client)
        width, clients = models.shape[1], self.num_clients
        self._updates = client_rows(width, clients) if self.can_split else None

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        update = result.params - self._start[task.model]
        self.accumulate(task.model, update, task.weight)
        self._member[client] = task.model + 1
        self._weight[client] = task.weight
        # as released, the port's norm over the (single) learner axis leaves |Δ_ij|, and its
        # max runs over clients and entries alike
        largest = self.as_released("max_entry")
        self._norm[client] = float(update.abs().max() if largest else update.norm())
        if self._updates is not None:
            self._updates.add(client, update)

    def contributions(self) -> list[torch.Tensor]:
        return [*super().contributions(), self._member, self._weight, self._norm]

    def shared_rows(self) -> RowStore | None:
        return self._updates

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """Each cluster with sampled members moves by its members' mean update (`server_step`);
        a split cluster's child starts from its parent's model and moves by its own half's."""
        start, deltas = models.clone(), {}
        for c in range(self.clusters):
            members = (self._member == c + 1).nonzero().flatten().tolist()
            if not members:
                continue  # no sampled member: the cluster keeps its model
            mean = (self.sums[c] / self.totals[c]).cpu()
            if len(members) > 2 and self.can_split and self.should_split(mean, members):
                halves = bipartition(gram_matrix(self._updates, members))
                moving = [m for m, h in zip(members, halves) if h == 1]
                staying = [m for m, h in zip(members, halves) if h == 0]
                child = self.split(c, moving, set(self._member.nonzero().flatten().tolist()))
                start[child] = models[c]
                deltas[child] = self.mean_update(moving)
                mean = self.mean_update(staying)
            deltas[c] = mean
        if self._updates is not None:
            self._updates.close()
        new = start.clone()
        if deltas:
            rows = torch.tensor(sorted(deltas), device=models.device)
            delta = torch.stack([deltas[r] for r in sorted(deltas)]).to(models)
            new[rows] = self.server_step(start, delta, rows)
        return new

    def mean_update(self, members: list[int]) -> torch.Tensor:
        """Σ_i N_i Δ_i / Σ_i N_i over `members`, from the stored updates."""
        total = torch.zeros(self._updates.width, dtype=torch.float64)
        for keys, rows in self._updates.blocks(members):
            weights = self._weight[keys].cpu()
            total += weights @ rows.double()
        return total / float(self._weight[members].sum())

    def should_split(self, mean: torch.Tensor, members: list[int]) -> bool:
        max_norm = float(self._norm[members].max())
        return float(mean.norm()) < self.settings.cfl_eps1 and max_norm > self.settings.cfl_eps2

    def split(self, parent: int, moving: list[int], sampled: set[int]) -> int:
        child = self.clusters
        self.clusters += 1
        for i in moving:
            self.cluster[i] = child
            self.omega[i] = one_hot(child, self.num_models)
        for i in (self.cluster == parent).nonzero().flatten().tolist():
            if i not in sampled:
                self.pending[i] = [parent, child]
        return child

    def round_info(self) -> dict[str, Any]:
        return {"active_models": self.clusters}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "cluster": self.cluster,
            "clusters": self.clusters,
            "pending": self.pending,
        }
