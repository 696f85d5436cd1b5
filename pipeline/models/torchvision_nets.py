"""torchvision's MobileNetV2 and ResNet18 with a new head (FedRC paper: CIFAR, Tiny-ImageNet).

`pretrained` loads torchvision's ImageNet weights (downloaded into torch's cache) and then
replaces the classifier; grey-scale inputs are repeated to three channels. `norm="group"`
swaps every BatchNorm for GroupNorm, which has no running statistics to average across clients.
"""

from __future__ import annotations

import math

import torch
import torchvision
from torch import nn

from pipeline.common.errors import FedrcError


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with 32 groups where the channels allow it (the usual choice), else fewer."""
    return nn.GroupNorm(math.gcd(32, channels), channels)


class RepeatChannels(nn.Module):
    """Feeds grey-scale images to a network built for RGB."""

    def __init__(self, net: nn.Module, channels: int) -> None:
        super().__init__()
        self.net = net
        self.repeat = 3 // channels if channels == 1 else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.repeat(1, self.repeat, 1, 1) if self.repeat > 1 else x)


def _weights(name: str, pretrained: bool):
    if not pretrained:
        return None
    return {
        "mobilenet_v2": torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1,
        "resnet18": torchvision.models.ResNet18_Weights.IMAGENET1K_V1,
    }[name]


def torchvision_net(
    name: str, channels: int, num_classes: int, pretrained: bool, norm: str
) -> nn.Module:
    if channels not in (1, 3):
        raise FedrcError(f"train.model: {name} takes 1- or 3-channel images, not {channels}")
    weights = _weights(name, pretrained)
    norm_layer = group_norm if norm == "group" else None
    builder = getattr(torchvision.models, name)
    try:
        net = builder(weights=weights, **({"norm_layer": norm_layer} if norm_layer else {}))
    except (OSError, RuntimeError) as e:  # URLError is an OSError
        raise FedrcError(
            f"train.{name}.pretrained: could not download {name}'s ImageNet weights ({e}); "
            "put them in torch's cache ($TORCH_HOME/hub/checkpoints) or use pretrained: false"
        ) from None
    if name == "mobilenet_v2":
        net.classifier[-1] = nn.Linear(net.classifier[-1].in_features, num_classes)
    else:
        net.fc = nn.Linear(net.fc.in_features, num_classes)
    return RepeatChannels(net, channels)
