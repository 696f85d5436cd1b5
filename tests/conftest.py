from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pipeline.algorithms import BUILT_IN
from pipeline.config import PartitionConfig
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage

# oneDNN picks its convolution kernels by the CPU's widest vector ISA, and AVX-512 kernels
# round differently from AVX2 ones, enough to move the golden curves past their 1e-3. The
# tests pin every x86 CPU to the AVX2 kernels so the stored curves hold on any of them.
# oneDNN reads this on its first convolution, not at import, so setting it here is in time.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
# MKL (torch's matrix products and SVDs on x86) picks its code paths by CPU vendor and model
# too: on an Intel Xeon seven curves stored on an AMD EPYC moved past 1e-3. MKL's Conditional
# Numerical Reproducibility pins one AVX2 path on every x86 CPU, and STRICT makes it independent
# of memory alignment (else two runs of one computation may differ in the last bit); MKL reads
# it at its first call.
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")
# One torch thread per test process. The test command spreads the tests over the cores
# (`pytest -n auto`); workers on torch's default, a thread per core, oversubscribe them, and
# spinning OpenMP threads slow each other up to tenfold (on 2 cores the suite took 14 minutes
# so, and 9.5 on one thread each with more tests). The processes tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

ALGORITHMS = tuple(BUILT_IN)  # every built-in algorithm, in registry order
PROXIMAL = ("fedprox", "fedsoft", "fesem-cam")  # those with a proximal μ

TINY_PARTITION = dict(dataset="synthetic", clients=12, samples_per_client=60, holdout_samples=200)
TINY_TRAIN = dict(rounds=3, local_epochs=2, batch_size=16, lr=0.05, clusters=2, device="cpu")
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch on `count` threads: a convolution's rounding depends on how many threads split
    it, so a result compared with a stored or another process's one fixes the count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_script(path: Path) -> ModuleType:
    """Import a script that is not in a package (the experiments' probes) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def flower_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fedrc flower app` as where the `flower` extra is installed: the core environment, which
    the tests of what the app folder holds run in, has no Flower (`fedrc_cli.flower` refuses)."""
    import fedrc_cli.flower

    monkeypatch.setattr(fedrc_cli.flower, "flower_installed", lambda: True)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed") / "data"
    partition_stage(PartitionConfig(**TINY_PARTITION, out=str(out)))
    return out


@pytest.fixture(scope="session")
def tiny_runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One short run per algorithm, shared by the eval, plot and resume tests."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for algorithm in ("fedavg", "fedem", "fedrc"):
        config = make_config(
            data=str(tiny_data), algorithm=algorithm, out=str(root / algorithm), **TINY_TRAIN
        )
        runs[algorithm] = train_stage(config)
    return runs


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with its SHA-256 ("dir" for folders): equal snapshots mean
    that nothing was written, changed or left behind."""
    return {
        str(p.relative_to(root)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def assert_metrics_close(expected: list[dict], got: list[dict], loss_tolerance: float) -> None:
    """Two runs' metrics.jsonl rows (without `seconds`) agree: numbers within
    `loss_tolerance`, except that an accuracy may differ by a prediction that sat on a tie
    (one of 20 held-out test samples = 0.05 per concept, 0.02 overall), never by more."""
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, dict):
                assert b[key] == pytest.approx(value, abs=0.05), key
            elif isinstance(value, float):
                tolerance = 0.02 if key.endswith("accuracy") else loss_tolerance
                assert b[key] == pytest.approx(value, abs=tolerance), key
            else:
                assert b[key] == value, key


def working_copy(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of a module's `world` folder (its benchmark and runs), made the working
    directory: each test may damage it."""
    root = tmp_path / "w"
    shutil.copytree(world, root)
    monkeypatch.chdir(root)
    return root


def assert_one_line(result, *culprits: str, code: int | None = None) -> str:
    """A CLI result that failed (with `code`, when given) with one error line on stderr naming
    every culprit, and no traceback; returns the line."""
    assert result.exit_code != 0 if code is None else result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]  # stdout: progress
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output and lines[0].startswith("Error:"), result.output
    for culprit in culprits:
        assert culprit in lines[0], (culprit, lines[0])
    return lines[0]
