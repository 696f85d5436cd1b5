"""APFL (Deng, Kamani & Mahdavi, arXiv:2003.13461, 2020): adaptive personalized federated
learning, a mixture of a personal and a global model per client.

Every client i keeps a personal model v_i and a mixing weight α_i; the server keeps one global
model w. A sampled client starts from the received w and, on each batch (one local step of the
paper's Algorithm 1, in the order of its authors' code):
  w ← w − η ∇f_i(w)                                    the global copy's local SGD step
  v_i ← v_i − η ∇_v f_i(v̄_i),  v̄_i = α_i v_i + (1 − α_i) w   the personal model, through the mix
  α_i ← clip(α_i − η (⟨v_i − w, α_i ∇_v + (1 − α_i) ∇_w⟩ + 0.02 α_i), 0, 1)
                                                        with `adaptive`, on the round's first batch
where ∇_v and ∇_w are the gradients of f_i(v̄_i) after the two steps (the authors'
`alpha_update`, its 0.02 α_i term and its step η included). The mixture is taken of the two
models' outputs, α_i v_i(x) + (1 − α_i) w(x), as the authors' code computes it; the paper writes
it of the parameters, which agrees for a model linear in its parameters. η is train.lr; both
steps are the run's SGD (momentum, weight decay), momentum fresh each round. The server averages
the trained w (FedAvg). A participating client predicts with α_i v_i(x) + (1 − α_i) w(x), w the
current global model; before its first round, and for a held-out client, w alone. v_i starts as
the initial model (the authors' copy of the model each client is built with), α_i as `alpha`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from pipeline.algorithms import described
from pipeline.algorithms.personal import PersonalModels
from pipeline.algorithms.settings import APFLSettings
from pipeline.engine.rules import LocalRule, Net
from pipeline.engine.task import LocalResult

ALPHA_DECAY = 0.02  # the authors' `alpha_update`: the gradient of α gains 0.02 α


class APFLRule(LocalRule):
    """One client's round of APFL (module docstring): w, v and α on each batch."""

    def __init__(self, personal: torch.Tensor, alpha: float, adaptive: bool, lr: float) -> None:
        self.personal, self.alpha, self.adaptive, self.lr = personal, alpha, adaptive, lr

    def begin(self, net: Net, start: torch.Tensor) -> None:
        self.w, self.w_buffers = net.split(start)
        self.v, self.v_buffers = net.split(self.personal)
        self.first = True

    def mixture(self, net: Net, images: torch.Tensor) -> torch.Tensor:
        """α v(x) + (1 − α) w(x)."""
        personal = net.logits(self.v, self.v_buffers, images)
        return self.alpha * personal + (1 - self.alpha) * net.logits(self.w, self.w_buffers, images)

    def batch(self, net: Net, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = F.cross_entropy(
            net.logits(self.w, self.w_buffers, images), labels, reduction="none"
        )
        (grad_w,) = torch.autograd.grad(losses.mean(), self.w)
        net.sgd("w", self.w, grad_w, self.lr)
        mixed = F.cross_entropy(self.mixture(net, images), labels)
        grad_v, grad_w = torch.autograd.grad(mixed, [self.v, self.w])
        net.sgd("v", self.v, grad_v, self.lr)
        if self.adaptive and self.first:
            gap = self.v.detach() - self.w.detach()
            slope = float(gap @ (self.alpha * grad_v + (1 - self.alpha) * grad_w))
            self.alpha = min(
                max(self.alpha - self.lr * (slope + ALPHA_DECAY * self.alpha), 0.0), 1.0
            )
        self.first = False
        return losses.sum().detach().double()

    def end(self, net: Net) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        personal = net.join(self.v, self.v_buffers)
        alpha = torch.tensor([self.alpha], dtype=torch.float64)
        return net.join(self.w, self.w_buffers), {"personal": personal, "alpha": alpha}


@described("apfl")
class APFL(PersonalModels):
    settings: APFLSettings
    state_attributes: ClassVar[tuple[str, ...]] = ("personal", "alpha", "initial", "current")
    row_extra = 1  # α_i after the personal model

    def init_state(self) -> None:
        super().init_state()
        self.alpha = torch.full((self.num_clients,), self.settings.alpha, dtype=torch.float64)
        self.initial: torch.Tensor | None = None  # the models before round 1: v_i's start
        self.current: torch.Tensor | None = None  # the latest global model, which v̄_i mixes in

    def rule(self, client: int, models: torch.Tensor) -> APFLRule:
        own = self.personal.get(client, self.initial).to(models)
        s = self.settings
        return APFLRule(own, float(self.alpha[client]), s.adaptive, self.config.lr)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        if self.initial is None:
            self.initial = models[0].to("cpu", torch.float32).clone()

    def row(self, result: LocalResult) -> torch.Tensor:
        return torch.cat([result.extras["personal"].float(), result.extras["alpha"].float()])

    def keep(self, client: int, row: torch.Tensor) -> None:
        self.personal[client] = row[:-1].clone()
        self.alpha[client] = float(row[-1])

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        self.current = new[0].to("cpu", torch.float32).clone()
        return new

    def personal_model(self, client: int) -> torch.Tensor | None:
        """v_i and the current global model, whose outputs `combine_personal` mixes."""
        own = self.personal.get(client)
        return None if own is None else torch.stack([own, self.current])

    def combine_personal(self, client: int, logits: torch.Tensor) -> torch.Tensor:
        """α_i v_i(x) + (1 − α_i) w(x) from the logits (2, N, classes) of [v_i, w]."""
        alpha = float(self.alpha[client])
        return (alpha * logits[0] + (1 - alpha) * logits[1])[None]

    def round_info(self) -> dict[str, Any]:
        """The mean α_i over the clients that have trained."""
        seen = sorted(self.personal)
        return {"mean_alpha": float(self.alpha[seen].mean())} if seen else {}
