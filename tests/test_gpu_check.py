"""`benchmarks/gpu_check.sh --dry-run`: every step of the GPU check at toy size on the CPU, so
that the script a GPU session runs first cannot rot where no GPU is lent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a minute; .ci/run runs the dry run itself, this checks its tables too
def test_gpu_check_dry_run_prints_every_table() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "skipped" in out  # the cuda tests were collected (and skipped on the CPU)
    assert out.count("| executor | s / round |") == 2  # FMNIST CNN and CIFAR-10 MobileNetV2
    assert "mobilenet_v2" in out and "| fedrc | 4 | 16 |" in out and "| ifca | 2 | 32 |" in out
