"""FedDAA (Peng & Tang, arXiv:2506.21054, 2025): dynamic clustering that tells real drift
(a change of P(y|x)) apart from virtual drift (P(x)) and label drift (P(y)).

Data prototype of client i (its statistic, `describe`): P_i, a C × C matrix whose row c is the
mean logit vector of model row 0 over the client's samples of class c (zeros without any),
flattened: the authors' `get_first_model_output_prototype`. A class-conditional mean does not
move when only P(y) moves, and little when P(x) moves within each class; it moves when P(y|x)
does (the same images under other labels).

At the first round of each new time step t ≥ 1 (and at `cluster_round`, for a static
benchmark) every participating client sends P_i^t; in the last round of step t − 1 it sent
P_i^{t−1}, of its data then. The server:
  NCD   k-means of the P^t for k = 2 … min(max_clusters, n − 1, K): the k whose partition has
        the highest mean silhouette gives C_t centres (`count_clusters`)
  RDD   client i drifted for real when the centre nearest P_i^{t−1} is not the one nearest
        P_i^t (the authors' `check_whether_clients_concept_shifts_cluster_center_based`)
  rows  each centre, the largest first, takes the row that most of its members without real
        drift hold, unless a larger centre took it (then their next most held row); a centre
        left without takes a free row, which starts from the model of the row most of its
        members held. Every client joins the row of its nearest centre.
  CDA   until the step ends, a client without real drift trains on its data of steps t − 1
        and t (`retains`: the round loop appends its previous step's training rows, each with
        sample weight 1, and counts them in its weight); one with real drift on step t's alone.
So a client with only virtual or label drift stays in its cluster, keeps its model and the
knowledge of its old data; one with real drift joins the cluster of the clients that now hold
its concept, or a new cluster, and leaves its old data behind. Between clusterings each
cluster trains its model by FedAvg, ω one-hot on it; before the first one every client is in
row 0 (FedAvg). K (`--clusters`) caps the clusters. protocol §17 lists where fedrc departs from
the authors' code.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering, hard_gamma, lowest_loss, one_hot
from pipeline.algorithms.client import Rows
from pipeline.algorithms.cluster_count import count_clusters
from pipeline.algorithms.flux import load_flat, scratch_net
from pipeline.algorithms.settings import FedDAASettings
from pipeline.engine.sequential import INFERENCE_CHUNK, as_input
from pipeline.engine.task import LocalTask


def prototype(logits: torch.Tensor, labels: torch.Tensor, classes: int) -> torch.Tensor:
    """(classes, outputs), float64 on the CPU: row c the mean of the logits of the samples of
    class c, zeros for a class without samples."""
    sums = torch.zeros(classes, logits.shape[1], dtype=torch.float64, device=logits.device)
    sums.index_add_(0, labels, logits.double())
    counts = torch.bincount(labels, minlength=classes).clamp(min=1)
    return (sums / counts[:, None]).cpu()


def nearest(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """The index of each point's nearest centre (Euclidean; the first of equals)."""
    return np.linalg.norm(points[:, None] - centres[None], axis=-1).argmin(1)


def real_drift(before: np.ndarray, now: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Whether each client's prototypes of its two steps sit nearest different centres."""
    return nearest(before, centres) != nearest(now, centres)


def centre_rows(
    groups: np.ndarray, drifted: np.ndarray, held: np.ndarray, rows: int
) -> tuple[list[int], list[int]]:
    """For each centre j (clients' `groups`): its model row and the row its model starts from
    (module docstring). `held`: the row each client held before; `rows`: K ≥ the centres."""
    count = int(groups.max()) + 1
    sizes = np.bincount(groups, minlength=count)
    order = sorted(range(count), key=lambda j: (-sizes[j], j))
    row, source = [-1] * count, [-1] * count
    for j in order:
        votes = np.bincount(held[(groups == j) & ~drifted], minlength=rows)
        for r in np.argsort(-votes, kind="stable"):
            if votes[r] == 0:
                break
            if int(r) not in row:
                row[j] = source[j] = int(r)
                break
    free = [r for r in range(rows) if r not in row]
    for j in order:
        if row[j] < 0:
            row[j] = free.pop(0)
            source[j] = int(np.bincount(held[groups == j], minlength=rows).argmax())
    return row, source


@described("feddaa")
class FedDAA(HardClustering):
    """State: each client's row, the rows in use, each client's prototype of its previous step,
    which clients drifted for real at the latest clustering and which retain their previous
    step's data."""

    settings: FedDAASettings
    describes = True  # in the last round of a step and the first of the next
    state_attributes: ClassVar[tuple[str, ...]] = (
        "cluster", "in_use", "last", "has_last", "drifted", "retain", "rounds_done",
    )  # fmt: skip

    def init_state(self) -> None:
        super().init_state()
        n, k = self.num_clients, self.num_models
        self.cluster = torch.zeros(n, dtype=torch.long)
        self.in_use = torch.zeros(k, dtype=torch.bool)
        self.in_use[0] = True
        self.omega = torch.stack([one_hot(0, k)] * n)
        self.last = torch.zeros(n, self.num_classes**2, dtype=torch.float64)  # P_i^{t−1}
        self.has_last = torch.zeros(n, dtype=torch.bool)
        self.drifted = torch.zeros(n, dtype=torch.bool)
        self.retain = torch.zeros(n, dtype=torch.bool)  # trains on its previous step's data too
        self.rounds_done = 0
        self.taking = torch.ones(n, dtype=torch.bool)  # `participants`
        self._due = False  # this round clusters
        self._stats: dict[int, torch.Tensor] = {}  # P_i^t, this round
        self._source = torch.arange(k)  # the row each row's training starts from
        self._nets: dict[tuple, nn.Module] = {}  # scratch modules for `describe`

    def participants(self, clients: list[int]) -> None:
        self.taking = torch.zeros(self.num_clients, dtype=torch.bool)
        self.taking[clients] = True

    def begin_step(self, step: int) -> None:
        """A new step: its first round clusters, and no client retains before that."""
        self._due = self._due or step >= 1
        self.retain.zero_()

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._source = torch.arange(self.num_models)

    def plan_round(self, sampled: list[int]) -> None:
        self._due = self._due or self.rounds_done + 1 == self.settings.cluster_round

    # --- the prototypes -------------------------------------------------------------------
    def wants_statistics(self, sampled: list[int]) -> list[int]:
        """Every participating client, in a clustering round and in the last round of a step
        (that is not the run's last)."""
        round_, per_step = self.rounds_done + 1, self.config.rounds_per_step
        ends = bool(per_step) and round_ % per_step == 0 and round_ < self.config.rounds
        return self.taking.nonzero().flatten().tolist() if self._due or ends else []

    def describe(
        self, client: int, images: torch.Tensor, labels: torch.Tensor, models: torch.Tensor
    ) -> torch.Tensor:
        net = scratch_net(self._nets, images, self.num_classes, self.config)
        load_flat(net, models[0].to(images.device))
        net.eval()
        with torch.no_grad():
            logits = torch.cat([net(as_input(images[s : s + INFERENCE_CHUNK]))
                                for s in range(0, images.shape[0], INFERENCE_CHUNK)])  # fmt: skip
        return prototype(logits, labels, self.num_classes).flatten()

    def observe(self, client: int, statistic: torch.Tensor) -> None:
        if self._due:
            self._stats[client] = statistic.double()
        else:  # the last round of a step: P_i^{t−1} for the next step's check
            self.last[client] = statistic.double()
            self.has_last[client] = True

    # --- the clustering -------------------------------------------------------------------
    def reads(self, client: int) -> Rows:
        """No loss: the server chose the cluster."""
        return ()

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self._stats:  # the round's first E-step clusters everyone described
            self.recluster(sorted(self._stats))
        return hard_gamma(losses, int(self.cluster[client]))

    def recluster(self, clients: list[int]) -> None:
        """NCD, RDD and the rows (module docstring)."""
        now = torch.stack([self._stats.pop(c) for c in clients])
        most = min(self.settings.max_clusters, len(clients) - 1, self.num_models)
        seed = np.random.SeedSequence([self.config.seed, self.rounds_done])
        rng = np.random.default_rng(seed)
        _, centres = count_clusters(now.numpy(), range(2, most + 1), rng,
                                    self.settings.kmeans_starts)  # fmt: skip
        groups = nearest(now.numpy(), centres)
        known = self.has_last[clients].numpy()
        drifted = real_drift(self.last[clients].numpy(), now.numpy(), centres) & known
        row, source = centre_rows(groups, drifted, self.cluster[clients].numpy(), self.num_models)
        self.in_use.zero_()
        for r, s in zip(row, source):
            self.in_use[r] = True
            self._source[r] = s
        for c, g in zip(clients, groups.tolist()):
            self.cluster[c] = row[g]
            self.omega[c] = one_hot(row[g], self.num_models)
        self.drifted.zero_()
        self.drifted[clients] = torch.from_numpy(drifted)
        self.retain.zero_()
        self.retain[clients] = torch.from_numpy(known & ~drifted)
        self.last[clients] = now
        self.has_last[clients] = True

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """The cluster model with the lowest loss on its labelled part."""
        return lowest_loss(losses, self.num_models, self.in_use.nonzero().flatten().tolist())

    # --- training and aggregation ---------------------------------------------------------
    def retains(self, client: int) -> bool:
        """CDA: a client without real drift at its step's clustering also trains on its data
        of the previous step, for the rest of the step."""
        return bool(self.retain[client])

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        """The client's cluster model, from the row it starts from (a new cluster: a copy)."""
        k = int(self.cluster[client])
        start = models[int(self._source[k])]
        return [LocalTask(k, start, torch.ones_like(gamma[:, 0]), weight=float(gamma.shape[0]))]

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """θ_k ← θ_s(k) + η_g (Σ_i N_i θ_i / Σ_i N_i − θ_s(k)), s(k) the row cluster k started
        from this round (itself but for a new cluster)."""
        return super().aggregate(models[self._source.to(models.device)])

    def end_round(self) -> None:
        self.rounds_done += 1
        self._due = False

    def round_info(self) -> dict[str, Any]:
        return {"active_models": int(self.in_use.sum())}
