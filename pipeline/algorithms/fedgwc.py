"""FedGWC (Licciardi, Leo, Fanì, Caputo & Ciccone, ICML 2025): clusters from the clients'
empirical losses through a Gaussian reward, split by spectral clustering.

All clients start in one cluster. Each sampled client trains its cluster's model and sends,
besides the model, the loss of each of its local steps, l_i = (l_i1 … l_iS). For a cluster with
more members n than the round samples clients (S), from its sampled members' losses:
  μ_s = Σ_i N_i l_is / Σ_i N_i,  σ²_s = Σ_i N_i (l_is − μ_s)² / Σ_i N_i   (with fewer sampled
      members than `loss_sampling_size`, losses drawn from N(μ_s, σ²_s) complete the population,
      whose mean and unbiased variance replace them)
  r_i = (1/S) Σ_s exp(−(l_is − μ_s)² / 2σ²_s)                               the Gaussian reward
  W_ij ← (1 − α) W_ij + α r_i / Σ_k r_k  for sampled i, j, α = (sampled members) / n
W (n × n, 1/n² at first) is the cluster's interaction matrix; the mean squared change of its
updated entries, averaged over rounds with the same α (an exponential average, 1 at first),
measures whether it has settled. After round(n / S) consecutive rounds below `eps` the cluster
is clustered: with W scaled to [0, 1], the affinity P_ij = exp(−γ Σ_{k ≠ i, j} (W_ki − W_kj)²)
(columns of W: how the others see i and j), then for each count c from 2 to min(n // S, 4)
spectral clustering of P (cluster_qr labels), scored by Davies–Bouldin on P's spectral
embedding; the best score below 1 splits the cluster into c, each with a copy of its model, its
members' block of W, and a fresh average. The authors' code, in all these steps
(agents/servers.py); `pipeline.algorithms.spectral` computes what they take from scikit-learn.

fedrc's rows: `--clusters` caps the clusters (rows reserved up front); a split takes free rows
(the first child keeps its parent's), and a count needing more rows than are free is not tried.
The authors sample S clients in each cluster every round; fedrc samples the round's clients over
all clients (`participation`), so a cluster's sampled members are its share of them, α is their
share of the cluster, and S in the thresholds above is the round's sample size. With
`participation: 1` no cluster exceeds S: FedGWC never splits and is FedAvg.

Where the data stays (`FedGWCStep`): the server hands each client its cluster; the client trains
that model and sends its step losses with it (`LocalResult.extras`, the `StepLosses` rule). A
held-out client takes the active cluster with the lowest loss on its labelled part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import HardStep, Memory, Rows, hard_outcome, lowest_loss, one_hot
from pipeline.algorithms.settings import FedGWCSettings
from pipeline.algorithms.spectral import best_partition
from pipeline.engine.rules import StepLosses
from pipeline.engine.task import LocalResult, LocalTask

STEPS = 512  # the step losses a client's upload keeps at most
SPLITS = 5  # the authors try 2 to 4 clusters a split at the most (their `min(…, 5)`)


@dataclass
class FedGWCStep(HardStep):
    """A client's cluster, and the clusters in use (for a held-out client)."""

    cluster: int
    active: torch.Tensor  # int64, the rows in use

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        return hard_outcome(losses, self.cluster)

    def reads(self, predictors: int) -> Rows:
        """None: the server chose the cluster (from step losses, not from inference)."""
        return ()

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lowest_loss(losses, losses.shape[1], self.active.tolist())

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        k, n = self.cluster, float(gamma.shape[0])
        return [LocalTask(k, models[k], gamma[:, k], weight=n, rule=StepLosses())]


def gaussian_rewards(
    losses: torch.Tensor, sizes: torch.Tensor, population: int, gen: torch.Generator
) -> torch.Tensor:
    """r_i = mean_s exp(−(l_is − μ_s)² / 2σ²_s) of the sampled members' step losses (m, S),
    μ and σ² weighted by their sizes N_i, completed by draws from N(μ, σ²) up to `population`
    (module docstring)."""
    weights = sizes / sizes.sum()
    mu = weights @ losses
    var = weights @ (losses - mu) ** 2
    extra = population - losses.shape[0]
    if extra > 0:
        draws = torch.randn(extra, losses.shape[1], generator=gen, dtype=losses.dtype)
        pool = torch.cat([draws * var.sqrt() + mu, losses])
        mu, var = pool.mean(0), pool.var(0)
    var = var + 1e-16
    return torch.exp(-0.5 * (losses - mu) ** 2 / var).mean(1)


def affinity(interactions: torch.Tensor, gamma: float) -> np.ndarray:
    """P_ij = exp(−γ Σ_{k ≠ i, j} (W_ki − W_kj)²) of W scaled to [0, 1]; P_ii = 0."""
    w = interactions.T.double().numpy()
    w = (w - w.min()) / max(w.max() - w.min(), 1e-8)
    n = w.shape[0]
    out = np.zeros((n, n))
    for i in range(n - 1):
        for j in range(i + 1, n):
            keep = np.ones(n, dtype=bool)
            keep[[i, j]] = False
            out[i, j] = out[j, i] = np.exp(-gamma * ((w[i, keep] - w[j, keep]) ** 2).sum())
    return out


@described("fedgwc")
class FedGWC(HardClustering):
    """State: each client's cluster, which rows are in use, and per cluster its interaction
    matrix W, the average change of W, and its patience (consecutive settled rounds)."""

    settings: FedGWCSettings
    Step = FedGWCStep
    needs_sequential = own_training = True  # the step losses come from a rule (`StepLosses`)
    local_training = "sends the loss of each local step (LocalTask.rule)"
    state_attributes: ClassVar[tuple[str, ...]] = (
        "cluster", "in_use", "interactions", "change", "patience", "per_round", "rounds_done",
    )  # fmt: skip

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.zeros(self.num_clients, dtype=torch.long)
        self.taking = torch.ones(self.num_clients, dtype=torch.bool)  # `participants`
        self.in_use = torch.zeros(self.num_models, dtype=torch.bool)
        self.in_use[0] = True
        self.omega = torch.stack([one_hot(0, self.num_models)] * self.num_clients)
        self.interactions: dict[int, torch.Tensor] = {}  # row → W over its members (by id)
        self.change: dict[int, float] = {0: 1.0}
        self.patience: dict[int, int] = {0: 0}
        self.per_round = 0  # S, the clients a round samples
        self.rounds_done = 0
        self._member: torch.Tensor | None = None  # (clients,): 1 + the row it trained
        self._weight: torch.Tensor | None = None  # (clients,): N_i
        self._losses: torch.Tensor | None = None  # (clients, STEPS): its step losses
        self._steps: torch.Tensor | None = None  # (clients,): how many

    def participants(self, clients: list[int]) -> None:
        self.taking = torch.zeros(self.num_clients, dtype=torch.bool)
        self.taking[clients] = True

    def members(self, row: int) -> list[int]:
        """The participating clients of a cluster, by id (the order of W's rows)."""
        return ((self.cluster == row) & self.taking).nonzero().flatten().tolist()

    def client_step(self, client: int) -> FedGWCStep:
        active = self.in_use.nonzero().flatten()
        return FedGWCStep(int(self.cluster[client]), active)

    def plan_round(self, sampled: list[int]) -> None:
        self.per_round = len(sampled)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        per_client = dict(dtype=torch.float64, device=models.device)
        self._member = torch.zeros(self.num_clients, **per_client)
        self._weight = torch.zeros(self.num_clients, **per_client)
        self._losses = torch.zeros(self.num_clients, STEPS, **per_client)
        self._steps = torch.zeros(self.num_clients, **per_client)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        self.accumulate(task.model, result.params, task.weight)
        steps = result.extras["losses"][:STEPS]
        self._member[client] = task.model + 1
        self._weight[client] = task.weight
        self._losses[client, : steps.numel()] = steps.to(self._losses)
        self._steps[client] = steps.numel()

    def contributions(self) -> list[torch.Tensor]:
        return [*super().contributions(), self._member, self._weight, self._losses, self._steps]

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """Each cluster's average; then, cluster by cluster, its interactions and its split."""
        new = super().aggregate(models)
        member = self._member.cpu()
        for row in self.in_use.nonzero().flatten().tolist():
            group = self.members(row)
            sampled = [i for i in group if int(member[i]) == row + 1]
            if len(group) <= self.per_round or not sampled:
                continue
            self.interact(row, group, sampled)
            if self.patience[row] == round(len(group) / self.per_round):
                self.split(row, group, new)
        return new

    def interact(self, row: int, group: list[int], sampled: list[int]) -> None:
        """The Gaussian rewards of the sampled members, W's update and its settling."""
        steps = int(self._steps[sampled].min())
        losses = self._losses[sampled, :steps].cpu()
        seed = np.random.SeedSequence([self.config.seed, self.rounds_done, row])
        gen = torch.Generator().manual_seed(int(seed.generate_state(1)[0]))
        population = self.settings.loss_sampling_size
        rewards = gaussian_rewards(losses, self._weight[sampled].cpu(), population, gen)
        n = len(group)
        w = self.interactions.setdefault(row, torch.full((n, n), 1.0 / n**2, dtype=torch.float64))
        alpha = len(sampled) / n
        at = torch.tensor([group.index(i) for i in sampled])
        block = w[at[:, None], at[None, :]]
        updated = (1 - alpha) * block + alpha * (rewards / rewards.sum())[:, None]
        w[at[:, None], at[None, :]] = updated
        change = float(((updated - block) ** 2).sum()) / len(sampled) ** 2
        self.change[row] = (1 - alpha) * self.change[row] + alpha * change
        self.patience[row] = self.patience[row] + 1 if self.change[row] < self.settings.eps else 0

    def split(self, row: int, group: list[int], new: torch.Tensor) -> None:
        """Spectral clustering of the cluster's affinity; the best partition, if any, gives
        each part a row with a copy of the cluster's model."""
        free = (~self.in_use).nonzero().flatten().tolist()
        top = min(len(group) // self.per_round + 1, SPLITS, len(free) + 2)
        count, labels = best_partition(affinity(self.interactions[row], self.settings.gamma),
                                       range(2, top))  # fmt: skip
        if labels is None:
            self.change[row] = 1.0  # the authors' code: W must settle again (patience kept)
            return
        w = self.interactions.pop(row)
        for part in range(count):
            mask = torch.from_numpy(labels == part)
            child = row if part == 0 else free.pop(0)
            new[child] = new[row]
            self.in_use[child] = True
            for i in (g for g, m in zip(group, mask.tolist()) if m):
                self.cluster[i] = child
                self.omega[i] = one_hot(child, self.num_models)
            self.interactions[child] = w[mask][:, mask].clone()
            self.change[child], self.patience[child] = 1.0, 0

    def end_round(self) -> None:
        self.rounds_done += 1

    def round_info(self) -> dict[str, Any]:
        return {"active_models": int(self.in_use.sum())}
