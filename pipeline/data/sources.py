"""Raw datasets as uint8 image arrays (N, H, W, C) and int64 labels.

Fashion-MNIST is read from IDX files: first `--data-root` (the files themselves or torchvision's
`FashionMNIST/raw/` layout), then Debian's `dataset-fashion-mnist`, then a torchvision download.
The IDX files are parsed directly, so Debian's recompressed `.gz` files (whose MD5s differ from
torchvision's list) are never mistaken for corrupt ones.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import FedrcError

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


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


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): magic, dims, then big-endian data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise FedrcError(f"{path}: cannot read IDX file ({e})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise FedrcError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != expected:
        raise FedrcError(f"{path}: truncated IDX file ({body.size} of {expected} bytes)")
    return body.reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        for candidate in (directory / name, directory / "FashionMNIST" / "raw" / name):
            if candidate.is_file():
                return candidate
    return None


def _fmnist_from(directory: Path) -> RawDataset | None:
    paths = {key: _find_idx(directory, stem) for key, stem in FMNIST_FILES.items()}
    if any(p is None for p in paths.values()):
        return None
    arrays = {key: read_idx(p) for key, p in paths.items()}  # type: ignore[arg-type]
    return RawDataset(
        name="fmnist",
        train_images=arrays["train_images"][..., None],
        train_labels=arrays["train_labels"].astype(np.int64),
        test_images=arrays["test_images"][..., None],
        test_labels=arrays["test_labels"].astype(np.int64),
        num_classes=10,
        source=str(directory),
    )


def load_fmnist(data_root: str | None) -> RawDataset:
    searched = []
    for directory in [Path(data_root)] if data_root else []:
        searched.append(str(directory))
        if (found := _fmnist_from(directory)) is not None:
            return found
    searched.append(str(DEBIAN_FMNIST))
    if (found := _fmnist_from(DEBIAN_FMNIST)) is not None:
        return found
    download_root = Path(data_root or "data/raw")
    try:
        from torchvision.datasets import FashionMNIST

        for train in (True, False):
            FashionMNIST(str(download_root), train=train, download=True)
    except Exception as e:  # torchvision raises several kinds of network errors
        raise FedrcError(
            f"--data-root: Fashion-MNIST not found in {', '.join(searched)} and the download "
            f"failed ({type(e).__name__}); install Debian's dataset-fashion-mnist or pass "
            "--data-root DIR with the four IDX files"
        ) from None
    found = _fmnist_from(download_root)
    if found is None:
        raise FedrcError(f"--data-root: torchvision download left no IDX files in {download_root}")
    return found


def make_synthetic(seed: int = 1234) -> RawDataset:
    """Ten classes of 16×16 grey images: a smooth random prototype per class plus noise.

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


def load_dataset(name: str, data_root: str | None) -> RawDataset:
    if name == "fmnist":
        return load_fmnist(data_root)
    if name == "synthetic":
        return make_synthetic()
    raise FedrcError(f"--dataset: unknown dataset {name!r} (known: fmnist, synthetic)")
