"""FedAvg (McMahan et al., 2017): one global model, N_i-weighted average of local models."""

from __future__ import annotations

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.settings import Settings


class FedAvg(Algorithm):
    """Every client trains the single model on all its samples with weight 1."""

    name = "fedavg"
    title = "FedAvg"
    paper = "McMahan et al., AISTATS 2017"

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        return 1

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(losses)

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """A held-out client simply uses the one global model (ω = 1)."""
        return torch.ones(1, dtype=torch.float64)
