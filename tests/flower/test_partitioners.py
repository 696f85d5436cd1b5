"""Flower Datasets' partitioners as fedrc's label split: the same partitioner and seed give the
same clients as flwr-datasets' own `FederatedDataset`, and such a benchmark takes fedrc's
concept shift and trains. Runs where the `partitioners` extra is installed (.ci/setup-flower)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("flwr_datasets")

from conftest import TINY_TRAIN
from flwr_datasets import FederatedDataset
from flwr_datasets import partitioner as flower
from formats import hub

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage

CLIENTS, SEED = 6, 3


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hub(tmp_path_factory.mktemp("hub") / "images", train=360, test=60)


def fedrc_clients(folder: Path) -> list[list[bytes]]:
    """Each participating client's images (train and test rows), sorted."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return [
        sorted(pq.read_table(folder / "shards" / f"client-{i:05d}.parquet")["image"].to_pylist())
        for i in range(manifest["num_participating"])
    ]


@pytest.mark.parametrize(
    ("name", "options", "cls"),
    [
        ("dirichlet", {"alpha": 0.5, "min_partition_size": 5}, flower.DirichletPartitioner),
        ("pathological", {"num_classes_per_partition": 2}, flower.PathologicalPartitioner),
        ("shard", {"num_shards_per_partition": 2, "shard_size": 25}, flower.ShardPartitioner),
        ("iid", {}, flower.IidPartitioner),
    ],
)
def test_the_same_partitioner_and_seed_give_flowers_clients(
    source: Path, tmp_path: Path, name: str, options: dict, cls: type
) -> None:
    config = PartitionConfig(
        dataset="hf:someone/images", data_root=str(source), partitioner=name,
        partitioner_options=options or None, clients=CLIENTS, shifts=[], seed=SEED,
        out=str(tmp_path / "d"),
    )  # fmt: skip
    partition_stage(config)
    arguments = {"num_partitions": CLIENTS, **options}
    if name != "iid":
        arguments.update(partition_by="label", seed=SEED)
    federated = FederatedDataset(
        dataset=str(source), partitioners={"train": cls(**arguments)}, seed=SEED
    )  # shuffles the split with the seed first, as fedrc does
    theirs = [
        sorted(np.asarray(image).tobytes() for image in federated.load_partition(i)["img"])
        for i in range(CLIENTS)
    ]
    assert fedrc_clients(tmp_path / "d") == theirs


def test_a_flower_dirichlet_benchmark_with_fedrcs_concept_shift_trains(
    source: Path, tmp_path: Path
) -> None:
    config = PartitionConfig(
        dataset="hf:someone/images", data_root=str(source), partitioner="dirichlet",
        partitioner_options="alpha=0.5,min_partition_size=5", clients=CLIENTS,
        shifts=["label", "concept"], concepts=["identity", "reverse"], out=str(tmp_path / "d"),
    )  # fmt: skip
    manifest = partition_stage(config)
    part = [c for c in manifest.clients if c.participating]
    assert {manifest.concepts[c.concept] for c in part} == {"identity", "reverse"}
    run = train_stage(make_config(**TINY_TRAIN, data=config.out, out=str(tmp_path / "run")))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == TINY_TRAIN["rounds"] and "global_accuracy" in rows[-1]


def test_flowers_own_checks_and_unknown_names_are_one_line(source: Path, tmp_path: Path) -> None:
    base = {"dataset": "hf:x", "data_root": str(source), "clients": CLIENTS, "shifts": []}
    for extra, message in (
        ({"partitioner": "dirichlet", "partitioner_options": "alpha=-1"}, "options: dirichlet"),
        ({"partitioner": "dirichlet_ish"}, "flwr-datasets has no DirichletIshPartitioner"),
        ({"partitioner": "natural_id", "partitioner_options": "partition_by=label"},
         "but natural_id makes 10 partitions; give --clients 10"),
    ):  # fmt: skip
        with pytest.raises(FedrcError, match=message):
            partition_stage(PartitionConfig(**base, **extra, out=str(tmp_path / "d")))
    assert not (tmp_path / "d").exists()
