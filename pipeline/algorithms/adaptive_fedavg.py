"""Adaptive-FedAvg (Canonaco, Bergamasco, Mongelluzzo & Roveri, IJCNN 2021): FedAvg whose
local learning rate follows the drift of the global model.

After the aggregation of round t (t = 1, 2, …) the server updates three bias-corrected running
estimates of the global model θ_t (a flat vector of P numbers) and from them the learning rate
of round t + 1:
  μ_t = β1 μ_{t−1} + (1 − β1) θ_t,                     μ̂_t = μ_t / (1 − β1^t)    (mean)
  σ²_t = β2 σ²_{t−1} + (1 − β2) (1/P) ‖θ_t − μ̂_{t−1}‖²,  σ̂²_t = σ²_t / (1 − β2^t)  (variance)
  ρ_t = β3 ρ_{t−1} + (1 − β3) σ̂²_t / σ̂²_{t−1},           ρ̂_t = ρ_t / (1 − β3^t)    (ratio)
  η_{t+1} = min(η, η ρ̂_t / t)
from μ_0 = μ̂_0 = 0, σ²_0 = ρ_0 = 0, and a ratio of 1 at t = 1 (no variance before). In a
stationary phase the variance settles, ρ̂ → 1 and the rate decays as η / t; a drift moves θ,
the variance jumps, and the rate climbs back towards η. η is the round's scheduled rate
(`train.lr`, `train.lr_schedule`). As the code of FedDrift and FedCCFA writes it (the paper
was not reachable: docs/authors-check.md); there the ratio of two variances is the plasticity
signal, and P counts every number of the flat model (FedDrift's state_dict: BatchNorm's
statistics too).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.fedavg import FedAvg
from pipeline.algorithms.settings import AdaptiveFedAvgSettings


@described("adaptive-fedavg")
class AdaptiveFedAvg(FedAvg):
    """FedAvg's client part and aggregation; the server sets every round's local rate."""

    settings: AdaptiveFedAvgSettings
    state_attributes = ("mean", "variance", "ratio", "rounds", "gain")

    def init_state(self) -> None:
        super().init_state()
        self.mean: torch.Tensor | None = None  # μ_t (float64), made from the first model
        self.variance = 0.0  # σ²_t
        self.ratio = 0.0  # ρ_t
        self.rounds = 0  # t, the rounds aggregated
        self.gain = 1.0  # ρ̂_t: η_{t+1} = min(η, η ρ̂_t / t)

    def local_lr(self, lr: float) -> float:
        """η at round 1; then min(η, η ρ̂_t / t) after t rounds."""
        if self.rounds == 0:
            return lr
        return min(lr, lr * self.gain / self.rounds)

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        self.track(new[0].detach().to("cpu", torch.float64))
        return new

    def track(self, theta: torch.Tensor) -> None:
        """The running estimates after round t with global model θ_t (module docstring)."""
        s = self.settings
        t = self.rounds = self.rounds + 1
        if self.mean is None:
            self.mean = torch.zeros_like(theta)
        before = self.mean / (1 - s.beta1 ** (t - 1)) if t > 1 else torch.zeros_like(theta)
        previous = self.variance / (1 - s.beta2 ** (t - 1)) if t > 1 else 0.0  # σ̂²_{t−1}
        self.mean = s.beta1 * self.mean + (1 - s.beta1) * theta
        spread = float(((theta - before) ** 2).mean())
        self.variance = s.beta2 * self.variance + (1 - s.beta2) * spread
        current = self.variance / (1 - s.beta2**t)  # σ̂²_t
        change = current / previous if previous != 0 else 1.0
        self.ratio = s.beta3 * self.ratio + (1 - s.beta3) * change
        self.gain = self.ratio / (1 - s.beta3**t)

    def round_info(self) -> dict[str, Any]:
        return {"lr_gain": self.gain}
