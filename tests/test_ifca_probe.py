"""experiments/fmnist/ifca_empty_clusters.py: the probe of the authors' IFCA aggregation."""

from pathlib import Path

import torch
from conftest import EXPERIMENTS, TINY_TRAIN, load_script

from pipeline.engine.task import LocalResult, LocalTask
from pipeline.run.resolve import make_config


def test_zeroing_ifca_zeroes_only_the_models_nobody_chose() -> None:
    probe = load_script(EXPERIMENTS / "fmnist" / "ifca_empty_clusters.py")
    ifca = probe.ZeroingIFCA(3, 2, 10, make_config(algorithm="ifca", clusters=3))
    models = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    ifca.begin_round(models)
    ifca.fold(0, LocalTask(1, models[1], torch.ones(2), 2.0), LocalResult(models[0], 0, None))
    ifca.fold(1, LocalTask(1, models[1], torch.ones(6), 6.0), LocalResult(models[2], 0, None))
    new = ifca.aggregate(models)
    expected = torch.tensor([[0.0, 0.0], [2.5, 2.5], [0.0, 0.0]])  # (2·1 + 6·3) / 8 = 2.5
    torch.testing.assert_close(new, expected)


def test_probe_reports_members_of_every_model(tiny_data: Path) -> None:
    probe = load_script(EXPERIMENTS / "fmnist" / "ifca_empty_clusters.py")
    config = make_config(data=str(tiny_data), algorithm="ifca", **TINY_TRAIN)
    rows = probe.run(config, zero_empty=True)
    assert [r[0] for r in rows] == [1, 2, 3]
    for _, members, scores in rows:
        assert len(members) == 2 and sum(members) == 12
        assert 0.0 <= scores["global_accuracy"] <= 1.0
