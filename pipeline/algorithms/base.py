"""The contract every algorithm fulfils; the round loop in `pipeline.training` calls these verbs.

Per round, for each sampled client i (FedRC paper, Algorithm 1):
  `assign(i, losses, labels)`   E-step / assignment with the models just received → γ (N_i, K),
                                the per-sample weights of model k's local training
  `aggregation_weights(i, N_i)` how much client i's copy of each model counts on the server
then once on the server:
  `aggregate(models, sums, totals)` the new global models
  `end_round()`                 server-side bookkeeping for the next round (FedRC: C_{y,k})
and for prediction:
  `assign_held_out(i, losses, labels)` a non-participating client fits its ω
  `predict_weights(i)`          ω_i, the client's mixture over the K models
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from pipeline.config import TrainConfig


class Algorithm:
    name: ClassVar[str]

    def __init__(self, num_models: int, num_clients: int, num_classes: int, config: TrainConfig):
        self.num_models = num_models
        self.num_classes = num_classes
        self.config = config
        self.omega = torch.full((num_clients, num_models), 1.0 / num_models, dtype=torch.float64)

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def assign_held_out(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> None:
        raise NotImplementedError

    def aggregation_weights(self, client: int, num_samples: int) -> torch.Tensor:
        """Every model of a sampled client counts with its sample count N_i (FedAvg weighting)."""
        return torch.full((self.num_models,), float(num_samples), dtype=torch.float64)

    def aggregate(
        self, models: torch.Tensor, sums: torch.Tensor, totals: torch.Tensor
    ) -> torch.Tensor:
        """θ_k ← Σ_i w_ik θ_ik / Σ_i w_ik; a model no client trained keeps its parameters."""
        trained = totals > 0
        new = models.clone()
        new[trained] = (sums[trained] / totals[trained, None]).to(models.dtype)
        return new

    def end_round(self) -> None:
        """Nothing to do between rounds unless the algorithm keeps server-side statistics."""

    def predict_weights(self, client: int) -> torch.Tensor:
        return self.omega[client]

    def state_dict(self) -> dict[str, Any]:
        return {"omega": self.omega}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            if current.shape != value.shape:
                raise ValueError(f"{key}: shape {tuple(value.shape)} != {tuple(current.shape)}")
            setattr(self, key, value.to(current.dtype))
