"""The local optimizers beside SGD: Adam (Kingma & Ba, ICLR 2015) and AdamW (Loshchilov &
Hutter, ICLR 2019), operation for operation as `torch.optim.Adam`'s single-tensor step
(`foreach=False`, no amsgrad). One step takes tensors of any shape, so the sequential executor
gives it one parameter and the batched one a stack of every task's copies: both compute the same
numbers. It returns new tensors and leaves its inputs as they were (the batched executor keeps
a masked task's old values).

With g the gradient, t the step (from 1), η the lr and λ the weight decay:
  adam:   g ← g + λ θ (L2, as torch's Adam)        adamw: θ ← θ (1 − η λ) (decoupled)
  m ← m + (1 − β1)(g − m)                          (torch's `lerp`)
  v ← β2 v + (1 − β2) g²
  θ ← θ − (η / (1 − β1^t)) m / (√v / √(1 − β2^t) + ε)
The moments start at zero with every local training (no state travels between rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class Adam:
    """Adam's constants for one executor; `decoupled` is AdamW."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        step: int,
        lr: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(θ, m, v) after step number `step` (1 for the first)."""
        start = param
        if self.weight_decay != 0:
            if self.decoupled:
                start = param.mul(1 - lr * self.weight_decay)
            else:
                grad = grad.add(param, alpha=self.weight_decay)
        exp_avg = exp_avg.lerp(grad, 1 - self.beta1)
        exp_avg_sq = exp_avg_sq.mul(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        bias_correction1 = 1 - self.beta1 ** float(step)
        bias_correction2 = 1 - self.beta2 ** float(step)
        step_size = lr / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(self.eps)
        return start.addcdiv(exp_avg, denom, value=-step_size), exp_avg, exp_avg_sq


def local_rule(
    optimizer: str, betas: tuple[float, float], eps: float, weight_decay: float
) -> Adam | None:
    """The executor's rule for `optimizer`: None for SGD (written out in each executor)."""
    if optimizer not in LOCAL_OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {LOCAL_OPTIMIZERS}, got {optimizer!r}")
    if optimizer == "sgd":
        return None
    return Adam(betas[0], betas[1], eps, weight_decay, decoupled=optimizer == "adamw")
