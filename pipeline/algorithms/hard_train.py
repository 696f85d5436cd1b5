"""TrHC (FedRC paper, "hard training"): each client trains only the model of its largest ω_i,
on all its samples with weight 1, instead of every model with its γ column."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms.client import ClientStep, mean_omega
from pipeline.engine.task import LocalTask


@dataclass
class HardTrainStep(ClientStep):
    """A client step's part: whether the client trains its arg-max ω model alone."""

    hard_train: bool

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        if not self.hard_train:
            return super().local_tasks(gamma, models)
        k = int(mean_omega(gamma).argmax())
        return [LocalTask(k, models[k], torch.ones_like(gamma[:, k]), weight=float(gamma.shape[0]))]
