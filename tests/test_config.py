from pathlib import Path

import pytest

from pipeline.config import PartitionConfig, TrainConfig, build_config, read_params
from pipeline.errors import FedrcError


def test_params_file_then_cli_override(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("train:\n  rounds: 7\n  lr: 1\n  algorithm: fedem\n")
    config = build_config(TrainConfig, read_params(path), {"rounds": 9, "seed": None})
    assert (config.rounds, config.lr, config.algorithm, config.seed) == (9, 1.0, "fedem", 0)
    assert isinstance(config.lr, float)


@pytest.mark.parametrize(
    ("section", "cls", "body", "culprit"),
    [
        ("partition", PartitionConfig, "alpha: 0", "partition.alpha"),
        ("partition", PartitionConfig, "alpha: -1", "partition.alpha"),
        ("partition", PartitionConfig, "dataset: imagenet", "partition.dataset"),
        ("partition", PartitionConfig, "clients: ten", "partition.clients"),
        ("partition", PartitionConfig, "styles: [fog]", "partition.styles"),
        ("partition", PartitionConfig, "colour: red", "partition.colour"),
        ("train", TrainConfig, "algorithm: fedfoo", "train.algorithm"),
        ("train", TrainConfig, "participation: 0", "train.participation"),
        ("train", TrainConfig, "momentum: 1.0", "train.momentum"),
        ("train", TrainConfig, "lr: true", "train.lr"),
    ],
)
def test_bad_params_name_the_key(tmp_path, section, cls, body, culprit) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"{section}:\n  {body}\n")
    with pytest.raises(FedrcError, match=culprit.replace(".", r"\.")):
        build_config(cls, read_params(path))


def test_missing_params_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FedrcError, match="--params"):
        read_params(tmp_path / "nope.yaml")
