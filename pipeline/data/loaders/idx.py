"""MNIST and Fashion-MNIST from IDX files (uint8 images (N, 28, 28, 1), int64 labels).

Search order: `--data-root` alone when it is given (the four files themselves or torchvision's
`MNIST/raw/` / `FashionMNIST/raw/` layout), else, for Fashion-MNIST, Debian's
`dataset-fashion-mnist`; then a torchvision download (into `--data-root`, else `data/raw`).
The IDX files are parsed directly, so Debian's recompressed `.gz` files (whose MD5s differ
from torchvision's list) are never mistaken for corrupt ones.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset, cleanup_on_failure, download_root

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# name → (torchvision class and raw/ subfolder, title for messages, system folders to search)
IDX_DATASETS: dict[str, tuple[str, str, tuple[Path, ...]]] = {
    "fmnist": ("FashionMNIST", "Fashion-MNIST", (DEBIAN_FMNIST,)),
    "mnist": ("MNIST", "MNIST", ()),
}


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


def _find_idx(directory: Path, subfolder: str, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        for candidate in (directory / name, directory / subfolder / "raw" / name):
            if candidate.is_file():
                return candidate
    return None


def _idx_from(name: str, directory: Path) -> RawDataset | None:
    subfolder = IDX_DATASETS[name][0]
    paths = {key: _find_idx(directory, subfolder, stem) for key, stem in IDX_FILES.items()}
    if any(p is None for p in paths.values()):
        return None
    arrays = {key: read_idx(p) for key, p in paths.items()}  # type: ignore[arg-type]
    return RawDataset(
        name=name,
        train_images=arrays["train_images"][..., None],
        train_labels=arrays["train_labels"].astype(np.int64),
        test_images=arrays["test_images"][..., None],
        test_labels=arrays["test_labels"].astype(np.int64),
        num_classes=10,
        source=str(directory),
    )


def _download(name: str, root: Path) -> None:
    import torchvision.datasets

    cls = getattr(torchvision.datasets, IDX_DATASETS[name][0])
    for train in (True, False):
        cls(str(root), train=train, download=True)


def load_idx_dataset(name: str, data_root: str | None) -> RawDataset:
    """`fmnist` or `mnist` from local IDX files, else a torchvision download."""
    _, title, system = IDX_DATASETS[name]
    # A --data-root given is the one place searched: a system copy found instead would be
    # another dataset than the one the run records the path of.
    searched = [Path(data_root)] if data_root else list(system)
    for directory in searched:
        if (found := _idx_from(name, directory)) is not None:
            return found
    root = Path(download_root(data_root))
    try:
        with cleanup_on_failure(root):
            _download(name, root)
    except Exception as e:  # torchvision raises several kinds of network errors
        places = ", ".join(str(d) for d in searched)
        where = f"in {places}" if places else "(no --data-root given)"
        raise FedrcError(
            f"--data-root: {title} not found {where} and the download failed "
            f"({type(e).__name__}); pass --data-root DIR with the four IDX files"
        ) from None
    found = _idx_from(name, root)
    if found is None:
        raise FedrcError(f"--data-root: torchvision download left no IDX files in {root}")
    return found


def load_fmnist(data_root: str | None) -> RawDataset:
    return load_idx_dataset("fmnist", data_root)
