"""A small multi-layer perceptron for low-resolution images (the FMNIST CNN needs ≥ 16×16).

Named `digits-mlp`: a plugin cannot take a built-in's name, and fedrc has its own `mlp`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from pipeline.plugin import ModelSpec, Settings, require, setting


@dataclass(frozen=True)
class MLPSettings(Settings):
    hidden: int = setting(128, "width of the hidden layer")

    def validate(self) -> None:
        require(self.hidden >= 1, "hidden", "an integer >= 1", self.hidden)


def build(image_shape: tuple[int, int, int], num_classes: int, settings: Any) -> nn.Module:
    height, width, channels = image_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(height * width * channels, settings.hidden),
        nn.ReLU(),
        nn.Linear(settings.hidden, num_classes),
    )


MLP = ModelSpec("digits-mlp", "A one-hidden-layer perceptron (example plugin)", build, MLPSettings)
