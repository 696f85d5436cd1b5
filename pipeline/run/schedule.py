"""The local learning rate of each round: `train.lr_schedule` over the rounds, then the
algorithm's own adjustment (`Algorithm.local_lr`: Adaptive-FedAvg's drift-adaptive rate).

With η = `lr`, t = round − 1 (the rounds already done):
- constant: η;
- step: η γ^⌊t / s⌋, s = `lr_step_rounds`, γ = `lr_gamma` (torch's StepLR, stepped once a
  round);
- cosine: η_min + (η − η_min)(1 + cos(π min(t, T) / T)) / 2, T = `lr_period` (torch's
  CosineAnnealingLR in closed form, stepped once a round; η_min = `lr_min` from round T + 1).
Every place computes it from the configuration and the round alone, so the places agree and a
resumed run goes on with the rates the unbroken run would have had.
"""

from __future__ import annotations

import math

from pipeline.config import TrainConfig


def scheduled_lr(config: TrainConfig, round_: int) -> float:
    """The schedule's local learning rate at round `round_` (from 1)."""
    t = round_ - 1
    if config.lr_schedule == "step":
        return config.lr * config.lr_gamma ** (t // config.lr_step_rounds)
    if config.lr_schedule == "cosine":
        period = config.lr_period or config.rounds
        done = min(t, period)
        return (
            config.lr_min
            + (config.lr - config.lr_min) * (1 + math.cos(math.pi * done / period)) / 2
        )
    return config.lr
