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
- Warm-up (`warmup_rounds`, the paper's β: 30 of its 100 rounds): only Θ_g trains, with
  FedAvg, and predictions use Θ_g alone; clusters are formed afterwards. FeSEM-CAM's λ defaults
  to 0.01, the middle of the paper's grid {0.001, 0.01, 0.1}.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm, hard_gamma, one_hot
from pipeline.algorithms.client import Rows
from pipeline.engine.rows import RowStore, client_rows
from pipeline.engine.task import LocalResult, LocalTask

LLOYD_ITERATIONS = 10


@described("ifca-cam")
class IFCACAM(Algorithm):
    def init_state(self) -> None:
        super().init_state()
        self.round = 0
        self.cluster = torch.full((self.num_clients,), -1, dtype=torch.long)
        self._samples: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.num_models + 1

    @property
    def warming_up(self) -> bool:
        return self.round < self.settings.warmup_rounds

    def combine_logits(self, raw: torch.Tensor) -> torch.Tensor:
        global_ = raw[self.num_models]
        if self.warming_up:
            return global_.expand(self.num_models, *global_.shape)
        return raw[: self.num_models] + global_

    def combined_rows(self, predictors: Rows) -> Rows:
        g = self.num_models
        return (g,) if self.warming_up else (*predictors, g)

    def reads(self, client: int) -> Rows:
        """None while warming up (Θ_g trains alone); then every row (`choose` reads the K
        predictors' losses, the tasks the global row's and the cluster's logits)."""
        return () if self.warming_up else tuple(range(self.num_rows))

    def choose(self, client: int, losses: torch.Tensor) -> int:
        return int(losses.mean(0).argmin())

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.warming_up:  # Θ_g alone predicts: every column of the combined logits is Θ_g's
            return torch.ones_like(losses) / self.num_models
        k = self.choose(client, losses)
        self.cluster[client] = k
        return hard_gamma(losses, k)

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        """While warming up ω keeps its value (Θ_g alone predicts); then one-hot."""
        return self.omega[client] if self.warming_up else super().client_omega(client, gamma)

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
        self._samples = torch.zeros(1, dtype=torch.float64, device=models.device)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        super().fold(client, task, result)
        if task.model == self.num_models:
            self._samples += task.weight  # n: every sampled client once

    def contributions(self) -> list[torch.Tensor]:
        return [*super().contributions(), self._samples]

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)  # the global row: FedAvg (η_g applies)
        if self.warming_up:
            return new
        g, n = self.num_models, float(self._samples)
        share = self.totals[:g] / n  # Σ_{i∈C_k} n_i / n
        cluster = (1 - share)[:, None] * models[:g].double() + self.sums[:g] / n
        new[:g] = cluster.to(models.dtype)
        return new

    def end_round(self) -> None:
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "round": self.round, "cluster": self.cluster}


@described("fesem-cam")
class FeSEMCAM(IFCACAM):
    """Memory: K-means needs every sampled client's cluster-side model at once; they wait in
    a `RowStore` (`client_rows`: in memory where they fit, else on disk), and Lloyd's
    iterations scan it in blocks."""

    def init_state(self) -> None:
        super().init_state()
        self._trained: RowStore | None = None
        self._weight: torch.Tensor | None = None  # (clients,): n_i of the cluster-side model

    def reads(self, client: int) -> Rows:
        """A client with a K-means cluster k: rows k and g (its tasks' offsets) alone."""
        known = int(self.cluster[client])
        if self.warming_up or known < 0:
            return super().reads(client)
        return (known, self.num_models)

    def choose(self, client: int, losses: torch.Tensor) -> int:
        """Keep the server's K-means assignment; a client seen for the first time: lowest loss."""
        known = int(self.cluster[client])
        return known if known >= 0 else super().choose(client, losses)

    def cluster_task(self, k: int, models: torch.Tensor, raw: torch.Tensor, ones, n) -> LocalTask:
        task = super().cluster_task(k, models, raw, ones, n)
        task.anchor, task.mu = models[k], self.settings.mu
        return task

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._trained = client_rows(models.shape[1], self.num_clients)
        self._weight = torch.zeros(self.num_clients, dtype=torch.float64, device=models.device)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        if task.model < self.num_models:
            self._trained.add(client, result.params)
            self._weight[client] = task.weight
        else:
            super().fold(client, task, result)

    def contributions(self) -> list[torch.Tensor]:
        return [*super().contributions(), self._weight]

    def shared_rows(self) -> RowStore:
        return self._trained

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        clients = self._trained.stored_keys()
        if self.warming_up or not clients:
            self._trained.close()
            return new
        weights = self._weight[clients].cpu()
        centres = models[: self.num_models].double().cpu()
        labels = None
        for _ in range(LLOYD_ITERATIONS):
            found, sums, mass = self.lloyd_pass(clients, centres, weights)
            filled = mass > 0  # an empty cluster stays frozen
            centres[filled] = sums[filled] / mass[filled, None]
            settled = labels is not None and torch.equal(found, labels)
            labels = found
            if settled:  # the same members give the same centres: every later pass repeats it
                break
        for i, k in zip(clients, labels.tolist()):
            self.cluster[i] = k
            self.omega[i] = one_hot(k, self.num_models)
        self._trained.close()
        new[: self.num_models] = centres.to(models)
        return new

    def lloyd_pass(
        self, clients: list[int], centres: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One of Lloyd's iterations in one scan of the stored models, block by block: each
        one's nearest centre (Euclidean), and each cluster's weighted sum and mass."""
        sums = torch.zeros_like(centres)
        mass = torch.zeros(self.num_models, dtype=torch.float64)
        labels, done = [], 0
        for keys, rows in self._trained.blocks(clients):
            rows, w = rows.double(), weights[done : done + len(keys)]
            done += len(keys)
            mine = torch.cdist(rows, centres).argmin(1)
            sums.index_add_(0, mine, w[:, None] * rows)
            mass.index_add_(0, mine, w)
            labels.append(mine)
        return torch.cat(labels), sums, mass
