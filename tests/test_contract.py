"""The algorithm contract's newer verbs through the real round loop: the base keeps ω, the time
step's cue (`begin_step`), and client statistics (`wants_statistics` → `describe` where the data
lives → `observe` everywhere), with a resume in the middle of a step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.resolve import make_config
from pipeline.run_files import MODEL, load_state
from pipeline.stages import partition_stage, train_stage

PROBE = '''
import torch

from pipeline.algorithms.base import HardClustering, hard_gamma
from pipeline.algorithms.fedem import FedEM


class Probe(FedEM):
    """FedEM that asks each client once for its label counts and notes each step's start."""

    name = "probe"
    title = "Probe"
    paper = "a test plugin"
    describes = True

    def init_state(self):
        super().init_state()
        self.counts = torch.full((self.num_clients, self.num_classes), -1.0)
        self.steps_begun = torch.full((4,), -1)  # a state tensor keeps its shape

    def begin_step(self, step):
        free = int((self.steps_begun >= 0).sum())
        self.steps_begun[free] = step

    def wants_statistics(self, sampled):
        return [c for c in sampled if self.counts[c, 0] < 0]

    def describe(self, client, images, labels, models):
        return torch.bincount(labels, minlength=self.num_classes).float()

    def observe(self, client, statistic):
        self.counts[client] = statistic

    def state_dict(self):
        return {**super().state_dict(), "counts": self.counts, "steps_begun": self.steps_begun}


class Lowest(HardClustering):
    """IFCA's rule without a word about ω."""

    name = "lowest"
    title = "Lowest"
    paper = "a test plugin"

    def assign(self, client, losses, labels):
        return hard_gamma(losses, int(losses.mean(0).argmin()))
'''

DRIFTING = dict(
    dataset="synthetic", clients=8, samples_per_client=40, holdout_samples=80,
    shifts=["concept"], concepts=["identity", "reverse"], client_mix="custom",
    client_shares=[0.5, 0.0, 0.5, 0.0], time_steps=3, drift_share=0.25,
)  # fmt: skip


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "contract_probe.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("contract_probe", None)


def config(data: Path, out: Path, algorithm: str, rounds: int = 6, **extra):
    return make_config(
        data=str(data), out=str(out), algorithm=algorithm, rounds=rounds, rounds_per_step=2,
        local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu", **extra,
    )  # fmt: skip


def test_the_base_sets_omega_from_what_assign_returns(plugin: None) -> None:
    """Lowest's assign never touches ω; after the E-step ω_0 is one-hot on the lowest mean loss
    (model 1: means 2 and 1), and a held-out client's ω is what assign_held_out returns."""
    algo = build_algorithm(make_config(algorithm="contract_probe:Lowest", clusters=2), 3, 2)
    losses = torch.tensor([[3.0, 1.0], [1.0, 1.0]])
    gamma = algo.e_step(0, losses, torch.zeros(2, dtype=torch.long))
    assert torch.equal(gamma, torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    assert torch.equal(algo.omega[0], torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert torch.equal(algo.omega[1], torch.tensor([0.5, 0.5], dtype=torch.float64))  # not seen
    algo.held_out_step(2, torch.tensor([[0.5, 4.0]]), torch.zeros(1, dtype=torch.long))
    assert torch.equal(algo.omega[2], torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_statistics_and_steps_reach_the_algorithm(plugin: None, tmp_path: Path) -> None:
    """Every participating client is described once, from its step-0 training labels; the
    steps begin in order, once each, also across a resume in the middle of step 1."""
    data = tmp_path / "d"
    partition_stage(PartitionConfig(**DRIFTING, out=str(data)))
    full = train_stage(config(data, tmp_path / "full", "contract_probe:Probe"))
    state = load_state(full / MODEL)["algorithm"]
    assert state["steps_begun"].tolist() == [0, 1, 2, -1]
    at_start = load_federated(data).at_step(0)
    for client in at_start.participating:
        labels = at_start.labels[at_start.train_slices[client]]
        expected = torch.bincount(labels, minlength=at_start.num_classes).float()
        assert torch.equal(state["counts"][client], expected)
    for client in at_start.held_out:
        assert (state["counts"][client] == -1).all()  # never sampled, never described

    half = tmp_path / "half"
    train_stage(config(data, half, "contract_probe:Probe", rounds=3))  # stops inside step 1
    train_stage(config(data, half, "contract_probe:Probe"), resume=True)
    resumed = load_state(half / MODEL)
    assert resumed["algorithm"]["steps_begun"].tolist() == [0, 1, 2, -1]
    torch.testing.assert_close(resumed["models"], load_state(full / MODEL)["models"])
