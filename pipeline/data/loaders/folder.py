"""`folder`: any image collection on disk, as torchvision's ImageFolder tree.

`--data-root TREE` holds a sub-folder per class (named after the class, files of any format PIL
reads). With `TREE/train/` and `TREE/test/` (the same class folders in each) those are the train
and test sets; otherwise every fifth image of each class, in file-name order, is the test set
(deterministic, so the same tree gives the same benchmark). Images are converted to one size, the
most common one in the tree (bilinear resize), and to grey when every image is grey, else RGB.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset

TEST_EVERY = 5  # without train/ and test/: every fifth image of a class is a test image
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


def unreadable(path: str, error: Exception) -> FedrcError:
    return FedrcError(f"--data-root: {path}: cannot read image ({type(error).__name__})")


def _tree(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, [(path, class index)]) of an ImageFolder tree, via torchvision."""
    from torchvision.datasets import ImageFolder  # torchvision: 1–2 s to import

    try:
        found = ImageFolder(str(root), allow_empty=False)
    except (FileNotFoundError, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedrcError(f"--data-root: {root}: not an image folder tree ({reason})") from None
    return list(found.classes), list(found.samples)


def _sizes(samples: list[tuple[str, int]]) -> tuple[tuple[int, int], bool]:
    """The most common (width, height) and whether every image is grey (headers only)."""
    sizes: Counter[tuple[int, int]] = Counter()
    grey = True
    for path, _ in samples:
        try:
            with Image.open(path) as image:
                sizes[image.size] += 1
                grey = grey and image.mode in GREY_MODES
        except (OSError, UnidentifiedImageError) as e:
            raise FedrcError(
                f"--data-root: {path}: cannot read image ({type(e).__name__})"
            ) from None
    return sizes.most_common(1)[0][0], grey


def _read(samples: list[tuple[str, int]], size: tuple[int, int], grey: bool) -> np.ndarray:
    mode, channels = ("L", 1) if grey else ("RGB", 3)
    images = np.empty((len(samples), size[1], size[0], channels), dtype=np.uint8)
    for i, (path, _) in enumerate(samples):
        try:
            with Image.open(path) as image:
                pixels = image.convert(mode)
                if pixels.size != size:
                    pixels = pixels.resize(size, Image.Resampling.BILINEAR)
                images[i] = np.asarray(pixels).reshape(size[1], size[0], channels)
        except (OSError, UnidentifiedImageError) as e:
            raise FedrcError(
                f"--data-root: {path}: cannot read image ({type(e).__name__})"
            ) from None
    return images


def load_folder(data_root: str | None) -> RawDataset:
    if data_root is None:
        raise FedrcError("--data-root: the folder dataset reads an image tree; give its folder")
    root = Path(data_root)
    if not root.is_dir():
        raise FedrcError(f"--data-root: {root} is not a folder")
    if (root / "train").is_dir() and (root / "test").is_dir():
        classes, train = _tree(root / "train")
        test_classes, test = _tree(root / "test")
        if test_classes != classes:
            raise FedrcError(
                f"--data-root: {root / 'test'} has other class folders than {root / 'train'} "
                f"({', '.join(sorted(set(classes) ^ set(test_classes)))})"
            )
    else:
        classes, samples = _tree(root)
        seen: Counter[int] = Counter()
        train, test = [], []
        for sample in samples:  # ImageFolder lists each class's files in name order
            seen[sample[1]] += 1
            (test if seen[sample[1]] % TEST_EVERY == 0 else train).append(sample)
    if len(classes) < 2:
        raise FedrcError(f"--data-root: {root} has {len(classes)} class folder; at least 2 needed")
    if not test:
        raise FedrcError(f"--data-root: {root}: no test images (fewer than {TEST_EVERY} a class)")
    size, grey = _sizes(train + test)
    return RawDataset(
        "folder",
        _read(train, size, grey),
        np.asarray([label for _, label in train], dtype=np.int64),
        _read(test, size, grey),
        np.asarray([label for _, label in test], dtype=np.int64),
        len(classes),
        f"folder {root.resolve()}",
    )
