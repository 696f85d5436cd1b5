"""The FedRC paper's Fashion-MNIST CNN (protocol §5): about 2.2M parameters on 28×28 inputs."""

from __future__ import annotations

import torch
from torch import nn


class FmnistCNN(nn.Module):
    """conv 5×5 → 32, pool 2, conv 5×5 → 64, pool 2, linear → 2048, linear → classes.

    The first linear layer's width follows the input size (1024 on 28×28), so the same
    architecture serves the small synthetic images.
    """

    def __init__(
        self,
        channels: int,
        height: int,
        width: int,
        num_classes: int,
        normalize: list[float] | None = None,
    ) -> None:
        super().__init__()
        # the executors feed x = p/127.5 − 1; (p/255 − mean)/std = x · 0.5/std + (0.5 − mean)/std
        # (plain numbers, not buffers: a flat model's layout stays the same)
        mean, std = normalize if normalize is not None else (None, None)
        self.rescale = None if std is None else (0.5 / std, (0.5 - mean) / std)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, channels, height, width)).shape[1]
        self.classifier = nn.Sequential(
            nn.Linear(flat, 2048), nn.ReLU(), nn.Linear(2048, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rescale is not None:
            x = x * self.rescale[0] + self.rescale[1]
        return self.classifier(self.features(x))
