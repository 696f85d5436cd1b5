"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term in the local loss.

Local objective: f_i(w) + (μ/2)‖w − w^t‖², w^t the global model received this round (the anchor
is reset every round). μ > 0 is required: with μ = 0 this is FedAvg (NOTES §2).
"""

from __future__ import annotations

import torch

from pipeline.algorithms.fedavg import FedAvg
from pipeline.engine.task import LocalTask


class FedProx(FedAvg):
    name = "fedprox"
    paper = "Li et al., MLSys 2020"

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        n = float(gamma.shape[0])
        return [LocalTask(0, models[0], gamma[:, 0], n, anchor=models[0], mu=self.config.mu)]
