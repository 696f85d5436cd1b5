"""pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020): personalized federated learning with Moreau
envelopes.

Client i's objective is the Moreau envelope F_i(w) = min_θ f_i(θ) + (λ/2)‖θ − w‖², whose
minimiser θ̂_i(w) is its personal model. A sampled client sets its local model w and its personal
model θ to the received global model and, on each batch D (a local round of the paper's
Algorithm 1, as its authors' code runs it):
  K times:  θ ← θ − η_p (∇f_i(θ; D) + λ (θ − w) + μ θ)   θ̂_i(w) approximately, on the same batch
  then:     w ← w − η λ (w − θ)                         a step along ∇F_i(w) = λ (w − θ̂_i(w))
θ goes on from one batch to the next; μ (`personal_decay`) is the L2 term the authors'
optimizer adds. The client sends w (with θ's BatchNorm statistics, the only ones its forward
passes update), and the server sets w ← (1 − β) w + β Σ_i N_i w_i / Σ_i N_i with β = train's
`server_lr` (the same update as FedAvg's η_g). A participating client predicts with the θ of
its last round; before its first round, and for a held-out client, w does. The logged train
loss is θ's loss at the first of its K steps on each batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.algorithms import described
from pipeline.algorithms.personal import PersonalModels
from pipeline.algorithms.settings import PFedMeSettings
from pipeline.common.errors import FedrcError
from pipeline.engine.rules import LocalRule, Net


class PFedMeRule(LocalRule):
    """One client's round of pFedMe (module docstring): θ's K inner steps and w's step on each
    batch."""

    def __init__(self, settings: PFedMeSettings) -> None:
        self.s = settings

    def begin(self, net: Net, start: torch.Tensor) -> None:
        self.theta, self.buffers = net.split(start)
        self.w = self.theta.detach().clone()

    def batch(self, net: Net, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s, first = self.s, None
        for _ in range(s.inner_steps):
            losses = F.cross_entropy(
                net.logits(self.theta, self.buffers, images), labels, reduction="none"
            )
            (grad,) = torch.autograd.grad(losses.mean(), self.theta)
            with torch.no_grad():
                pull = s.lam * (self.theta - self.w) + s.personal_decay * self.theta
                self.theta -= s.personal_lr * (grad + pull)
            first = losses.sum().detach() if first is None else first
        with torch.no_grad():
            self.w -= s.local_lr * s.lam * (self.w - self.theta)
        return first.double()

    def end(self, net: Net) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        personal = net.join(self.theta, self.buffers)
        return net.join(self.w, self.buffers), {"personal": personal}


@described("pfedme")
class PFedMe(PersonalModels):
    settings: PFedMeSettings

    def init_state(self) -> None:
        super().init_state()
        if self.config.lr_schedule != "constant":
            raise FedrcError(
                "train.lr_schedule: pfedme steps at its own rates (personal_lr, local_lr), not "
                "--lr; set it to constant"
            )

    def rule(self, client: int, models: torch.Tensor) -> PFedMeRule:
        return PFedMeRule(self.settings)

    def divergence_hint(self, now: str) -> str:
        """θ's steps diverge when η_p (λ + the loss's curvature) passes 2 (--lr does not apply)."""
        s = self.settings
        return f"lower --set personal_lr=... (now {s.personal_lr}; lam {s.lam})"
