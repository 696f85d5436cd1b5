"""Speed of every corruption: milliseconds per 1000 images at severity 3, in client-sized batches.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/corruptions.py [--batch 200] [--partition]

Grey: Fashion-MNIST test images (28×28) when the files are found, else the built-in synthetic
images; colour: 32×32 crops of matplotlib's sample photograph (CIFAR cannot be downloaded on
our machines). `--partition` also times building the whole FMNIST benchmark (300 clients, the
paper's client mix, the full grey suite), without writing shards.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from pipeline.common.errors import FedrcError
from pipeline.data.corruptions import COLOUR_SUITE, GREY_SUITE, corrupt


def grey_images(n: int) -> tuple[np.ndarray, str]:
    from pipeline.data.loaders import load_dataset
    from pipeline.data.loaders.synthetic import make_synthetic

    try:
        return load_dataset("fmnist", None).test_images[:n], "Fashion-MNIST 28×28"
    except FedrcError:
        return make_synthetic().test_images[:n], "synthetic 16×16"


def colour_images(n: int) -> tuple[np.ndarray, str]:
    import matplotlib.cbook as cbook
    from PIL import Image

    photo = Image.open(cbook.get_sample_data("grace_hopper.jpg")).convert("RGB")
    rng = np.random.default_rng(0)
    crops = []
    for _ in range(n):
        side = int(rng.integers(96, 400))
        x0 = int(rng.integers(0, photo.width - side))
        y0 = int(rng.integers(0, photo.height - side))
        crop = photo.crop((x0, y0, x0 + side, y0 + side)).resize((32, 32), Image.BILINEAR)
        crops.append(np.asarray(crop))
    return np.stack(crops), "photo crops 32×32"


def time_suite(images: np.ndarray, names: list[str], total: int) -> dict[str, float]:
    batches = max(1, total // len(images))
    result = {}
    for name in names:
        corrupt(images, name, 3, seed=0)  # warm-up
        start = time.perf_counter()
        for b in range(batches):
            corrupt(images, name, 3, seed=b)
        result[name] = (time.perf_counter() - start) * 1000 / (batches * len(images)) * 1000
    return result


def time_partition() -> None:
    from pipeline.config import PartitionConfig
    from pipeline.data.benchmark import build_clients
    from pipeline.data.loaders import load_dataset

    raw = load_dataset("fmnist", None)
    config = PartitionConfig(dataset="fmnist", clients=300)
    start = time.perf_counter()
    clients = list(build_clients(config, raw))
    seconds = time.perf_counter() - start
    corrupted = [c for c in clients if c.style != "none"]
    images = sum(len(c.images) for c in corrupted)
    print(
        f"\nFMNIST partition, 300 clients, full grey suite: {seconds:.1f} s "
        f"({len(corrupted)} corrupted clients, {images} corrupted images)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=200, help="images per call (a client)")
    parser.add_argument("--images", type=int, default=1000, help="images timed per corruption")
    parser.add_argument("--partition", action="store_true", help="also time a whole partition")
    args = parser.parse_args()

    grey, grey_source = grey_images(args.batch)
    colour, colour_source = colour_images(args.batch)
    print(f"torch threads: {torch.get_num_threads()}; batches of {args.batch}")
    print(f"grey: {grey_source}; colour: {colour_source}\n")
    rows = [("grey", n, ms) for n, ms in time_suite(grey, list(GREY_SUITE), args.images).items()]
    rows += [
        ("colour", n, ms) for n, ms in time_suite(colour, list(COLOUR_SUITE), args.images).items()
    ]
    print(f"| {'corruption':<18} | {'suite':<6} | {'ms / 1000 images':>16} |")
    print(f"|{'-' * 20}|{'-' * 8}|{'-' * 18}|")
    for suite, name, ms in rows:
        print(f"| {name:<18} | {suite:<6} | {ms:>16.1f} |")
    for suite in ("grey", "colour"):
        values = [ms for s, _, ms in rows if s == suite]
        print(f"| {'(mean)':<18} | {suite:<6} | {sum(values) / len(values):>16.1f} |")
    if args.partition:
        time_partition()


if __name__ == "__main__":
    main()
