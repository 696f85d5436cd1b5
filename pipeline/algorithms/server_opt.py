"""The server's step from the averaged models to the new ones (`train.server_opt`), for every
model row an algorithm averages (`Algorithm.aggregate`).

With Δ_k = average_k − θ_k, the row's pseudo-gradient, and η = `server_lr`:
- sgd: θ_k ← θ_k + η Δ_k (FedAvg's server with a learning rate; η = 1 is the average);
- FedOpt (Reddi et al., ICLR 2021, Algorithm 2; β1, β2, τ = `server_beta1`, `server_beta2`,
  `server_tau`), per coordinate, with the state of row k:
    m ← β1 m + (1 − β1) Δ                                     (line 10)
    adagrad: v ← v + Δ²                                       (line 11, FedAdagrad)
    yogi:    v ← v − (1 − β2) Δ² sign(v − Δ²)                 (line 12, FedYogi)
    adam:    v ← β2 v + (1 − β2) Δ²                           (line 13, FedAdam)
    θ ← θ + η m / (√v + τ)                                    (line 14)
  from m = 0 and v = τ² (the paper's v_{−1} ≥ τ²), without Adam's bias correction, as the
  paper writes it (docs/authors-check.md: the authors' Keras optimizers and Flower differ).

The state is one (m, v) per model row: clustered methods step each cluster's model with its
own moments. A row whose model was changed outside this step since its last one (a model a
method created, split, copied or merged: CFL, FedDrift, StoCFL, FLUX) starts again from
m = 0, v = τ²: `last` keeps each row as the step left it. The state is a dict of tensors, so
that a checkpoint holds it (`Algorithm.state_dict`: key `server_opt`).
"""

from __future__ import annotations

import torch

from pipeline.config import TrainConfig

State = dict[str, torch.Tensor]


class ServerOptimizer:
    """`train.server_opt`'s step; `state` None until its first adaptive step."""

    def __init__(self, config: TrainConfig) -> None:
        self.kind, self.lr = config.server_opt, config.server_lr
        self.beta1, self.beta2, self.tau = (
            config.server_beta1,
            config.server_beta2,
            config.server_tau,
        )

    @property
    def adaptive(self) -> bool:
        return self.kind != "sgd"

    def fresh(self, models: torch.Tensor) -> State:
        """m = 0, v = τ² for every row; `last` the rows as they are."""
        m = torch.zeros_like(models)
        return {"m": m, "v": torch.full_like(models, self.tau**2), "last": models.clone()}

    def step(
        self, models: torch.Tensor, delta: torch.Tensor, rows: torch.Tensor, state: State | None
    ) -> tuple[torch.Tensor, State | None]:
        """The new rows `rows` (a bool mask or indices) of `models` from their pseudo-gradients
        `delta` (one per row of `rows`, in the models' dtype), and the state after the step."""
        if not self.adaptive:
            return models[rows] + self.lr * delta, state
        if state is None:
            state = self.fresh(models)
        moved = (models != state["last"]).any(1)  # changed outside the step: start over
        if bool(moved.any()):
            state["m"][moved] = 0.0
            state["v"][moved] = self.tau**2
        m = self.beta1 * state["m"][rows] + (1 - self.beta1) * delta  # line 10
        v = self.second_moment(state["v"][rows], delta * delta)  # lines 11–13
        new = models[rows] + self.lr * m / (v.sqrt() + self.tau)  # line 14
        state["m"][rows], state["v"][rows] = m, v
        state["last"] = models.clone()
        state["last"][rows] = new
        return new, state

    def second_moment(self, v: torch.Tensor, square: torch.Tensor) -> torch.Tensor:
        if self.kind == "adagrad":
            return v + square
        if self.kind == "yogi":
            return v - (1 - self.beta2) * square * torch.sign(v - square)
        return self.beta2 * v + (1 - self.beta2) * square
