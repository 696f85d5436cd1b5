from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import PartitionConfig, TrainConfig
from pipeline.stages import partition_stage, train_stage

TINY_PARTITION = dict(dataset="synthetic", clients=12, samples_per_client=60, holdout_samples=200)
TINY_TRAIN = dict(rounds=3, local_epochs=2, batch_size=16, lr=0.05, clusters=2, device="cpu")


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
        config = TrainConfig(
            data=str(tiny_data), algorithm=algorithm, out=str(root / algorithm), **TINY_TRAIN
        )
        runs[algorithm] = train_stage(config)
    return runs
