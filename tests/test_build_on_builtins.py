"""A plugin built on a built-in method overrides one verb and keeps the rest: server momentum
on FedAvg and on IFCA (tests/server_momentum.py) keep their parent's client part, so that what
travels between places (the communicator's messages, which torchrun's ranks and Flower's nodes
exchange) is exactly what the parent sends; and the new verb is FedAvgM's equation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import pipeline.plugin
from pipeline.algorithms import BUILT_IN, build_algorithm
from pipeline.places.communicate import Communicator
from pipeline.run.files import METRICS, read_metrics
from pipeline.run.resolve import make_config
from pipeline.run.training import train_run

TRAIN = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
PAIRS = [("fedavg", "server_momentum:FedAvgM"), ("ifca", "server_momentum:IFCAM")]


def test_every_built_in_algorithm_is_a_base_in_the_plugin_module() -> None:
    for name, card in BUILT_IN.items():
        cls = card.load()
        assert getattr(pipeline.plugin, cls.__name__) is cls, name
        step = getattr(cls, "Step", None)
        if step is not None:
            assert getattr(pipeline.plugin, step.__name__) is step, name


@pytest.mark.parametrize(("parent", "plugin"), PAIRS)
def test_a_server_side_override_keeps_the_client_part(parent: str, plugin: str) -> None:
    built = [build_algorithm(make_config(algorithm=a, clusters=2), 4, 10) for a in (parent, plugin)]
    assert built[0].client_part and built[1].client_part
    assert built[1].Step is built[0].Step


def shape(value: Any) -> Any:
    """What a message holds, without its numbers: tensors by dtype and shape."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(shape(item) for item in value)
    return type(value).__name__


class Recording(Communicator):
    """The one-process communicator, keeping the shape of everything it combines or gathers."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.sent: list[tuple[str, Any]] = []

    def sum(self, tensors):
        tensors = list(tensors)
        self.sent.append(("sum", shape(tensors)))
        return super().sum(tensors)

    def gather(self, clients, local, sizes, empty):
        self.sent.append(("gather", shape(local)))
        return super().gather(clients, local, sizes, empty)

    def all_gather_object(self, value):
        self.sent.append(("all_gather_object", shape(value)))
        return super().all_gather_object(value)


def recorded(data: Path, algorithm: str, out: Path, **values) -> tuple[Recording, list[dict]]:
    config = make_config(data=str(data), algorithm=algorithm, out=str(out), **TRAIN, **values)
    comm = Recording(torch.device("cpu"))
    train_run(config, comm, resume=False, overwrite=False, on_round=None)
    return comm, read_metrics(out / METRICS)


@pytest.mark.parametrize(("parent", "plugin"), PAIRS)
def test_the_plugin_sends_what_its_parent_sends(
    parent: str, plugin: str, tiny_data: Path, tmp_path: Path
) -> None:
    base, _ = recorded(tiny_data, parent, tmp_path / parent)
    mine, _ = recorded(tiny_data, plugin, tmp_path / "plugin")
    assert mine.sent == base.sent
    assert any(kind == "all_gather_object" for kind, _ in base.sent)  # the clients' uploads


def test_rewriting_the_e_step_as_assign_sends_per_sample_losses(
    tiny_data: Path, tmp_path: Path
) -> None:
    """The control: the same method with `assign` has no client part, and every client's
    per-sample losses and labels travel (`gather`)."""
    base, _ = recorded(tiny_data, "fedavg", tmp_path / "fedavg")
    fallback, _ = recorded(tiny_data, "server_momentum:FedAvgMByAssign", tmp_path / "assign")
    assert not build_algorithm(
        make_config(algorithm="server_momentum:FedAvgMByAssign"), 4, 10
    ).client_part
    assert fallback.sent != base.sent
    assert any(kind == "gather" for kind, _ in fallback.sent)


def test_without_momentum_the_plugin_is_its_parent(tiny_data: Path, tmp_path: Path) -> None:
    _, fedavg = recorded(tiny_data, "fedavg", tmp_path / "fedavg")
    _, plugin = recorded(tiny_data, "server_momentum:FedAvgM", tmp_path / "plugin", beta=0.0)
    for a, b in zip(fedavg, plugin, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)


def test_server_momentum_by_hand() -> None:
    """Two rounds on a 3-parameter model, every client's result folded by hand: round 1
    v = θ − θ̄ = (1, 0, −2) and θ ← θ − v = θ̄; round 2 v = 0.5·v + (θ − θ̄)."""
    algorithm = build_algorithm(make_config(algorithm="server_momentum:FedAvgM", beta=0.5), 2, 10)
    models = torch.tensor([[1.0, 2.0, 3.0]])
    expected_velocity = torch.tensor([[1.0, 0.0, -2.0]])
    for round_ in range(2):
        algorithm.begin_round(models)
        average = models - torch.tensor([[1.0, 0.0, -2.0]])  # what the clients trained to
        algorithm.accumulate(0, average[0], 3.0)
        algorithm.accumulate(0, average[0], 1.0)
        new = algorithm.aggregate(models)
        if round_ == 1:
            expected_velocity = 0.5 * expected_velocity + torch.tensor([[1.0, 0.0, -2.0]])
        assert torch.allclose(algorithm.velocity, expected_velocity)
        assert torch.allclose(new, models - expected_velocity)
        models = new
    assert "velocity" in algorithm.state_dict()  # in checkpoints


def test_a_plugin_with_settings_of_its_own_runs_its_parents_rule() -> None:
    """IFCAM's Settings (β only) does not extend IFCA's (zero_empty, an as-released switch):
    IFCA's aggregate then takes the paper's rule, as IFCA with zero_empty false does (a model
    no client chose keeps its weights), instead of failing in the middle of a round."""
    plugin = build_algorithm(make_config(algorithm="server_momentum:IFCAM", beta=0.0), 2, 10)
    assert not hasattr(plugin.settings, "zero_empty")
    parent = build_algorithm(make_config(algorithm="ifca"), 2, 10)
    models = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    for algorithm in (plugin, parent):
        algorithm.begin_round(models)
        algorithm.accumulate(0, torch.tensor([0.0, 2.0, 1.0]), 3.0)  # model 1: nobody
        new = algorithm.aggregate(models)
        assert torch.equal(new[1], models[1])
    assert torch.equal(plugin.aggregate(models), parent.aggregate(models))
