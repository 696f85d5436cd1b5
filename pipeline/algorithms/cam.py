"""Fed-CAM (Ma et al., NeurIPS 2023): a global model plus cluster models of the residual.

Client i predicts with h(x; Θ_g) + f(x; Θ_{c(i)}) (logits). Rows 0..K−1 of `models` are the
cluster models, row K the global one. Each round a client runs two local trainings from the same
received models: the cluster copy trains through the sum with Θ_g frozen (Θ_g's logits enter as
a fixed offset), and the global copy trains through the sum with Θ_{c(i)} frozen.

- IFCA-CAM: c(i) = argmin_k loss of the *sum* (client side, before training). Cluster update
  Θ_k ← (1 − Σ_{i∈C_k} n_i/n) Θ_k + Σ_{i∈C_k} (n_i/n) θ_i, n summed over all sampled clients,
  not over the cluster; Θ_g ← FedAvg of the global copies.
- FeSEM-CAM: the cluster copy is pulled towards its centre, (λ/2)‖θ − Θ_{c(i)}‖² (λ = `mu`);
  the server runs K-means (Lloyd, started at the current centres) on the sampled clients'
  cluster-side models, and each centre becomes the n_i-weighted mean of its members. Empty
  clusters stay frozen. (The paper clusters the fully connected layers only; fedrc uses the
  whole cluster-side model, which needs no knowledge of the architecture.)
- Warm-up (`warmup_rounds`, the paper's β): only Θ_g trains, with FedAvg, and predictions use
  Θ_g alone; clusters are formed afterwards.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms.base import Algorithm, hard_gamma, one_hot
from pipeline.config import TrainConfig
from pipeline.engine.task import LocalResult, LocalTask

LLOYD_ITERATIONS = 10


class IFCACAM(Algorithm):
    name = "ifca-cam"
    paper = "Ma et al., NeurIPS 2023"
    summed = ("_sums", "_totals", "_samples")

    def __init__(self, num_models: int, num_clients: int, num_classes: int, config: TrainConfig):
        super().__init__(num_models, num_clients, num_classes, config)
        self.round = 0
        self.cluster = torch.full((num_clients,), -1, dtype=torch.long)
        self._samples = 0.0

    @property
    def num_rows(self) -> int:
        return self.num_models + 1

    @property
    def warming_up(self) -> bool:
        return self.round < self.config.warmup_rounds

    def combine_logits(self, raw: torch.Tensor) -> torch.Tensor:
        global_ = raw[self.num_models]
        if self.warming_up:
            return global_.expand(self.num_models, *global_.shape)
        return raw[: self.num_models] + global_

    def choose(self, client: int, losses: torch.Tensor) -> int:
        return int(losses.mean(0).argmin())

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.warming_up:  # Θ_g alone predicts: every column of the combined logits is Θ_g's
            return torch.ones_like(losses) / self.num_models
        k = self.choose(client, losses)
        self.cluster[client] = k
        self.omega[client] = one_hot(k, self.num_models)
        return hard_gamma(losses, k)

    def cluster_task(self, k: int, models: torch.Tensor, raw: torch.Tensor, ones, n) -> LocalTask:
        return LocalTask(k, models[k], ones, weight=n, offset=raw[self.num_models])

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        g, n = self.num_models, float(gamma.shape[0])
        ones = torch.ones_like(gamma[:, 0])
        if self.warming_up:
            return [LocalTask(g, models[g], ones, weight=n)]
        k = int(self.cluster[client])
        return [
            self.cluster_task(k, models, raw, ones, n),
            LocalTask(g, models[g], ones, weight=n, offset=raw[k]),
        ]

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._samples = 0.0

    def receive(self, client: int, task: LocalTask, result: LocalResult, num_samples: int) -> None:
        super().receive(client, task, result, num_samples)
        if task.model == self.num_models:
            self._samples += task.weight  # n: every sampled client once

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)  # the global row: FedAvg (η_g applies)
        if self.warming_up:
            return new
        g, n = self.num_models, self._samples
        share = self._totals[:g] / n  # Σ_{i∈C_k} n_i / n
        cluster = (1 - share)[:, None] * models[:g].double() + self._sums[:g] / n
        new[:g] = cluster.to(models.dtype)
        return new

    def assign_held_out(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> None:
        self.omega[client] = one_hot(int(losses.mean(0).argmin()), self.num_models)

    def end_round(self) -> None:
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "round": self.round, "cluster": self.cluster}


class FeSEMCAM(IFCACAM):
    name = "fesem-cam"
    summed = ()  # K-means needs every client's cluster-side model

    def __init__(self, num_models: int, num_clients: int, num_classes: int, config: TrainConfig):
        super().__init__(num_models, num_clients, num_classes, config)
        self._trained: dict[int, tuple[float, torch.Tensor]] = {}

    def choose(self, client: int, losses: torch.Tensor) -> int:
        """Keep the server's K-means assignment; a client seen for the first time: lowest loss."""
        known = int(self.cluster[client])
        return known if known >= 0 else super().choose(client, losses)

    def cluster_task(self, k: int, models: torch.Tensor, raw: torch.Tensor, ones, n) -> LocalTask:
        task = super().cluster_task(k, models, raw, ones, n)
        task.anchor, task.mu = models[k], self.config.mu
        return task

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._trained = {}

    def receive(self, client: int, task: LocalTask, result: LocalResult, num_samples: int) -> None:
        if task.model < self.num_models:
            self._trained[client] = (task.weight, result.params)
        else:
            super().receive(client, task, result, num_samples)

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        if self.warming_up or not self._trained:
            return new
        clients = list(self._trained)
        weights = torch.tensor([self._trained[i][0] for i in clients], dtype=torch.float64)
        points = torch.stack([self._trained[i][1].double() for i in clients])
        centres = models[: self.num_models].double().to(points.device)
        for _ in range(LLOYD_ITERATIONS):
            labels = torch.cdist(points, centres).argmin(1)
            for k in range(self.num_models):
                member = labels == k
                if member.any():  # an empty cluster stays frozen
                    w = weights.to(points.device)[member]
                    centres[k] = (w[:, None] * points[member]).sum(0) / w.sum()
        for i, k in zip(clients, labels.tolist()):
            self.cluster[i] = k
            self.omega[i] = one_hot(k, self.num_models)
        new[: self.num_models] = centres.to(models.dtype)
        return new
