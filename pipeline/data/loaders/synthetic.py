"""The built-in synthetic dataset: ten classes of 16×16 grey images, no files needed."""

from __future__ import annotations

import numpy as np

from pipeline.data.loaders.raw import RawDataset


def make_synthetic(seed: int = 1234) -> RawDataset:
    """A smooth random prototype per class plus noise.

    Small enough that a test trains in seconds, hard enough that labels must be learned. It
    depends only on `seed`, never on the partition seed, so it is the same dataset everywhere.
    """
    rng = np.random.default_rng(seed)
    num_classes, side, n_train, n_test = 10, 16, 4000, 1000
    coarse = rng.uniform(0, 1, size=(num_classes, 4, 4))
    prototypes = np.kron(coarse, np.ones((4, 4)))  # blocky 16×16 patterns

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.arange(n) % num_classes
        rng.shuffle(labels)
        noise = rng.normal(0, 0.25, size=(n, side, side))
        images = np.clip(prototypes[labels] + noise, 0, 1)
        return (images * 255).round().astype(np.uint8)[..., None], labels.astype(np.int64)

    train_images, train_labels = draw(n_train)
    test_images, test_labels = draw(n_test)
    return RawDataset(
        "synthetic", train_images, train_labels, test_images, test_labels, num_classes, "built-in"
    )
