"""Flash (Panchal, Choudhary, Mitra, Mukherjee, Sarkhel, Mitra & Guan, ICML 2023): concept-drift
adaptation by client early stopping and a drift-aware adaptive server step.

Client (Algorithm 1, ClientOpt): local training of at most `local_epochs` epochs that stops
after epoch e ≥ 2 when the client's loss improved by less than γ / e over that epoch
(`LocalTask.stop_gain`; the loss: the model's mean loss on the client's training samples, in
eval mode). A client whose data drifted fits it over more epochs, so its update is large.

Server, from the N_i-weighted average of the returned models (Δ = average − θ), per coordinate:
  m ← β1 m + (1 − β1) Δ                          (momentum, as FedAdam)
  v ← β2 v + (1 − β2) Δ²                         (second moment, as FedAdam)
  β3 = |v_prev| / (|Δ² − v| + |v_prev|)           (v_prev: v before this round)
  d ← β3 d + (1 − β3) (Δ² − v)                   (drift: how far Δ² jumps above v)
  θ ← θ + η m / (√v − d + τ)
from m = d = 0 and v = τ² (FedCCFA's code; FL4Health's v = 0 divides 0 by 0 where Δ = 0 in
round 1: docs/authors-check.md). η, β1, β2, τ and γ are Flash's own settings (the server step
replaces `train.server_lr` and `train.server_opt`). The authors' code is not public; this
follows FL4Health's Flash (the server, the within-round stopping test) and FedCCFA's baseline
(v's start, the defaults, the N_i-weighted average).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms import described
from pipeline.algorithms.fedavg import FedAvg, FedAvgStep
from pipeline.algorithms.settings import FlashSettings
from pipeline.common.errors import FedrcError
from pipeline.engine.task import LocalTask


def flash_tasks(gamma: torch.Tensor, models: torch.Tensor, stop_gain: float) -> list[LocalTask]:
    """FedAvg's one task, stopping early (`stop_gain` γ)."""
    n = float(gamma.shape[0])
    return [LocalTask(0, models[0], gamma[:, 0], n, stop_gain=stop_gain)]


@dataclass
class FlashStep(FedAvgStep):
    """FedAvg's E-step; the local training stops early at γ."""

    gamma: float

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        return flash_tasks(gamma, models, self.gamma)


@described("flash")
class Flash(FedAvg):
    """FedAvg's clients with early stopping; the server's step is Flash's (module docstring)."""

    settings: FlashSettings
    Step = FlashStep
    needs_sequential = True  # early stopping: the sequential executor only
    local_training = "stops early (LocalTask.stop_gain)"
    state_attributes = ("moments",)

    def init_state(self) -> None:
        super().init_state()
        if self.config.server_opt != "sgd" or self.config.server_lr != 1.0:
            raise FedrcError(
                "train.server_opt: flash has its own server step (--set eta=…); leave "
                "server_opt at sgd and server_lr at 1"
            )
        self.moments: dict[str, torch.Tensor] | None = None  # m, v, d of the global model

    def client_step(self, client: int) -> FlashStep:
        return FlashStep(gamma=self.settings.gamma)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        return flash_tasks(gamma, models, self.settings.gamma)

    def server_step(
        self, models: torch.Tensor, delta: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Flash's drift-aware step from the pseudo-gradient Δ (module docstring)."""
        s = self.settings
        if self.moments is None:
            zero = torch.zeros_like(models)
            self.moments = {"m": zero, "v": torch.full_like(models, s.tau**2), "d": zero.clone()}
        m, v, d = (self.moments[k][rows] for k in ("m", "v", "d"))
        square = delta * delta
        m = s.beta1 * m + (1 - s.beta1) * delta
        previous, v = v, s.beta2 * v + (1 - s.beta2) * square
        beta3 = previous.abs() / ((square - v).abs() + previous.abs())
        d = beta3 * d + (1 - beta3) * (square - v)
        for key, value in (("m", m), ("v", v), ("d", d)):
            self.moments[key][rows] = value
        return models[rows] + s.eta * m / (v.sqrt() - d + s.tau)
