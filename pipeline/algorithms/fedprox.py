"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term in the local loss.

Local objective: f_i(w) + (μ/2)‖w − w^t‖², w^t the global model received this round (the anchor
is reset every round). μ > 0 is required: with μ = 0 this is FedAvg (protocol §2). The default,
μ = 0.01, is from the grid {0.001, 0.01, 0.1, 1} the FedProx paper tunes over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms import described
from pipeline.algorithms.fedavg import FedAvg, FedAvgStep
from pipeline.algorithms.settings import ProximalSettings
from pipeline.engine.task import LocalTask


def proximal_tasks(gamma: torch.Tensor, models: torch.Tensor, mu: float) -> list[LocalTask]:
    n = float(gamma.shape[0])
    return [LocalTask(0, models[0], gamma[:, 0], n, anchor=models[0], mu=mu)]


@dataclass
class FedProxStep(FedAvgStep):
    mu: float

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        return proximal_tasks(gamma, models, self.mu)


@described("fedprox")
class FedProx(FedAvg):
    settings: ProximalSettings
    Step = FedProxStep

    def client_step(self, client: int) -> FedProxStep:
        return FedProxStep(mu=self.settings.mu)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        return proximal_tasks(gamma, models, self.settings.mu)
