"""Raw datasets by name, as uint8 image arrays (N, H, W, C) and int64 labels.

Each loader reads local files first (`--data-root`, system folders) and downloads through
torchvision only when they are missing; a failure is one FedrcError naming `--data-root`.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.data.loaders.cifar import load_cifar
from pipeline.data.loaders.idx import load_idx_dataset
from pipeline.data.loaders.raw import RawDataset
from pipeline.data.loaders.synthetic import make_synthetic
from pipeline.data.loaders.tiny_imagenet import load_tiny_imagenet
from pipeline.errors import FedrcError

__all__ = ["LOADERS", "NUM_CLASSES", "RawDataset", "load_dataset"]

LOADERS: dict[str, Callable[[str | None], RawDataset]] = {
    "fmnist": lambda root: load_idx_dataset("fmnist", root),
    "mnist": lambda root: load_idx_dataset("mnist", root),
    "cifar10": lambda root: load_cifar("cifar10", root),
    "cifar100": lambda root: load_cifar("cifar100", root),
    "tinyimagenet": load_tiny_imagenet,
    "synthetic": lambda root: make_synthetic(),
}
NUM_CLASSES = {
    "fmnist": 10,
    "mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
    "tinyimagenet": 200,
    "synthetic": 10,
}


def load_dataset(name: str, data_root: str | None) -> RawDataset:
    if name not in LOADERS:
        raise FedrcError(f"--dataset: unknown dataset {name!r} (known: {', '.join(LOADERS)})")
    raw = LOADERS[name](data_root)
    if raw.num_classes != NUM_CLASSES[name]:
        raise FedrcError(
            f"--data-root: {raw.source} holds {raw.num_classes} classes, {name} has "
            f"{NUM_CLASSES[name]}"
        )
    return raw
