"""A multi-layer perceptron for any input shape: the drift streams' model (FedDrift's `fnn`).

FedDrift (Jothimurugesan et al., AISTATS 2023) trains its tabular streams with one hidden ReLU
layer twice as wide as the input (`FeedForwardNN(d, classes, 2 d)`); that is the default here.
The executors hand every model uint8 images scaled to [−1, 1]; this one flattens them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from pipeline.settings import Settings, require, setting


@dataclass(frozen=True)
class MLPSettings(Settings):
    hidden: int | None = setting(
        None, "width of each hidden layer; null: 2 × the input size (FedDrift)"
    )
    layers: int = setting(1, "number of hidden layers")

    def validate(self) -> None:
        ok = self.hidden is None or self.hidden >= 1
        require(ok, "hidden", "an integer >= 1 or null", self.hidden)
        require(self.layers >= 1, "layers", "an integer >= 1", self.layers)


def build_mlp(shape: tuple[int, int, int], num_classes: int, settings: MLPSettings) -> nn.Module:
    """Flatten, then `layers` × (linear → ReLU), then linear → classes."""
    height, width, channels = shape
    inputs = height * width * channels
    hidden = settings.hidden or 2 * inputs
    body: list[nn.Module] = [nn.Flatten()]
    for i in range(settings.layers):
        body += [nn.Linear(inputs if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(hidden, num_classes))
