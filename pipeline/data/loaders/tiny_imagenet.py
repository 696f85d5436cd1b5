"""Tiny-ImageNet (200 classes, 64×64 RGB) from the standard `tiny-imagenet-200/` folder.

Layout: `wnids.txt`, `train/<wnid>/images/*.JPEG` (500 a class), `val/images/*.JPEG` with
`val/val_annotations.txt` (file, wnid, box). The labelled validation set is the test set (the
official test set has no labels). Classes are the sorted wnids. torchvision has no class for it,
so the archive is fetched with torchvision's download helper when the folder is missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset, cleanup_on_failure, download_root

FOLDER = "tiny-imagenet-200"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
SIDE = 64


def _read_images(paths: list[Path]) -> np.ndarray:
    images = np.empty((len(paths), SIDE, SIDE, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))  # a few Tiny-ImageNet images are grey
        except (OSError, UnidentifiedImageError) as e:
            raise FedrcError(f"{path}: cannot read image ({type(e).__name__})") from None
        if pixels.shape != (SIDE, SIDE, 3):
            raise FedrcError(f"{path}: expected a {SIDE}×{SIDE} image, got {pixels.shape[:2]}")
        images[i] = pixels
    return images


def _tiny_from(folder: Path) -> RawDataset | None:
    annotations = folder / "val" / "val_annotations.txt"
    if not (folder / "wnids.txt").is_file() or not annotations.is_file():
        return None
    wnids = sorted(set((folder / "wnids.txt").read_text().split()))
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_labels = [], []
    for wnid in wnids:
        files = sorted((folder / "train" / wnid / "images").glob("*.JPEG"))
        if not files:
            raise FedrcError(f"{folder / 'train' / wnid / 'images'}: no JPEG images")
        train_paths += files
        train_labels += [index[wnid]] * len(files)
    test_paths, test_labels = [], []
    for line_no, line in enumerate(annotations.read_text().splitlines(), 1):
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in index:
            raise FedrcError(
                f"{annotations}:{line_no}: expected 'file<TAB>wnid…' with a known wnid"
            )
        test_paths.append(folder / "val" / "images" / fields[0])
        test_labels.append(index[fields[1]])
    return RawDataset(
        "tinyimagenet",
        _read_images(train_paths),
        np.asarray(train_labels, dtype=np.int64),
        _read_images(test_paths),
        np.asarray(test_labels, dtype=np.int64),
        len(wnids),
        str(folder),
    )


def load_tiny_imagenet(data_root: str | None) -> RawDataset:
    """From `data_root/tiny-imagenet-200` (or `data_root` itself), else a download."""
    root = Path(download_root(data_root))
    for folder in (root / FOLDER, root):
        if (found := _tiny_from(folder)) is not None:
            return found
    try:
        from torchvision.datasets.utils import download_and_extract_archive

        with cleanup_on_failure(root):
            download_and_extract_archive(URL, str(root), md5=MD5)
    except Exception as e:  # network errors of several kinds
        raise FedrcError(
            f"--data-root: Tiny-ImageNet not found in {root / FOLDER} and the download failed "
            f"({type(e).__name__}); pass --data-root DIR holding {FOLDER}/"
        ) from None
    found = _tiny_from(root / FOLDER)
    if found is None:
        raise FedrcError(f"--data-root: the download left no {FOLDER}/ in {root}")
    return found
