"""The algorithm contract's newer verbs through the real round loop: the base keeps ω, the time
step's cue (`begin_step`), and client statistics (`wants_statistics` → `describe` where the data
lives → `observe` everywhere), with a resume in the middle of a step; per-sample predictions
for a rule that chooses by accuracy (`wants_predictions`), and state a plugin declares
(`state_attributes`) or forgets."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.client import per_sample_losses, sample_predictions
from pipeline.common.errors import FedrcWarning
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.run.clients import held_out_omega
from pipeline.run.files import METRICS, MODEL, load_state
from pipeline.run.resolve import make_config
from pipeline.run.training import make_executor
from pipeline.stages import partition_stage, train_stage

PROBE = '''
from dataclasses import dataclass

import torch

from pipeline.algorithms.base import HardClustering, hard_gamma, one_hot
from pipeline.algorithms.client import ClientOutcome, mean_omega
from pipeline.algorithms.fedem import FedEM
from pipeline.algorithms.ifca import IFCA, IFCAStep


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


def most_accurate(labels, predictions):
    return int((predictions == labels[:, None]).double().mean(0).argmax())


class ByAccuracy(HardClustering):
    """IFCA choosing the model that classifies most of the client's samples right."""

    name = "by-accuracy"
    title = "IFCA by accuracy"
    paper = "a test plugin"
    wants_predictions = True

    def assign(self, client, losses, labels, predictions):
        return hard_gamma(losses, most_accurate(labels, predictions))

    def assign_held_out(self, client, losses, labels, predictions):
        return one_hot(most_accurate(labels, predictions), self.num_models)


@dataclass
class ByAccuracyStep(IFCAStep):
    wants_predictions = True

    def run(self, losses, labels, memory, predictions):
        gamma = hard_gamma(losses, most_accurate(labels, predictions))
        return ClientOutcome(gamma, {"omega": mean_omega(gamma)})

    def held_out(self, losses, labels, predictions):
        return one_hot(most_accurate(labels, predictions), losses.shape[1])


class ByAccuracyPart(IFCA):
    """The same rule as a client part, run where each client's data is."""

    name = "by-accuracy-part"
    Step = ByAccuracyStep

    def client_step(self, client):
        return ByAccuracyStep()


class Rotating(HardClustering):
    """Client i trains model (its visits so far) mod K: a per-client count, declared."""

    name = "rotating"
    title = "Rotating"
    paper = "a test plugin"
    state_attributes = ("visits",)

    def init_state(self):
        super().init_state()
        self.visits = torch.zeros(self.num_clients, dtype=torch.long)

    def assign(self, client, losses, labels):
        self.visits[client] += 1
        return hard_gamma(losses, int(self.visits[client]) % self.num_models)


class Forgetful(Rotating):
    """The same, with its count left out of its state_dict."""

    state_attributes = ()
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
        local_epochs=1, batch_size=16, lr=0.05, device="cpu", **{"clusters": 2, **extra},
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


# Two samples of class 0 under two models: model 0 is right on both, without confidence (loss
# 0.60 each); model 1 is sure and right on the first (0.007), wrong on the second (0.74).
# Lowest mean loss: model 1 (0.37 < 0.60); most accurate: model 0 (2/2 against 1/2).
LOGITS = torch.tensor([[[0.2, 0.0], [0.2, 0.0]], [[5.0, 0.0], [0.0, 0.1]]])
LABELS = torch.zeros(2, dtype=torch.long)


@pytest.mark.parametrize("name", ["ByAccuracy", "ByAccuracyPart"])
def test_an_algorithm_can_choose_the_most_accurate_model(plugin: None, name: str) -> None:
    """The predictions given beside the losses let a rule choose model 0, the most accurate,
    where the lowest-loss rule (IFCA) chooses model 1; the same for a held-out client."""
    losses, guesses = per_sample_losses(LOGITS, LABELS), sample_predictions(LOGITS)
    assert guesses.tolist() == [[0, 0], [0, 1]]
    ifca = build_algorithm(make_config(algorithm="ifca", clusters=2), 2, 2)
    ifca.e_step(0, losses, LABELS, guesses)  # given, not wanted: not passed on
    assert ifca.omega[0].tolist() == [0.0, 1.0]
    algo = build_algorithm(make_config(algorithm=f"contract_probe:{name}", clusters=2), 2, 2)
    algo.e_step(0, losses, LABELS, guesses)
    assert algo.omega[0].tolist() == [1.0, 0.0]
    algo.held_out_step(1, losses, LABELS, guesses)
    assert algo.omega[1].tolist() == [1.0, 0.0]
    if algo.client_part:  # where a held-out client's data is (`pipeline.run.clients`)
        assert held_out_omega(algo.client_step(1), LOGITS, LABELS).tolist() == [1.0, 0.0]


def rows(run: Path) -> list[dict]:
    lines = (run / METRICS).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


def test_choosing_by_accuracy_trains_end_to_end(
    plugin: None, tiny_data: Path, tmp_path: Path
) -> None:
    """Both forms train through the round loop to the same numbers (the client part sending
    less), and each held-out client's final ω is on the model that classifies most of its
    labelled part right."""
    runs = {
        name: train_stage(config(tiny_data, tmp_path / name, f"contract_probe:{name}", rounds=3))
        for name in ("ByAccuracy", "ByAccuracyPart")
    }
    on_server, on_client = rows(runs["ByAccuracy"]), rows(runs["ByAccuracyPart"])
    for server_row, client_row in zip(on_server, on_client, strict=True):
        # what goes up differs by design: the server form's E-step needs each sample's labels
        # and predictions, the client part sends its ω
        assert server_row.pop("bytes_up") > client_row.pop("bytes_up")
    assert on_server == on_client
    final = load_state(runs["ByAccuracy"] / MODEL)
    data = load_federated(tiny_data)
    setup = config(tiny_data, tmp_path / "x", "contract_probe:ByAccuracy")
    executor = make_executor(setup, data, torch.device("cpu"))
    for client in data.held_out:
        part = data.train_slices[client]
        logits = executor.logits(final["models"], data.images[part])
        correct = (sample_predictions(logits) == data.labels[part][:, None]).double().mean(0)
        assert final["omega"][client].tolist() == one_hot(correct)


def one_hot(scores: torch.Tensor) -> list[float]:
    return [float(k == int(scores.argmax())) for k in range(len(scores))]


ROTATING = "contract_probe:Rotating"


def test_declared_state_survives_a_resume(plugin: None, tiny_data: Path, tmp_path: Path) -> None:
    """Rotating's visit counts are saved by the base: 4 rounds straight and 2 + 2 resumed give
    the same metrics and state, and no warning."""
    setup = dict(clusters=3, checkpoint_every=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedrcWarning)
        full = train_stage(config(tiny_data, tmp_path / "full", ROTATING, 4, **setup))
        half = tmp_path / "half"
        train_stage(config(tiny_data, half, ROTATING, 2, **setup))
        train_stage(config(tiny_data, half, ROTATING, 4, **setup), resume=True)
    assert rows(full) == rows(half)
    state = load_state(half / MODEL)["algorithm"]
    participating = load_federated(tiny_data).participating
    assert state["visits"][participating].tolist() == [4] * len(participating)
    torch.testing.assert_close(state["visits"], load_state(full / MODEL)["algorithm"]["visits"])


def test_state_left_out_of_the_state_dict_is_one_warning(
    plugin: None, tiny_data: Path, tmp_path: Path
) -> None:
    """Forgetful keeps its counts outside its state_dict: the first checkpoint says so, once,
    in one line naming the attribute and the fix."""
    with pytest.warns(FedrcWarning) as caught:
        train_stage(config(tiny_data, tmp_path / "r", "contract_probe:Forgetful", 2, clusters=3))
    messages = [str(w.message) for w in caught if "state_dict" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "visits not in its state_dict" in messages[0]
    assert "state_attributes = ('visits',)" in messages[0]
