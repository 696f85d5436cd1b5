"""Seconds and peak memory of the benchmark builder (`fedrc partition`), not a test.

Cases (each in a fresh process, so peaks do not mix):
- fmnist: real Fashion-MNIST, 300 clients, the whole pool (200 samples each), every corruption
  style, whole-test-set held-out clients: the paper's FMNIST benchmark.
- cifar10-shaped: 50,000 random uint8 32×32×3 images (CIFAR-10 cannot be downloaded here),
  tripled as the paper does for MobileNetV2, 300 clients (500 samples each), same builder.

Peak RSS is the process's ru_maxrss (everything, torch included; `rss_after_imports_mb` is the
part the imports alone take); tracemalloc's peak counts only Python and numpy allocations.
Run from the repository root:

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/partition.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from pipeline.config import PartitionConfig
from pipeline.data.benchmark import write_benchmark
from pipeline.data.loaders import RawDataset, load_dataset

CASES = ("fmnist", "cifar10-shaped")


def cifar10_shaped() -> RawDataset:
    rng = np.random.default_rng(0)
    return RawDataset(
        "cifar10",
        rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8),
        np.arange(50_000) % 10,
        rng.integers(0, 256, (10_000, 32, 32, 3), dtype=np.uint8),
        np.arange(10_000) % 10,
        10,
        "random (benchmark)",
    )


def peak_rss_mb() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def run_case(case: str) -> dict[str, float | str]:
    after_imports = peak_rss_mb()  # torch and pyarrow alone
    tracemalloc.start()
    start = time.perf_counter()
    if case == "fmnist":
        raw = load_dataset("fmnist", None)
        replicate = 1
    else:
        raw = cifar10_shaped()
        replicate = 3
    loaded = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "federated"
        config = PartitionConfig(dataset=raw.name, clients=300, replicate=replicate, out=str(out))
        manifest = write_benchmark(config, raw)
        built = time.perf_counter()
        disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    samples = sum(c.size for c in manifest.clients)
    return {
        "case": case,
        "samples": samples,
        "load_s": round(loaded - start, 2),
        "build_write_s": round(built - loaded, 2),
        "total_s": round(built - start, 2),
        "rss_after_imports_mb": after_imports,
        "peak_rss_mb": peak_rss_mb(),
        "peak_tracemalloc_mb": round(tracemalloc.get_traced_memory()[1] / 2**20),
        "on_disk_mb": round(disk / 2**20),
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        print(json.dumps(run_case(sys.argv[2])))
        return
    rows = []
    for case in CASES:
        done = subprocess.run(
            [sys.executable, __file__, "--case", case], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(done.stdout.splitlines()[-1]))
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))


if __name__ == "__main__":
    main()
