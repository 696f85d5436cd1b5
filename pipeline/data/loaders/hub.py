"""`hf:NAME`: any Hugging Face dataset of images (or pixel arrays) and class labels, through the
`datasets` library (the `hf` extra).

Where the files come from: `--data-root` when given, a local copy in any form `datasets` reads:
a folder saved with `save_to_disk`, or a folder in the hub's own layout (Parquet files such as
`data/train-00000-of-00001.parquet`, an ImageFolder tree, CSV / JSON); else the hub itself,
`datasets.load_dataset(NAME)` (its cache first, a download when the machine is online).

Which columns: `image_column` (default: the first `Image` feature, else a column named `image`
or `img`), `label_column` (default: the first `ClassLabel` feature, else `label`), both of the
`split` (default `train`) and `test_split` splits. Without a test split (FEMNIST as Flower
publishes it has only `train`) every fifth sample of the train split is the test set, as for
an image folder; with natural ids (`partition_by`) the held-out clients are unseen ids instead,
so no test set is cut. Images become uint8 arrays of one size (the most common; bilinear
resize) and grey when every image is grey, else RGB: fedrc's form, so every shift applies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset

PREFIX = "hf:"
TEST_EVERY = 5  # without a test split: every fifth train sample is a test sample
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


@dataclass(frozen=True)
class HubColumns:
    """What to read of a Hugging Face dataset (`partition.split`, `test_split`,
    `image_column`, `label_column`, `partition_by`); None: the default the module states."""

    split: str | None = None
    test_split: str | None = None
    image: str | None = None
    label: str | None = None
    partition_by: str | None = None


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise FedrcError(
            "--dataset hf:…: the datasets library is not installed; pip install 'fedrc[hf]'"
        ) from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _open(name: str, data_root: str | None) -> Any:
    """The DatasetDict of `name`: the local copy in `data_root`, else from the hub."""
    datasets = _datasets()
    where = f"--data-root: {data_root}" if data_root else f"--dataset {PREFIX}{name}"
    try:
        if data_root is None:
            found = datasets.load_dataset(name)
        else:
            root = Path(data_root)
            if not root.exists():
                raise FedrcError(f"--data-root: {root} does not exist")
            saved = (root / "dataset_dict.json").is_file() or (root / "state.json").is_file()
            found = (
                datasets.load_from_disk(str(root)) if saved else datasets.load_dataset(str(root))
            )
    except FedrcError:
        raise
    except Exception as e:  # datasets raises many kinds: missing files, no network, bad format
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise FedrcError(f"{where}: cannot load the dataset ({reason})") from None
    if isinstance(found, datasets.Dataset):  # a saved single split
        found = datasets.DatasetDict({"train": found})
    return found


def _column(features: Any, wanted: str | None, kinds: tuple[str, ...], names: tuple[str, ...],
            option: str, split: Any) -> str:  # fmt: skip
    """`wanted`, or the first feature of one of `kinds`, else the first column in `names`."""
    if wanted is not None:
        if wanted not in features:
            raise FedrcError(f"{option}: no column {wanted!r} (columns: {', '.join(features)})")
        return wanted
    for column, feature in features.items():
        if type(feature).__name__ in kinds:
            return column
    for column in names:
        if column in features:
            return column
    raise FedrcError(
        f"{option}: cannot tell which column it is in split {split!r} (columns: "
        f"{', '.join(features)}); name it"
    )


def _pictures(values: Sequence[Any], column: str) -> list[Any]:
    """PIL images from an Image column read undecoded ({bytes, path} each)."""
    from PIL import Image, UnidentifiedImageError

    opened = []
    for i, value in enumerate(values):
        try:
            source = BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
            opened.append(Image.open(source))
        except (OSError, UnidentifiedImageError, TypeError, KeyError) as e:
            raise FedrcError(
                f"partition.image_column: {column}[{i}]: not an image ({type(e).__name__})"
            ) from None
    return opened


def to_uint8(images: list[Any]) -> np.ndarray:
    """PIL images as one uint8 array (N, H, W, C): the most common size, grey when all are."""
    from PIL import Image

    sizes = Counter(image.size for image in images)
    width, height = sizes.most_common(1)[0][0] if images else (1, 1)
    grey = all(image.mode in GREY_MODES for image in images)
    mode, channels = ("L", 1) if grey else ("RGB", 3)
    out = np.empty((len(images), height, width, channels), dtype=np.uint8)
    for i, image in enumerate(images):
        pixels = image.convert(mode)
        if pixels.size != (width, height):
            pixels = pixels.resize((width, height), Image.Resampling.BILINEAR)
        out[i] = np.asarray(pixels).reshape(height, width, channels)
    return out


def _arrays(values: Sequence[Any], column: str) -> np.ndarray:
    """A column of pixel arrays (H × W or H × W × C, 0..255) as uint8 (N, H, W, C)."""
    try:
        array = np.asarray(values)
    except ValueError:
        raise FedrcError(f"partition.image_column: {column}: arrays of different shapes") from None
    if array.ndim not in (3, 4) or not np.issubdtype(array.dtype, np.number):
        raise FedrcError(
            f"partition.image_column: {column}: expected images or H×W(×C) pixel arrays"
        )
    if array.min(initial=0) < 0 or array.max(initial=0) > 255:
        raise FedrcError(f"partition.image_column: {column}: pixel values outside 0..255")
    return (array if array.ndim == 4 else array[..., None]).astype(np.uint8)


def _images(splits: list[Any], column: str, datasets: Any) -> list[np.ndarray]:
    """Each split's images, all in one size and mode (`to_uint8`) or as given (pixel arrays)."""
    if isinstance(splits[0].features[column], datasets.Image):
        raw = [s.cast_column(column, datasets.Image(decode=False))[column] for s in splits]
        every = to_uint8(_pictures([value for values in raw for value in values], column))
    else:
        every = _arrays([v for s in splits for v in s.with_format("numpy")[column]], column)
    return np.split(every, np.cumsum([len(s) for s in splits])[:-1])


def _labels(splits: list[Any], column: str, datasets: Any) -> tuple[list[np.ndarray], int]:
    """Each split's labels as 0..C−1 and C: a ClassLabel's own numbering, else the sorted
    distinct values of all the splits."""
    feature = splits[0].features[column]
    if isinstance(feature, datasets.ClassLabel):
        return [np.asarray(s[column], dtype=np.int64) for s in splits], feature.num_classes
    values = [np.asarray(s[column]) for s in splits]
    classes, codes = np.unique(np.concatenate(values), return_inverse=True)
    cuts = np.cumsum([v.size for v in values])[:-1]
    return [c.astype(np.int64) for c in np.split(codes, cuts)], int(classes.size)


def load_hub(name: str, data_root: str | None, columns: HubColumns) -> RawDataset:
    """The train and test images and labels of `hf:name` (see the module's docstring)."""
    datasets = _datasets()
    found = _open(name, data_root)
    split_name = columns.split or "train"
    if split_name not in found:
        raise FedrcError(f"partition.split: no split {split_name!r} (splits: {', '.join(found)})")
    train = found[split_name]
    test_name = columns.test_split or ("test" if "test" in found else None)
    if test_name is not None and test_name not in found:
        raise FedrcError(
            f"partition.test_split: no split {test_name!r} (splits: {', '.join(found)})"
        )
    features = train.features
    image = _column(features, columns.image, ("Image",), ("image", "img"),
                    "partition.image_column", split_name)  # fmt: skip
    label = _column(features, columns.label, ("ClassLabel",), ("label",),
                    "partition.label_column", split_name)  # fmt: skip
    ids = {}
    if columns.partition_by is not None:
        by = _column(
            train.features, columns.partition_by, (), (), "partition.partition_by", split_name
        )
        ids[by] = np.asarray(train[by])
    if test_name is not None:
        test = found[test_name]
        for column in (image, label):
            if column not in test.features:
                raise FedrcError(f"partition.test_split: {test_name!r} has no column {column!r}")
    elif columns.partition_by is None:  # every fifth sample, as for an image folder
        every = np.arange(len(train))
        test = train.select(every[TEST_EVERY - 1 :: TEST_EVERY])
        train = train.select(np.delete(every, every[TEST_EVERY - 1 :: TEST_EVERY]))
    else:
        test = train.select([])
    (train_labels, test_labels), num_classes = _labels([train, test], label, datasets)
    if num_classes < 2:
        raise FedrcError(
            f"partition.label_column: {label} holds {num_classes} class; at least 2 needed"
        )
    train_images, test_images = _images([train, test], image, datasets)
    source = f"{PREFIX}{name}" + (f" from {Path(data_root).resolve()}" if data_root else "")
    return RawDataset(
        f"{PREFIX}{name}",
        train_images,
        train_labels,
        test_images,
        test_labels,
        num_classes,
        source,
        columns=ids,
    )
