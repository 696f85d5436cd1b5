"""Models by name, built for a dataset's image shape and number of classes."""

from __future__ import annotations

from torch import nn

from pipeline.models.cnn import FmnistCNN


def build_model(
    image_shape: tuple[int, int, int],
    num_classes: int,
    name: str = "cnn",
    pretrained: bool = False,
    norm: str = "batch",
) -> nn.Module:
    """`cnn`: the paper's FMNIST CNN (NOTES §5); `mobilenet_v2`, `resnet18`: torchvision's."""
    height, width, channels = image_shape
    if name == "cnn":
        return FmnistCNN(channels, height, width, num_classes)
    from pipeline.models.torchvision_nets import torchvision_net  # torchvision: 1–2 s to import

    return torchvision_net(name, channels, num_classes, pretrained, norm)
