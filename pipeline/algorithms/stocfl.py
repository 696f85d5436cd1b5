"""StoCFL (Zeng et al., arXiv:2303.00897, 2023): merge clients whose moves from an anchor agree.

Rows of `models`: 0..K−1 cluster models, K the global model θ_g, K+1 the anchor θ_a (the initial
random model, never updated; θ_g starts as a copy of it, as in the authors' code).

- First contact: a client never seen trains θ_a (plain SGD, the run's `local_epochs` in place
  of the authors' `obep`) and sends ψ_i = θ_a − θ_i^obs, cached for the rest of the run.
- Merging (end of the round): the sampled clients are grouped by cluster; a cluster's direction
  is the plain mean of its sampled members' ψ, and pairs of sampled clusters are united in
  decreasing order of cos(d_a, d_b) while cos ≥ τ (union-find; a merge is never undone). The
  merged cluster keeps the id of its lowest client and the model of the larger cluster (ties:
  the lower id's, as the authors); when that one has no model yet, it keeps the other's.
- Bi-level training: a client in a cluster with a model trains it with the proximal objective
  L_i(w) + (μ/2)‖w − θ_g‖², and every sampled client trains θ_g plainly, both from the models
  received. θ_g ← mean of the returned global models; θ_c ← mean of its members' returns. Both
  averages are unweighted, as the authors' FedLab `fedavg_aggregate` called without weights.
- Prediction: ω_i is one-hot on its cluster's model. A client whose cluster has no model, and a
  held-out client, takes the held model with the lowest loss on its labelled part (the authors'
  rule for a new client, training ψ at the anchor and joining a cluster, needs rounds of
  merging that a held-out client never takes part in).

Clusters and rows: every client starts as its own cluster, and the number of clusters is not
fixed; `--clusters` K caps how many of them hold a model at once. A cluster is given a row the
first time one of its members is sampled after its first contact: a free row, started from θ_g
(as the authors start a new cluster's model). A merge of two clusters that both hold a row frees
one. While all K rows are held, the members of a cluster without one train θ_g only and predict
as held-out clients, until their cluster merges into one that holds a row or a row is freed.

Deviations (fedrc's round has no verb that runs a local training before `assign`): ψ of this
round's new clients is known only at `aggregate`, so merging happens after this round's training
rather than before it. A client's first round trains only the anchor and θ_g, and a merge keeps
the larger cluster's model as aggregated from its own members this round (the other cluster's
returns of that round are dropped, their model being replaced). The authors' trainer chains
the global trainings (each client starts from the previous client's result); fedrc starts every
client from the received θ_g, as the paper's FedAvg step does.

Memory: ψ_i of every client seen (clients × model, float32), as the authors' server keeps it.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm, lowest_loss, one_hot
from pipeline.algorithms.settings import StoCFLSettings
from pipeline.engine.rows import RowStore
from pipeline.engine.task import LocalResult, LocalTask


@described("stocfl")
class StoCFL(Algorithm):
    settings: StoCFLSettings

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.arange(self.num_clients)  # client → its cluster (lowest member id)
        self.row = torch.full((self.num_clients,), -1, dtype=torch.long)  # cluster → row, or −1
        self.psi: dict[int, torch.Tensor] = {}  # client → ψ_i = θ_a − θ_i^obs (float32)
        self.started = False  # θ_g has been aggregated once (before that it is θ_a)
        self._sampled: list[int] = []
        self._fresh: set[int] = set()  # rows given to a cluster this round: they start at θ_g
        self._omega: torch.Tensor | None = None  # ω of the client just assigned (`client_omega`)
        self._observed: RowStore | None = None

    @property
    def num_rows(self) -> int:
        return self.num_models + 2

    @property
    def global_row(self) -> int:
        return self.num_models

    @property
    def anchor_row(self) -> int:
        return self.num_models + 1

    def combine_logits(self, raw: torch.Tensor) -> torch.Tensor:
        return raw[: self.num_models]

    def held_rows(self) -> list[int]:
        return sorted(int(k) for k in self.row[self.row >= 0])

    def lowest_loss(self, client: int, losses: torch.Tensor) -> torch.Tensor:
        """ω_i one-hot on the held model with the lowest mean loss (unchanged while none is)."""
        held = self.held_rows()
        if not held:
            return self.omega[client]
        return lowest_loss(losses, self.num_models, held)

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self._sampled.append(client)
        c = int(self.cluster[client])
        if client in self.psi and self.row[c] < 0:
            free = sorted(set(range(self.num_models)) - set(self.held_rows()))
            if free:  # the cluster's first model: a copy of θ_g
                self.row[c] = free[0]
                self._fresh.add(free[0])
        if self.row[c] >= 0:
            self._omega = one_hot(int(self.row[c]), self.num_models)
        else:
            self._omega = self.lowest_loss(client, losses)
        return self._omega.to(losses).expand_as(losses).clone()

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        return self._omega  # as chosen, in float64 (γ holds it in the losses' float32)

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return self.lowest_loss(client, losses)

    def global_start(self, models: torch.Tensor) -> torch.Tensor:
        return models[self.global_row] if self.started else models[self.anchor_row]

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        ones = torch.ones_like(gamma[:, 0])
        theta_g = self.global_start(models)
        if client not in self.psi:  # first contact: θ_i^obs, trained from the anchor
            tasks = [LocalTask(self.anchor_row, models[self.anchor_row], ones)]
        else:
            k = int(self.row[self.cluster[client]])
            start = theta_g if k in self._fresh else models[k]
            # min_w L_i(w) + (μ/2)‖w − θ_g‖²: the cluster level
            tasks = (
                [LocalTask(k, start, ones, anchor=theta_g, mu=self.settings.mu)] if k >= 0 else []
            )
        return [*tasks, LocalTask(self.global_row, theta_g, ones)]  # the global level, plain

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._sampled, self._fresh = [], set()
        self._observed = RowStore(models.shape[1])

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        if task.model == self.anchor_row:
            self._observed.add(client, result.params)
        else:
            super().fold(client, task, result)  # weight 1: unweighted means

    def shared_rows(self) -> RowStore:
        return self._observed

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        start = models.clone()  # what each row's average replaces
        start[self.global_row] = self.global_start(models)
        for k in self._fresh:
            start[k] = start[self.global_row]
        new = super().aggregate(start)  # θ_g, θ_c ← mean of the returned models
        anchor = models[self.anchor_row].detach().cpu()
        for client, observed in self._observed.blocks() if len(self._observed) else ():
            for i, row in zip(client, observed):
                self.psi[i] = anchor.float() - row  # ψ_i = θ_a − θ_i^obs
        self._observed.close()
        self.merge(sorted(set(self._sampled)))
        self.started = True
        return new

    def merge(self, sampled: list[int]) -> None:
        """Unite sampled clusters in decreasing order of cos(d_a, d_b) while it is ≥ τ, with
        d_c the mean ψ of cluster c's sampled members."""
        buckets: dict[int, list[int]] = {}
        for i in sampled:
            buckets.setdefault(int(self.cluster[i]), []).append(i)
        ids = sorted(buckets)
        if len(ids) < 2:
            return
        d = torch.stack(
            [torch.stack([self.psi[i] for i in buckets[c]]).double().mean(0) for c in ids]
        )
        d = d / d.norm(dim=1, keepdim=True).clamp(min=1e-12)
        cos = d @ d.T
        pairs = [
            (float(cos[a, b]), ids[a], ids[b])
            for a in range(len(ids))
            for b in range(a + 1, len(ids))
        ]
        pairs.sort(key=lambda p: -p[0])  # stable: ties in cluster-id order
        for similarity, a, b in pairs:
            if similarity < self.settings.tau:
                break
            self.unite(a, b)

    def unite(self, a: int, b: int) -> None:
        """Union of the clusters that now hold the lowest members of clusters a and b."""
        a, b = sorted((int(self.cluster[a]), int(self.cluster[b])))
        if a == b:
            return
        larger, smaller = (
            (b, a) if (self.cluster == a).sum() < (self.cluster == b).sum() else (a, b)
        )
        kept = int(self.row[larger] if self.row[larger] >= 0 else self.row[smaller])
        members = self.cluster == b
        self.cluster[members] = a
        self.row[b], self.row[a] = -1, kept
        if kept >= 0:
            self.omega[self.cluster == a] = one_hot(kept, self.num_models)

    def round_info(self) -> dict[str, Any]:
        seen = {int(self.cluster[i]) for i in self.psi}
        return {"clusters": len(seen), "active_models": len(self.held_rows())}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "cluster": self.cluster,
            "row": self.row,
            "psi": self.psi,
            "started": self.started,
        }
