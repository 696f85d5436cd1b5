"""CFL (Sattler et al., IEEE TNNLS 2021): split a cluster when its clients pull apart.

All clients start in one cluster. Each round the members of cluster c train θ_c and send their
updates Δ_i = w_i − θ_c. For a cluster with more than two sampled members, when the mean update
is small but some client's is large,
    ‖Σ_i (N_i/N) Δ_i‖ < ε1   and   max_i ‖Δ_i‖ > ε2,
the cluster has reached a stationary point of the joint objective while its clients disagree:
it is split in two by complete-linkage clustering of the pairwise cosine similarities of the Δ_i
(up to `max_clusters` clusters: "CFL(3)"). Each cluster then averages its members' models.
The max-norm is over clients (the FedRC/FedEM ports take it over the wrong axis: a bug, NOTES §2).
Members that were not sampled when their cluster split join the half whose model has the lower
loss on their data the next time they are sampled.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from pipeline.algorithms.base import HardClustering, hard_gamma, one_hot
from pipeline.config import TrainConfig
from pipeline.engine.task import LocalResult, LocalTask


def bipartition(updates: torch.Tensor) -> np.ndarray:
    """Complete-linkage split of the rows of `updates` by cosine similarity → labels 0/1."""
    unit = torch.nn.functional.normalize(updates.double(), dim=1)
    distance = (1.0 - unit @ unit.T).clamp(min=0).numpy()
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform(distance, checks=False), method="complete")
    return fcluster(tree, 2, criterion="maxclust") - 1


class CFL(HardClustering):
    name = "cfl"
    paper = "Sattler et al., IEEE TNNLS 2021"

    def __init__(self, num_models: int, num_clients: int, num_classes: int, config: TrainConfig):
        super().__init__(num_models, num_clients, num_classes, config)
        self.cluster = torch.zeros(num_clients, dtype=torch.long)
        self.clusters = 1
        self.pending: dict[int, list[int]] = {}  # client → the two halves it may join
        self.omega = torch.stack([one_hot(0, num_models)] * num_clients)
        self._updates: dict[int, tuple[int, float, torch.Tensor]] = {}
        self._start: torch.Tensor | None = None

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if client in self.pending:
            halves = self.pending.pop(client)
            self.cluster[client] = halves[int(losses[:, halves].mean(0).argmin())]
        k = int(self.cluster[client])
        self.omega[client] = one_hot(k, self.num_models)
        return hard_gamma(losses, k)

    def assign_held_out(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> None:
        k = int(losses[:, : self.clusters].mean(0).argmin())
        self.omega[client] = one_hot(k, self.num_models)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._start = models
        self._updates = {}

    def receive(self, client: int, task: LocalTask, result: LocalResult, num_samples: int) -> None:
        update = (result.params - self._start[task.model]).cpu()
        self._updates[client] = (task.model, task.weight, update)

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = models.clone()
        for c in range(self.clusters):
            members = [i for i, (k, _, _) in self._updates.items() if k == c]
            if not members:
                continue  # no sampled member: the cluster keeps its model
            groups = [members]
            if len(members) > 2 and self.clusters < self.num_models and self.should_split(members):
                halves = bipartition(torch.stack([self._updates[i][2] for i in members]))
                groups = [[m for m, h in zip(members, halves) if h == side] for side in (0, 1)]
                self.split(c, groups[1])
            for group in groups:
                k = int(self.cluster[group[0]])
                new[k] = models[c] + self.config.server_lr * self.mean_update(group).to(models)
        return new

    def mean_update(self, members: list[int]) -> torch.Tensor:
        weights = torch.tensor([self._updates[i][1] for i in members], dtype=torch.float64)
        stacked = torch.stack([self._updates[i][2].double() for i in members])
        return (weights / weights.sum()) @ stacked

    def should_split(self, members: list[int]) -> bool:
        mean_norm = float(self.mean_update(members).norm())
        max_norm = max(float(self._updates[i][2].norm()) for i in members)
        return mean_norm < self.config.cfl_eps1 and max_norm > self.config.cfl_eps2

    def split(self, parent: int, moving: list[int]) -> None:
        child = self.clusters
        self.clusters += 1
        for i in moving:
            self.cluster[i] = child
            self.omega[i] = one_hot(child, self.num_models)
        sampled = set(self._updates)
        for i in (self.cluster == parent).nonzero().flatten().tolist():
            if i not in sampled:
                self.pending[i] = [parent, child]

    def round_info(self) -> dict[str, Any]:
        return {"active_models": self.clusters}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "cluster": self.cluster,
            "clusters": self.clusters,
            "pending": self.pending,
        }
