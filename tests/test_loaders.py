"""Each loader on tiny files the test writes in the dataset's real on-disk format."""

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets
import torchvision.datasets.utils
from PIL import Image

from pipeline.common.errors import FedrcError
from pipeline.data.loaders import load_dataset
from pipeline.data.loaders.tiny_imagenet import load_tiny_imagenet

RNG = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_from_torchvision_layout(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    write_idx(raw / "train-images-idx3-ubyte.gz", RNG.integers(0, 255, (20, 28, 28)))
    write_idx(raw / "train-labels-idx1-ubyte.gz", np.arange(20) % 10)
    write_idx(raw / "t10k-images-idx3-ubyte.gz", RNG.integers(0, 255, (10, 28, 28)))
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", np.arange(10))
    data = load_dataset("mnist", str(tmp_path))
    assert data.name == "mnist" and data.image_shape == (28, 28, 1)
    assert data.test_labels.tolist() == list(range(10))


def _pickle(path: Path, obj: dict) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _cifar_rows(n: int) -> np.ndarray:
    return RNG.integers(0, 255, (n, 3072), dtype=np.uint8)  # R plane, G plane, B plane


def test_cifar10_pickled_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rows = []
    for i in range(1, 6):
        rows.append(_cifar_rows(4))
        _pickle(folder / f"data_batch_{i}", {"data": rows[-1], "labels": [i, 0, 9, 3]})
    _pickle(folder / "test_batch", {"data": _cifar_rows(2), "labels": [1, 2]})
    _pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    data = load_dataset("cifar10", str(tmp_path))
    assert data.train_images.shape == (20, 32, 32, 3) and data.num_classes == 10
    assert data.train_labels[:4].tolist() == [1, 0, 9, 3] and data.test_labels.tolist() == [1, 2]
    first = rows[0][0].reshape(3, 32, 32)
    for channel in range(3):  # CHW rows become HWC images
        np.testing.assert_array_equal(data.train_images[0, :, :, channel], first[channel])


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    _pickle(folder / "train", {"data": _cifar_rows(6), "fine_labels": [99, 0, 5, 5, 1, 2]})
    _pickle(folder / "test", {"data": _cifar_rows(2), "fine_labels": [7, 8]})
    _pickle(folder / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})
    data = load_dataset("cifar100", str(tmp_path))
    assert data.num_classes == 100 and data.train_labels.tolist() == [99, 0, 5, 5, 1, 2]


def _no_network(*args, **kwargs):
    raise OSError("offline")


@pytest.mark.parametrize(
    ("name", "patch"),
    [
        ("cifar10", (torchvision.datasets.CIFAR10, "download")),
        ("mnist", (torchvision.datasets.MNIST, "download")),
        ("tinyimagenet", (torchvision.datasets.utils, "download_and_extract_archive")),
    ],
)
def test_missing_files_and_failed_download_is_one_error(
    name: str, patch: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(*patch, _no_network)
    with pytest.raises(FedrcError, match=r"^--data-root: .* not found in .*download failed"):
        load_dataset(name, str(tmp_path))


def test_tiny_imagenet_folder(tmp_path: Path) -> None:
    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n02", "n01", "n03"]  # classes are the sorted wnids
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for wnid in wnids:
        folder = root / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for j in range(2):
            pixels = RNG.integers(0, 255, (64, 64, 3), dtype=np.uint8)
            image = Image.fromarray(pixels[..., 0] if j else pixels)  # one grey image a class
            image.save(folder / f"{wnid}_{j}.JPEG")
    lines = []
    for j, wnid in enumerate(["n03", "n01"]):
        Image.fromarray(RNG.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
            root / "val" / "images" / f"val_{j}.JPEG"
        )
        lines.append(f"val_{j}.JPEG\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    data = load_tiny_imagenet(str(tmp_path))
    assert data.train_images.shape == (6, 64, 64, 3) and data.train_images.dtype == np.uint8
    assert data.train_labels.tolist() == [0, 0, 1, 1, 2, 2] and data.test_labels.tolist() == [2, 0]
    assert data.num_classes == 3


def write_tree(root: Path, classes: dict[str, int], sizes=((20, 16), (24, 24)), mode="RGB"):
    """An ImageFolder tree: `classes[name]` PNG/JPEG files per class, of mixed sizes."""
    for c, (name, count) in enumerate(classes.items()):
        (root / name).mkdir(parents=True)
        for i in range(count):
            size = sizes[i % len(sizes)]
            pixels = RNG.integers(0, 255, (size[1], size[0], 3)).astype(np.uint8)
            pixels[..., c % 3] = 200  # a class colour
            image = Image.fromarray(pixels).convert(mode)
            image.save(root / name / f"img{i:02d}.{'png' if i % 2 else 'jpg'}")


def test_folder_dataset_reads_an_image_folder_tree(tmp_path: Path) -> None:
    write_tree(
        tmp_path / "tree", {"cat": 12, "dog": 10, "owl": 11}, sizes=((20, 16),) * 2 + ((24, 24),)
    )
    data = load_dataset("folder", str(tmp_path / "tree"))
    # classes by folder name; every fifth file of a class (name order) is a test image
    assert data.num_classes == 3 and data.image_shape == (16, 20, 3)  # the most common size
    assert np.bincount(data.test_labels).tolist() == [2, 2, 2]
    assert np.bincount(data.train_labels).tolist() == [10, 8, 9]
    assert data.train_images.dtype == np.uint8 and data.source.startswith("folder ")

    write_tree(tmp_path / "grey" / "train", {"a": 3, "b": 3}, mode="L")
    write_tree(tmp_path / "grey" / "test", {"a": 2, "b": 1}, mode="L")
    grey = load_dataset("folder", str(tmp_path / "grey"))  # train/ and test/ as given
    assert grey.image_shape[-1] == 1 and grey.test_labels.tolist() == [0, 0, 1]


def test_folder_dataset_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(FedrcError, match=r"^--data-root: .*give its folder"):
        load_dataset("folder", None)
    with pytest.raises(FedrcError, match=r"^--data-root: .* is not a folder"):
        load_dataset("folder", str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedrcError, match=r"^--data-root: .*not an image folder tree"):
        load_dataset("folder", str(tmp_path / "empty"))
    write_tree(tmp_path / "one", {"only": 10})
    with pytest.raises(FedrcError, match=r"1 class folder; at least 2"):
        load_dataset("folder", str(tmp_path / "one"))
    write_tree(tmp_path / "bad", {"a": 5, "b": 5})
    (tmp_path / "bad" / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(FedrcError, match=r"^--data-root: .*broken\.png: cannot read image"):
        load_dataset("folder", str(tmp_path / "bad"))
