"""The in-memory form of a dataset, shared by every loader."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class RawDataset:
    name: str
    train_images: np.ndarray  # (N, H, W, C) uint8
    train_labels: np.ndarray  # (N,) int64
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    source: str  # where the files came from, recorded in the manifest
    # A dataset whose concepts are its own labelling rules (the drift streams: SINE, SEA, …):
    # rule k maps stored samples (N, H, W, C) uint8 to their labels under concept `native:k`.
    label_rules: tuple[Callable[[np.ndarray], np.ndarray], ...] = ()
    # Columns a client can be named by (`partition.partition_by`, natural ids): name → one value
    # per training sample (FEMNIST's writer_id, Airlines' airline).
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    # The training samples are in time order (a real stream): time steps are cut along it.
    ordered: bool = False

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]


def download_root(data_root: str | None) -> str:
    """Where a torchvision download goes: `--data-root`, else `data/raw`."""
    return data_root or "data/raw"


@contextmanager
def cleanup_on_failure(root: Path) -> Iterator[None]:
    """Around a download: if it fails, remove the folders it created for `root`."""
    first_new = None if root.exists() else root
    while first_new is not None and not first_new.parent.exists():
        first_new = first_new.parent
    try:
        yield
    except BaseException:
        if first_new is not None:
            shutil.rmtree(first_new, ignore_errors=True)
        raise
