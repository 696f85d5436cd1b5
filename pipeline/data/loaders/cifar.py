"""CIFAR-10 / CIFAR-100 from torchvision's on-disk layout (pickled batches), uint8 (N, 32, 32, 3).

The file list comes from torchvision's own classes (`cifar-10-batches-py/data_batch_1..5`,
`test_batch`, `batches.meta`; `cifar-100-python/train`, `test`, `meta`), and torchvision
downloads the archive when the files are missing. The batches are read here rather than through
the torchvision constructor, which refuses files whose MD5 is not in its list (re-packed copies,
the small files the tests write); as for Fashion-MNIST, a checksum never triggers a download.
The batches are pickles, as in torchvision: read only files you trust.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset, cleanup_on_failure, download_root

TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _torchvision_class(name: str) -> Any:
    from torchvision.datasets import CIFAR10, CIFAR100

    return CIFAR10 if name == "cifar10" else CIFAR100


def _unpickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise FedrcError(f"{path}: not a readable CIFAR batch ({type(e).__name__})") from None


def _batches(folder: Path, files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name in files:
        path = folder / name
        entry = _unpickle(path)
        try:
            data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = entry["labels"] if "labels" in entry else entry["fine_labels"]
        except (KeyError, ValueError) as e:
            raise FedrcError(f"{path}: not a CIFAR batch ({type(e).__name__}: {e})") from None
        images.append(data.transpose(0, 2, 3, 1))  # CHW rows → NHWC
        labels.append(np.asarray(y, dtype=np.int64))
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)


def _cifar_from(name: str, root: Path) -> RawDataset | None:
    cls = _torchvision_class(name)
    folder = root / cls.base_folder
    files = [f for f, _ in cls.train_list] + [f for f, _ in cls.test_list] + [cls.meta["filename"]]
    if not all((folder / f).is_file() for f in files):
        return None
    meta_path = folder / cls.meta["filename"]
    class_names = _unpickle(meta_path).get(cls.meta["key"])
    if not isinstance(class_names, list):
        raise FedrcError(f"{meta_path}: lacks the class names ({cls.meta['key']})")
    train_images, train_labels = _batches(folder, [f for f, _ in cls.train_list])
    test_images, test_labels = _batches(folder, [f for f, _ in cls.test_list])
    for labels in (train_labels, test_labels):
        if labels.size and not 0 <= labels.min() <= labels.max() < len(class_names):
            raise FedrcError(f"{folder}: labels outside 0..{len(class_names) - 1}")
    return RawDataset(
        name, train_images, train_labels, test_images, test_labels, len(class_names), str(folder)
    )


def load_cifar(name: str, data_root: str | None) -> RawDataset:
    """`cifar10` or `cifar100` from `data_root` (or `data/raw`), else a torchvision download."""
    root = Path(download_root(data_root))
    if (found := _cifar_from(name, root)) is not None:
        return found
    cls = _torchvision_class(name)
    try:
        with cleanup_on_failure(root):
            for train in (True, False):
                cls(str(root), train=train, download=True)
    except Exception as e:  # torchvision raises several kinds of network errors
        raise FedrcError(
            f"--data-root: {TITLES[name]} not found in {root / cls.base_folder} and the download "
            f"failed ({type(e).__name__}); pass --data-root DIR holding {cls.base_folder}/"
        ) from None
    found = _cifar_from(name, root)
    if found is None:
        raise FedrcError(f"--data-root: torchvision download left no {TITLES[name]} in {root}")
    return found
