"""FLSC (Li et al., "Federated Learning with Soft Clustering", IEEE Internet of Things Journal
2022): each client joins the n clusters whose models fit its data best and trains all n of them.

A client computes the mean loss of every cluster model on its data, keeps the n lowest, and
trains each chosen model on all its samples; the server averages each model over the clients
that trained it (N_i-weighted, fedrc's default aggregation). A client predicts with the
equal-weight ensemble of its n models; a held-out client chooses its n the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.plugin import Algorithm, LocalTask, Settings, require, setting


@dataclass(frozen=True)
class FLSCSettings(Settings):
    n: int = setting(2, "clusters each client joins (the paper's n; 1 is IFCA)")

    def validate(self) -> None:
        require(self.n >= 1, "n", "an integer >= 1", self.n)


class FLSC(Algorithm):
    name = "flsc"
    title = "FLSC"
    paper = "Li et al., IEEE Internet of Things Journal 2022"
    Settings = FLSCSettings
    settings: FLSCSettings

    def choose(self, client: int, losses: torch.Tensor) -> torch.Tensor:
        """ω_i: 1/n on the n models with the lowest mean loss, 0 elsewhere."""
        n = min(self.settings.n, self.num_models)
        chosen = losses.mean(0).topk(n, largest=False).indices.cpu()
        omega = torch.zeros(self.num_models, dtype=torch.float64)
        omega[chosen] = 1.0 / n
        return omega

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """γ = 1 for every sample on each chosen model: each trains on all the client's data."""
        chosen = self.choose(client, losses) > 0
        return chosen.to(losses).expand_as(losses).clone()

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        """1/n on each chosen model (γ's columns are 1 there, 0 elsewhere)."""
        chosen = gamma[0].to("cpu", torch.float64)
        return chosen / chosen.sum()

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return self.choose(client, losses)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        n_i = float(gamma.shape[0])
        chosen = self.omega[client] > 0
        return [
            LocalTask(k, models[k], gamma[:, k], weight=n_i)
            for k in range(self.num_models)
            if chosen[k]
        ]
