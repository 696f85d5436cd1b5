"""IFCA (Ghosh et al., NeurIPS 2020): each client joins the model with the lowest loss.

Client i picks k* = argmin_k (1/N_i) Σ_j f(x_ij, y_ij; θ_k) with the models it just received,
trains only θ_{k*}, and the server averages each model over its members (N_i-weighted). A model
with no member this round keeps its parameters. The FedRC authors' release zeroes it instead
(`zero_empty`, protocol §2): a zeroed ReLU network passes no gradient to any weight but its
output bias, a label prior; only SGD momentum that a client kept from training the model before
(`profile: reference`) moves its other weights again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import HardStep, Memory, hard_outcome
from pipeline.algorithms.settings import ZeroEmptySettings


def zero_unchosen(models: torch.Tensor, totals: torch.Tensor) -> torch.Tensor:
    """The released `average_learners` over an empty list: every row nobody trained (no
    weight in `totals`) filled with zeros, buffers included."""
    models[totals == 0] = 0.0
    return models


@dataclass
class IFCAStep(HardStep):
    """The client needs only the K models; it sends its chosen index (ω_i one-hot)."""

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        return hard_outcome(losses, int(losses.mean(0).argmin()))


@described("ifca")
class IFCA(HardClustering):
    settings: ZeroEmptySettings
    Step = IFCAStep

    def client_step(self, client: int) -> IFCAStep:
        return IFCAStep()

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        return zero_unchosen(new, self.totals) if self.as_released("zero_empty") else new
