"""scikit-learn's handwritten digits (Alpaydin & Kaynak, UCI 1998): 1,797 grey 8×8 images of
10 classes, shipped inside scikit-learn's wheel, so they load offline."""

from __future__ import annotations

import numpy as np

from pipeline.plugin import DatasetSpec, RawDataset

TEST_SHARE = 0.2  # a seeded, fixed split: the same benchmark on every machine


def load(data_root: str | None) -> RawDataset:
    from sklearn.datasets import load_digits  # scikit-learn: only when the dataset is used

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]  # 0–16 → 0–255
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    test, train = np.split(order, [int(TEST_SHARE * len(labels))])
    return RawDataset(
        "digits", images[train], labels[train], images[test], labels[test], 10, "scikit-learn"
    )


DIGITS = DatasetSpec(
    "digits", "scikit-learn's handwritten digits, 8×8 grey (example plugin)", load, 10, 1
)
