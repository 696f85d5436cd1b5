"""Models by name (`MODELS`: built-in or a plugin), built for a dataset's image shape and number
of classes. The specs and their settings (`settings.py`) are read without torch (`fedrc info`);
a model's code, and torch, are imported when it is built."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.common.errors import FedrcError
from pipeline.common.registry import Registry
from pipeline.common.settings import Settings
from pipeline.models.settings import CNNSettings, MLPSettings, TorchvisionSettings

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """A model a run can name: `build(image_shape (H, W, C), num_classes, settings)` → module.

    A plugin exports one instance (entry point group `fedrc.models`); `settings` is its options'
    dataclass (`--set KEY=VALUE`, or `train: {<name>: {KEY: VALUE}}` in params.yaml)."""

    name: str
    summary: str
    build: Callable[[tuple[int, int, int], int, Any], nn.Module]
    settings: type[Settings] = Settings


def _cnn(shape: tuple[int, int, int], num_classes: int, settings: CNNSettings) -> nn.Module:
    from pipeline.models.cnn import FmnistCNN

    height, width, channels = shape
    return FmnistCNN(channels, height, width, num_classes, settings.normalize)


def _mlp(shape: tuple[int, int, int], num_classes: int, settings: MLPSettings) -> nn.Module:
    from pipeline.models.mlp import build_mlp

    return build_mlp(shape, num_classes, settings)


def _torchvision(name: str) -> Callable[[tuple[int, int, int], int, Any], nn.Module]:
    def build(shape: tuple[int, int, int], num_classes: int, settings: Any) -> nn.Module:
        from pipeline.models.torchvision_nets import torchvision_net  # 1–2 s to import

        return torchvision_net(name, shape[2], num_classes, settings.pretrained, settings.norm)

    return build


BUILT_IN = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "cnn", "The FedRC paper's FMNIST CNN (2 conv + 2 linear layers)", _cnn, CNNSettings
        ),
        ModelSpec(
            "mobilenet_v2",
            "torchvision's MobileNetV2 (the paper's CIFAR model)",
            _torchvision("mobilenet_v2"),
            TorchvisionSettings,
        ),
        ModelSpec(
            "resnet18", "torchvision's ResNet-18", _torchvision("resnet18"), TorchvisionSettings
        ),
        ModelSpec(
            "mlp",
            "A perceptron for any input: FedDrift's fnn, one hidden layer 2× the input "
            "(Jothimurugesan et al., AISTATS 2023); the drift streams' model",
            _mlp,
            MLPSettings,
        ),
    )
}


def _not_a_model(obj: Any) -> str | None:
    return None if isinstance(obj, ModelSpec) else f"{obj!r} is not a pipeline.models.ModelSpec"


MODELS = Registry("model", "--model", lambda: BUILT_IN, _not_a_model)


# Held while torch's global generator draws a model's initial weights: `initial_models` seeds it
# and draws under this lock, so that runs sharing a process (`fedrc sweep --together`, a thread
# each) never draw from each other's seeded stream.
GLOBAL_RNG = threading.RLock()


def build_model(
    image_shape: tuple[int, int, int],
    num_classes: int,
    name: str = "cnn",
    settings: Settings | None = None,
) -> nn.Module:
    """The model `name` with `settings` (its defaults when None)."""
    spec = MODELS.get(name)
    if not isinstance(settings, spec.settings):
        settings = spec.settings()
    try:
        settings.validate()
    except FedrcError as e:
        raise FedrcError(f"train.{name}.{e}") from None
    try:
        with GLOBAL_RNG:
            model = spec.build(image_shape, num_classes, settings)
        probe(model, image_shape)
    except RuntimeError as e:  # a kernel larger than what is left of the image, say
        height, width, channels = image_shape
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise FedrcError(
            f"train.model: {name} does not fit {height}×{width} images with {channels} "
            f"channel(s) ({reason}); choose another model (mlp takes any shape) or larger images"
        ) from None
    return model


def probe(model: nn.Module, image_shape: tuple[int, int, int]) -> None:
    """One forward pass of a blank image, in eval mode and without gradients, so nothing is
    drawn from the random generator and no statistic moves; each module's mode is restored."""
    import torch

    height, width, channels = image_shape
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, channels, height, width))
    finally:
        for module, training in modes:
            module.training = training
