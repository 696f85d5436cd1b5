"""The sequential executor: one (client, model) pair at a time, on one reused module.

On a 2-core CPU the FMNIST CNN is compute-bound, and this plain loop is the fastest way to run
it (DESIGN.md principle 3). It is also the reference that faster executors are checked against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INFERENCE_CHUNK = 256  # measured fastest for the CNN on the 2-core CPU


def as_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) → float inputs in [-1, 1]."""
    return images.float().div_(127.5).sub_(1.0)


class SequentialExecutor:
    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        batch_size: int,
        local_epochs: int,
        drop_last: bool,
    ) -> None:
        self.device = device
        self.model = model.to(device)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(
            self.params, lr=lr, momentum=momentum, weight_decay=weight_decay
        )
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.drop_last = drop_last

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.params)

    def flatten(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def load(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def logits(self, models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Logits of every model on every image: (K, N, classes), no gradients."""
        self.model.eval()
        out = []
        with torch.no_grad():
            for flat in models:
                self.load(flat)
                chunks = [
                    self.model(as_input(images[s : s + INFERENCE_CHUNK]))
                    for s in range(0, images.shape[0], INFERENCE_CHUNK)
                ]
                out.append(torch.cat(chunks))
        return torch.stack(out)

    def losses(self, models: torch.Tensor, images: torch.Tensor, labels: torch.Tensor):
        """Per-sample cross-entropy of every model: (N, K)."""
        logits = self.logits(models, images)
        return torch.stack([F.cross_entropy(z, labels, reduction="none") for z in logits], 1)

    def train(
        self,
        start: torch.Tensor,
        images: torch.Tensor,
        labels: torch.Tensor,
        weights: torch.Tensor,
        seed: int,
    ) -> tuple[torch.Tensor, float]:
        """Local SGD from `start` with loss (1/B) Σ_b w_b f(x_b, y_b); fresh momentum.

        Returns the trained parameters and Σ w·f over every sample seen (for the train loss).
        """
        self.load(start)
        self.model.train()
        self.optimizer.state.clear()
        gen = torch.Generator().manual_seed(seed)
        n = labels.shape[0]
        total = 0.0
        for _ in range(self.local_epochs):
            order = torch.randperm(n, generator=gen).to(self.device)
            stop = n - n % self.batch_size if self.drop_last and n >= self.batch_size else n
            for s in range(0, stop, self.batch_size):
                idx = order[s : min(s + self.batch_size, stop)]
                per_sample = F.cross_entropy(
                    self.model(as_input(images[idx])), labels[idx], reduction="none"
                )
                weighted = (weights[idx] * per_sample).sum()
                self.optimizer.zero_grad(set_to_none=True)
                (weighted / idx.numel()).backward()
                self.optimizer.step()
                total += float(weighted.detach())
        return self.flatten(), total
