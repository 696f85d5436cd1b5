"""The local SGD step of the sequential executor: torch.optim.SGD's update (momentum, weight
decay, no dampening, no Nesterov), number for number, with the first step's buffer taken over
rather than copied.

On its first step torch copies the (decayed) gradient into a fresh momentum buffer. That
gradient is used for nothing else afterwards (the next backward pass allocates a new one), so
this step keeps the tensor itself: one pass over the model's memory less for every local
training, which matters when 3,000 clients of 18 samples each train one step apiece
(`benchmarks/many_clients.py`). `tests/test_sgd.py` checks it against torch.optim.SGD.
"""

from __future__ import annotations

import torch


class LocalSGD:
    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float, weight_decay: float):
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    def start(self, buffers: list[torch.Tensor] | None = None) -> None:
        """Fresh momentum, or copies of `buffers` (one per parameter)."""
        if buffers is None:
            self.buffers = [None] * len(self.params)
        else:
            self.buffers = [b.clone() for b in buffers]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue  # as torch: a parameter without a gradient is left alone
            d = p.grad
            if self.weight_decay != 0:
                d = d.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                if self.buffers[i] is None:
                    self.buffers[i] = d  # torch copies it here; nothing else uses it
                else:
                    self.buffers[i].mul_(self.momentum).add_(d)
                d = self.buffers[i]
            p.add_(d, alpha=-self.lr)

    def flat_momentum(self) -> torch.Tensor:
        """Every parameter's buffer in one flat vector (zeros where no step has made one)."""
        return torch.cat(
            [
                (torch.zeros_like(p) if b is None else b).reshape(-1)
                for p, b in zip(self.params, self.buffers)
            ]
        )
