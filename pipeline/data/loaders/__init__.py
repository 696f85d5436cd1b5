"""Datasets by name (`DATASETS`: built-in or a plugin; `hf:NAME` any Hugging Face dataset), as
uint8 image arrays (N, H, W, C) and int64 labels; the tabular drift streams (`streams`, and the
recorded ones, `recorded`) store feature vectors as (1, d, 1) images.

Each built-in loader reads local files first (`--data-root`, system folders) and downloads
(torchvision, the hub, the stream's own address) only when they are missing; a failure is one
FedrcError naming `--data-root`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.registry import Registry
from pipeline.data.loaders.cifar import load_cifar
from pipeline.data.loaders.folder import load_folder
from pipeline.data.loaders.hub import PREFIX, HubColumns, load_hub
from pipeline.data.loaders.idx import load_idx_dataset
from pipeline.data.loaders.raw import RawDataset
from pipeline.data.loaders.recorded import RECORDED, load_recorded
from pipeline.data.loaders.spec import DatasetSpec
from pipeline.data.loaders.streams import load_stream
from pipeline.data.loaders.synthetic import make_synthetic
from pipeline.data.loaders.tiny_imagenet import load_tiny_imagenet

__all__ = [
    "DATASETS",
    "PREFIX",
    "DatasetSpec",
    "HubColumns",
    "RawDataset",
    "dataset_spec",
    "load_dataset",
]

FEDDRIFT = "FedDrift, Jothimurugesan et al., AISTATS 2023"
STREAM_SUMMARIES = {  # tabular drift streams (docs/streams.md), concepts native:0, native:1, …
    "sine": f"SINE drift stream: 2 features, 4 concepts (below sin, SINE2, flips) ({FEDDRIFT})",
    "circle": f"CIRCLE drift stream: 2 features, 2 concepts (outside a circle) ({FEDDRIFT})",
    "sea": "SEA drift stream: 3 features, 4 concepts (f1 + f2 > 8, 9, 7, 9.5) (Street & Kim, "
    "KDD 2001)",
    "stagger": "STAGGER drift stream: size, colour, shape, 3 concepts (Schlimmer & Granger, "
    "Machine Learning 1986)",
    "agrawal": "Agrawal drift stream: 9 loan attributes, 10 concepts (Agrawal et al., IEEE TKDE "
    "1993)",
    "hyperplane": "Hyperplane drift stream: 10 features, 4 concepts (w·x ≥ Σw/2) (Hulten et al., "
    "KDD 2001)",
}


def _stream(name: str) -> DatasetSpec:
    return DatasetSpec(
        name,
        STREAM_SUMMARIES[name],
        lambda root: load_stream(name),
        2,
        1,
        tabular=True,
        reads_files=False,
    )


def _recorded(name: str) -> DatasetSpec:
    spec = RECORDED[name]
    return DatasetSpec(
        name,
        spec.summary,
        lambda root: load_recorded(name, root),
        len(spec.classes),
        1,
        tabular=True,
    )


def _hub(root: str | None) -> RawDataset:
    raise FedrcError(f"--dataset: give the dataset's name after {PREFIX}, e.g. {PREFIX}mnist")


HUB = DatasetSpec(
    f"{PREFIX}NAME",
    "Any Hugging Face dataset of images and labels (`datasets`, the hf extra): hub id or local "
    "copy (--data-root); split, test_split, image_column, label_column",
    _hub,
)


BUILT_IN = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "fmnist",
            "Fashion-MNIST, 28×28 grey, 10 classes (Xiao et al., 2017)",
            lambda root: load_idx_dataset("fmnist", root),
            10,
            1,
            shape=(28, 28, 1),
        ),
        DatasetSpec(
            "mnist",
            "MNIST, 28×28 grey, 10 classes (LeCun et al., 1998)",
            lambda root: load_idx_dataset("mnist", root),
            10,
            1,
            shape=(28, 28, 1),
        ),
        DatasetSpec(
            "cifar10",
            "CIFAR-10, 32×32 colour, 10 classes (Krizhevsky, 2009)",
            lambda root: load_cifar("cifar10", root),
            10,
            3,
            shape=(32, 32, 3),
        ),
        DatasetSpec(
            "cifar100",
            "CIFAR-100, 32×32 colour, 100 classes (Krizhevsky, 2009)",
            lambda root: load_cifar("cifar100", root),
            100,
            3,
            shape=(32, 32, 3),
        ),
        DatasetSpec(
            "tinyimagenet",
            "Tiny-ImageNet, 64×64 colour, 200 classes (Le & Yang, 2015)",
            load_tiny_imagenet,
            200,
            3,
            shape=(64, 64, 3),
        ),
        DatasetSpec(
            "synthetic",
            "Built-in blocky 16×16 grey patterns, 10 classes (tests and demos, no files)",
            lambda root: make_synthetic(),
            10,
            1,
            reads_files=False,
            shape=(16, 16, 1),
        ),
        DatasetSpec(
            "folder",
            "Your images: an ImageFolder tree at --data-root (a sub-folder per class)",
            load_folder,
        ),
        *(_stream(name) for name in STREAM_SUMMARIES),
        *(_recorded(name) for name in RECORDED),
        HUB,
    )
}


def shape_problem(name: str, shape: tuple[int, ...], num_classes: int) -> str | None:
    """What a benchmark of the built-in dataset `name` cannot hold (images of another shape,
    another number of classes; tabular rows not as (1, d, 1)), or None (a plugin's: it tells)."""
    spec = BUILT_IN.get(name)
    if spec is None:
        return None
    if spec.num_classes is not None and num_classes != spec.num_classes:
        return f"num_classes {num_classes}, but {name} has {spec.num_classes}"
    if spec.shape is not None and tuple(shape) != spec.shape:
        return f"image_shape {list(shape)}, but {name}'s images are {list(spec.shape)}"
    if spec.tabular and (shape[0] != 1 or shape[2] != 1):
        return f"image_shape {list(shape)}, but {name}'s rows are stored as [1, d, 1]"
    if spec.channels is not None and shape[2] != spec.channels:
        return f"image_shape {list(shape)}, but {name}'s images have {spec.channels} channels"
    return None


def check_data_root(spec: DatasetSpec, data_root: str | None) -> None:
    """A `--data-root` the dataset would ignore is refused: the run would record a path its
    data did not come from."""
    if data_root is not None and not spec.reads_files:
        raise FedrcError(
            f"--data-root: {spec.name} reads no files (its samples are generated); leave "
            "--data-root out"
        )


def _not_a_dataset(obj: Any) -> str | None:
    if isinstance(obj, DatasetSpec):
        return None
    return f"{obj!r} is not a pipeline.data.loaders.DatasetSpec"


DATASETS = Registry("dataset", "--dataset", lambda: BUILT_IN, _not_a_dataset)


def dataset_spec(name: str, option: str = "partition.dataset") -> DatasetSpec:
    """The dataset called `name`: `hf:NAME` (any of the hub's), a built-in or a plugin."""
    if name.startswith(PREFIX):
        return dataclasses.replace(HUB, name=name)
    return DATASETS.get(name, option)


def load_dataset(name: str, data_root: str | None, hub: HubColumns | None = None) -> RawDataset:
    """The dataset's arrays; `hub`: what to read of an `hf:` dataset."""
    if name.startswith(PREFIX):
        if name == HUB.name or len(name) == len(PREFIX):
            _hub(data_root)
        return load_hub(name[len(PREFIX) :], data_root, hub or HubColumns())
    spec = DATASETS.get(name, "partition.dataset")
    check_data_root(spec, data_root)
    raw = spec.load(data_root)
    if spec.num_classes is not None and raw.num_classes != spec.num_classes:
        raise FedrcError(
            f"--data-root: {raw.source} holds {raw.num_classes} classes, {name} has "
            f"{spec.num_classes}"
        )
    return raw
