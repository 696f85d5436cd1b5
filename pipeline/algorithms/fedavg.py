"""FedAvg (McMahan et al., 2017): one global model, N_i-weighted average of local models."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientOutcome, ClientStep, Memory, Rows, mean_omega
from pipeline.common.settings import Settings


@dataclass
class FedAvgStep(ClientStep):
    """The client needs nothing but the model and sends nothing but its trained copy (ω = 1)."""

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        gamma = torch.ones_like(losses)
        return ClientOutcome(gamma, {"omega": mean_omega(gamma)})

    def reads(self, predictors: int) -> Rows:
        """No loss: every sample trains the one model."""
        return ()

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A held-out client simply uses the one global model (ω = 1)."""
        return torch.ones(1, dtype=torch.float64)


@described("fedavg")
class FedAvg(Algorithm):
    """Every client trains the single model on all its samples with weight 1."""

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        return 1

    Step = FedAvgStep

    def client_step(self, client: int) -> FedAvgStep:
        return FedAvgStep()
