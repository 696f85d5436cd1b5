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

Where the data stays (the client part, `StoCFLStep`): the server hands each sampled client its
cluster's row (given in `plan_round`, in client order), the rows held at its turn and its ω; the
client chooses its ω_i on its own data and sends it up beside its trained models (its θ_i^obs, of
which the server keeps ψ_i, as the authors' server does).

Memory: ψ_i of every client seen (clients × model, float32), as the authors' server keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import (
    ClientOutcome,
    ClientStep,
    Memory,
    Rows,
    Upload,
    lowest_loss,
    one_hot,
)
from pipeline.algorithms.settings import StoCFLSettings
from pipeline.engine.rows import RowStore, client_rows
from pipeline.engine.task import LocalResult, LocalTask


@dataclass
class StoCFLStep(ClientStep):
    """What a StoCFL client needs: its cluster's row (−1: none), the rows held when it was
    sampled (to choose among when its cluster has none), its ω, and what its trainings start
    from. It sends ω_i, one-hot on the row it predicts with (its ψ_i leaves as a trained model,
    the anchor row's)."""

    omega: torch.Tensor  # (K,) ω_i, kept while no row is held
    row: int
    held: torch.Tensor  # the rows held at the client's turn, int64
    first_contact: bool  # never trained before: it trains θ_a (its θ_i^obs) and θ_g
    fresh: bool  # its cluster's row was given this round: it starts from θ_g
    started: bool  # θ_g has been aggregated once (before that it starts as θ_a)
    mu: float

    def chosen(self, losses: torch.Tensor) -> torch.Tensor:
        """ω_i: one-hot on its cluster's row, else on the held row with the lowest mean loss
        (unchanged while none is held)."""
        k = self.omega.numel()
        if self.row >= 0:
            return one_hot(self.row, k)
        if not self.held.numel():
            return self.omega
        return lowest_loss(losses, k, self.held.tolist())

    def reads(self, predictors: int) -> Rows:
        """The held rows' losses while its cluster holds none (`chosen`); else none."""
        return () if self.row >= 0 else tuple(self.held.tolist())

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        omega = self.chosen(losses)
        return ClientOutcome(omega.to(losses).expand_as(losses).clone(), {"omega": omega})

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.chosen(losses)

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        k = self.omega.numel()
        global_row, anchor_row = k, k + 1
        ones = torch.ones_like(gamma[:, 0])
        theta_g = models[global_row] if self.started else models[anchor_row]
        if self.first_contact:  # θ_i^obs, trained from the anchor
            tasks = [LocalTask(anchor_row, models[anchor_row], ones)]
        elif self.row >= 0:  # min_w L_i(w) + (μ/2)‖w − θ_g‖²: the cluster level
            start = theta_g if self.fresh else models[self.row]
            tasks = [LocalTask(self.row, start, ones, anchor=theta_g, mu=self.mu)]
        else:
            tasks = []
        return [*tasks, LocalTask(global_row, theta_g, ones)]  # the global level, plain


@described("stocfl")
class StoCFL(Algorithm):
    settings: StoCFLSettings
    Step = StoCFLStep

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.arange(self.num_clients)  # client → its cluster (lowest member id)
        self.row = torch.full((self.num_clients,), -1, dtype=torch.long)  # cluster → row, or −1
        self.psi: dict[int, torch.Tensor] = {}  # client → ψ_i = θ_a − θ_i^obs (float32)
        self.started = False  # θ_g has been aggregated once (before that it is θ_a)
        self._sampled: list[int] = []
        self._fresh: set[int] = set()  # rows given to a cluster this round: they start at θ_g
        self._held: dict[int, list[int]] = {}  # sampled client → the rows held at its turn
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

    def held_rows(self) -> list[int]:
        return sorted(int(k) for k in self.row[self.row >= 0])

    def plan_round(self, sampled: list[int]) -> None:
        """In client order: a cluster seen before whose member is sampled gets a free row, its
        first model, a copy of θ_g; each client's turn sees the rows held then."""
        for client in sampled:
            c = int(self.cluster[client])
            if client in self.psi and self.row[c] < 0:
                free = sorted(set(range(self.num_models)) - set(self.held_rows()))
                if free:
                    self.row[c] = free[0]
                    self._fresh.add(free[0])
            self._held[client] = self.held_rows()

    def client_step(self, client: int) -> StoCFLStep:
        k = int(self.row[self.cluster[client]])
        held = self._held.get(client, self.held_rows())
        return StoCFLStep(
            omega=self.omega[client].clone(),
            row=k,
            held=torch.tensor(held, dtype=torch.long),
            first_contact=client not in self.psi,
            fresh=k in self._fresh,
            started=self.started,
            mu=self.settings.mu,
        )

    def receive(self, client: int, upload: Upload) -> None:
        self._sampled.append(client)
        super().receive(client, upload)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        return self.client_step(client).local_tasks(gamma, models)

    def global_start(self, models: torch.Tensor) -> torch.Tensor:
        return models[self.global_row] if self.started else models[self.anchor_row]

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._sampled, self._fresh, self._held = [], set(), {}
        self._observed = client_rows(models.shape[1], self.num_clients)

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
        self._held = {}
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
        kept = int(self.row[larger])
        if kept < 0 and not self.as_released("larger_model_only"):  # as released: none kept
            kept = int(self.row[smaller])
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
