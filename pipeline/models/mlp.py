"""A multi-layer perceptron for any input shape: the drift streams' model (FedDrift's `fnn`).

FedDrift (Jothimurugesan et al., AISTATS 2023) trains its tabular streams with one hidden ReLU
layer twice as wide as the input (`FeedForwardNN(d, classes, 2 d)`); that is the default here.
The executors hand every model uint8 images scaled to [−1, 1]; this one flattens them.
"""

from __future__ import annotations

from torch import nn

from pipeline.models.settings import MLPSettings


def build_mlp(shape: tuple[int, int, int], num_classes: int, settings: MLPSettings) -> nn.Module:
    """Flatten, then `layers` × (linear → ReLU), then linear → classes."""
    height, width, channels = shape
    inputs = height * width * channels
    hidden = settings.hidden or 2 * inputs
    body: list[nn.Module] = [nn.Flatten()]
    for i in range(settings.layers):
        body += [nn.Linear(inputs if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(hidden, num_classes))
