"""Floco: the simplex layer, the region draws, the projection of the clients onto the simplex
on hand-checked cases (PCA against scikit-learn where it is installed), the projection round,
and what it does that FedAvg does not: clients of one concept share a region of the simplex."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_behaviour import concept_data, train  # noqa: F401 (a fixture)
from torch import nn

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.floco import (
    FlocoRule,
    SimplexLinear,
    l1_ball,
    onto_simplex,
    principal_components,
    project_clients,
    riesz_energy,
    simplex_model,
    uniform_simplex,
)
from pipeline.common.errors import FedrcError
from pipeline.engine import LocalResult, LocalTask, SequentialExecutor
from pipeline.models.layout import head_range
from pipeline.run.files import METRICS, MODEL, read_metrics
from pipeline.run.resolve import make_config

SGD = dict(lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=False)


def net(endpoints: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return simplex_model(
        nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4)), endpoints
    )


def test_the_final_layer_becomes_a_simplex_of_endpoints() -> None:
    model = net()
    layer = model[3]
    assert isinstance(layer, SimplexLinear) and layer.weights.shape == (3, 4, 5)
    layer.alphas.copy_(torch.tensor([0.2, 0.5, 0.3]))
    x = torch.randn(7, 5)
    weight = 0.2 * layer.weights[0] + 0.5 * layer.weights[1] + 0.3 * layer.weights[2]
    torch.testing.assert_close(layer(x), x @ weight.T + layer.bias)
    executor = SequentialExecutor(model, torch.device("cpu"), **SGD, batch_size=8, local_epochs=1)
    flat = executor.flatten()
    assert torch.equal(flat[-3:], torch.tensor([0.2, 0.5, 0.3]))  # α: the flat model's last M
    assert head_range(model) == (30 + 5, 30 + 5 + 60 + 4)  # W_1..W_M, then the bias
    with pytest.raises(FedrcError, match="linear final layer"):
        simplex_model(nn.Sequential(nn.Linear(3, 3), nn.Conv1d(1, 1, 1)), 2)


def test_draws_stay_on_the_simplex_and_in_the_region() -> None:
    gen = torch.Generator().manual_seed(0)
    points = torch.stack([uniform_simplex(4, gen) for _ in range(200)])
    assert bool((points >= 0).all()) and torch.allclose(points.sum(1), torch.ones(200).double())
    assert float(points.mean(0).sub(0.25).abs().max()) < 0.05
    centre = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    for _ in range(100):
        alpha = l1_ball(centre, 0.2, gen)
        assert float((alpha - centre).abs().sum()) <= 0.2 + 1e-12  # the L1 ball of radius ρ


def test_projection_onto_the_simplex_is_the_hand_computation() -> None:
    """κ = (0.5, 0.2, −0.1), z = 1: every coordinate in the support, shift −0.4/3."""
    got = onto_simplex(np.array([[0.5, 0.2, -0.1], [2.0, 0.0, 0.0]]), 1.0)
    np.testing.assert_allclose(got[0], [0.5 + 0.4 / 3, 0.2 + 0.4 / 3, -0.1 + 0.4 / 3])
    np.testing.assert_allclose(got[1], [1.0, 0.0, 0.0])  # a far point: the nearest vertex
    inside = np.array([[0.2, 0.3, 0.5]])
    np.testing.assert_allclose(onto_simplex(inside, 1.0), inside)


def test_riesz_energy_is_the_log_mean_inverse_square_distance() -> None:
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    pairs = np.array([1.0, 2.0, np.sqrt(5.0)])
    assert riesz_energy(points) == pytest.approx(np.log((1 / pairs**2).mean()))
    assert riesz_energy(np.zeros((2, 2))) == pytest.approx(np.log(1e8))  # floored at 10⁻⁴


def test_principal_components_are_scikit_learns() -> None:
    decomposition = pytest.importorskip("sklearn.decomposition")
    points = np.random.default_rng(0).normal(size=(12, 40))
    theirs = decomposition.PCA(n_components=3, svd_solver="full").fit_transform(points)
    np.testing.assert_allclose(principal_components(points, 3), theirs, atol=1e-10)


def test_clients_with_alike_gradients_share_a_vertex() -> None:
    """Three groups of pseudo-gradients: projected, each group lands at a vertex of its own."""
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 30)) * 3
    gradients = np.concatenate([c + 0.1 * rng.normal(size=(4, 30)) for c in centres])
    betas = project_clients(gradients, 3)
    np.testing.assert_allclose(betas.sum(1), 1.0)
    vertices = betas.argmax(1)
    assert len(set(vertices)) == 3
    assert all(len(set(vertices[g * 4 : g * 4 + 4])) == 1 for g in range(3))


def test_a_rule_at_a_fixed_point_is_the_plain_training_there() -> None:
    """ρ = 0: every batch at the centre β, which is the plain training of the model with α = β."""
    model = net()
    sgd = {**SGD, "momentum": 0.9}
    executor = SequentialExecutor(model, torch.device("cpu"), **sgd, batch_size=4, local_epochs=2)
    images = torch.randint(0, 256, (10, 1, 1, 6), dtype=torch.uint8)
    labels = torch.randint(0, 4, (10,))
    centre = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    start = executor.flatten()
    start[-3:] = centre.float()
    plain = executor.train(LocalTask(0, start, torch.ones(10)), images, labels, seed=2)
    rule = FlocoRule(centre, 0.0, seed=5, count=3)
    ruled = executor.train(LocalTask(0, start, torch.ones(10), rule=rule), images, labels, seed=2)
    torch.testing.assert_close(ruled.params, plain.params, rtol=0, atol=1e-6)


def test_fedrc_check_sizes_the_simplex_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fedrc check` weighs the model the run trains (M copies of the final layer), not
    --model's."""
    from pipeline.models import build_model
    from pipeline.run import setup

    config = make_config(algorithm="floco", endpoints=3, model="cnn", device="cpu")
    sizes: list[int] = []
    monkeypatch.setattr(setup, "check_models_fit", lambda k, size, device: sizes.append(size))
    setup.check_fits(config, (28, 28, 1), 10)
    plain = setup.flat_size(build_model((28, 28, 1), 10, "cnn"))
    assert sizes == [setup.flat_size(setup.run_model(config, (28, 28, 1), 10))]
    assert sizes[0] > plain


def test_the_projection_round_trains_everyone_and_places_them() -> None:
    config = make_config(algorithm="floco", endpoints=3, tau=2)
    algorithm = build_algorithm(config, 6, 4, head=(0, 3 * 4 * 2 + 4))
    algorithm.participants(list(range(6)))
    assert algorithm.round_clients(1, [0, 3], list(range(6))) == [0, 3]
    assert algorithm.round_clients(2, [0, 3], list(range(6))) == list(range(6))
    with pytest.raises(FedrcError, match=r"^train\.floco\.endpoints: 3 endpoints need"):
        algorithm.participants([0, 1])
    models = torch.zeros(1, 24 + 4 + 3)
    for round_ in (1, 2):
        algorithm.begin_round(models)
        for c in [0, 3] if round_ == 1 else range(6):
            (task,) = algorithm.local_tasks(c, torch.ones(5, 1), models, torch.zeros(1, 5, 4))
            assert task.rule.centre is None  # the whole simplex until projected
            trained = models[0].clone()
            trained[:24] = torch.randn(24) + (3.0 if c < 3 else -3.0)
            trained[-3:] = torch.tensor([0.9, 0.05, 0.05])
            algorithm.fold(c, task, LocalResult(trained, 0.0, None))
        models = algorithm.aggregate(models)
        algorithm.end_round()
    assert torch.allclose(models[0, -3:], torch.full((3,), 1 / 3))  # the global model: centre
    assert bool(algorithm.placed.all())
    own = algorithm.personal_model(4)
    assert torch.equal(own[:-3], models[0, :-3]) and torch.equal(
        own[-3:], algorithm.centres[4].float()
    )
    (task,) = algorithm.local_tasks(4, torch.ones(5, 1), models, torch.zeros(1, 5, 4))
    assert torch.equal(task.rule.centre, algorithm.centres[4])


@pytest.mark.slow  # 1 minute on the 2-core CPU
def test_each_concept_takes_a_region_of_its_own(
    concept_data: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Three concepts, three endpoints, projected in round 3: the clients of each concept land at
    one vertex of the simplex, a different one for each concept, and predict from there far
    better than FedAvg's one model, while the simplex's centre stays a global model."""
    from pipeline.data.shards import read_manifest

    run = train(concept_data, tmp_path / "floco", rounds=8, algorithm="floco", endpoints=3, tau=3,
                rho=0.1)  # fmt: skip
    fedavg = read_metrics(
        train(concept_data, tmp_path / "fedavg", rounds=8, algorithm="fedavg") / METRICS
    )
    centres = torch.load(run / MODEL, weights_only=False)["algorithm"]["centres"].numpy()
    manifest = read_manifest(concept_data)
    vertex = {}
    for client in manifest.participating:
        vertex.setdefault(manifest.clients[client].concept, set()).add(
            int(centres[client].argmax())
        )
    assert all(len(v) == 1 for v in vertex.values()) and len(set.union(*vertex.values())) == 3
    last = read_metrics(run / METRICS)[-1]
    assert last["local_accuracy"] >= 0.9 > fedavg[-1]["local_accuracy"] + 0.3
