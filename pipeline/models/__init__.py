"""Models by name, built for a dataset's image shape and number of classes."""

from __future__ import annotations

from torch import nn

from pipeline.models.cnn import FmnistCNN


def build_model(image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The FMNIST CNN of the FedRC paper (NOTES §5), sized for (H, W, C) images."""
    height, width, channels = image_shape
    return FmnistCNN(channels, height, width, num_classes)
