"""The in-memory form of a dataset, shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]


def download_root(data_root: str | None) -> str:
    """Where a torchvision download goes: `--data-root`, else `data/raw`."""
    return data_root or "data/raw"
