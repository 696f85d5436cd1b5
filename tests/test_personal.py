"""APFL and pFedMe: their local rules (`LocalTask.rule`) on hand-checked cases, the rule path of
the sequential executor, and the personal state the server keeps (`PersonalModels`).

The hand computations use a linear model (logits z = W x + b), whose cross-entropy gradient is
written out: ∇_W = (softmax(z) − onehot(y))ᵀ x / B. For a linear model APFL's mixture of outputs
α v(x) + (1 − α) w(x) is the model with parameters α v + (1 − α) w, the paper's form.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_behaviour import concept_data, train  # noqa: F401 (a fixture)
from torch import nn

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.apfl import APFLRule
from pipeline.algorithms.pfedme import PFedMeRule
from pipeline.algorithms.settings import PFedMeSettings
from pipeline.common.errors import FedrcError
from pipeline.engine import LocalResult, LocalTask, SequentialExecutor
from pipeline.engine.rules import StepLosses
from pipeline.engine.sequential import as_input
from pipeline.run.files import METRICS, MODEL, load_state, read_metrics
from pipeline.run.resolve import make_config

C, D, N = 3, 6, 12  # classes, inputs, samples


def linear(**sgd) -> tuple[SequentialExecutor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A linear model's executor (one batch of all N samples unless told), its start, data."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(D, C))
    args = dict(lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=N, local_epochs=1)
    executor = SequentialExecutor(model, torch.device("cpu"), **{**args, **sgd}, drop_last=False)
    images = torch.randint(0, 256, (N, 1, 1, D), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2] * (N // 3))
    return executor, executor.flatten(), images, labels


def gradient(flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇ of the mean cross-entropy of the linear model `flat` = [W (C, D) row-major, b (C,)]."""
    w, b = flat[: C * D].reshape(C, D), flat[C * D :]
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - np.eye(C)[y]) / len(y)
    return np.concatenate([(g.T @ x).ravel(), g.sum(0)])


def inputs(images: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return as_input(images).reshape(N, D).double().numpy(), labels.numpy()


def test_a_rule_of_plain_sgd_steps_is_the_plain_training() -> None:
    """The rule path draws the plain path's batches and `Net.sgd` is its SGD step (momentum,
    weight decay): `StepLosses`, which takes only those steps, gives the plain training's
    numbers, and each batch's mean loss."""
    executor, start, images, labels = linear(momentum=0.9, weight_decay=1e-3, batch_size=5)
    executor.local_epochs = 3
    ones = torch.ones(N)
    plain = executor.train(LocalTask(0, start, ones), images, labels, seed=4)
    ruled = executor.train(LocalTask(0, start, ones, rule=StepLosses()), images, labels, seed=4)
    torch.testing.assert_close(ruled.params, plain.params, rtol=0, atol=1e-6)
    assert ruled.loss_sum == pytest.approx(plain.loss_sum, rel=1e-6)
    steps = ruled.extras["losses"]  # each batch's mean loss: 3 epochs of batches of 5, 5, 2
    sizes = torch.tensor([5.0, 5, 2] * 3, dtype=torch.float64)
    assert steps.shape == (9,) and float(steps @ sizes) == pytest.approx(plain.loss_sum, rel=1e-6)
    with pytest.raises(ValueError, match="persistent momentum"):
        task = LocalTask(0, start, ones, momentum=torch.zeros(start.numel()), rule=StepLosses())
        executor.train(task, images, labels, seed=4)


@pytest.mark.parametrize("adaptive", [False, True])
def test_apfl_step_is_the_hand_computation(adaptive: bool) -> None:
    executor, start, images, labels = linear()
    x, y = inputs(images, labels)
    personal = start + 0.3 * torch.randn(start.numel())
    eta, alpha = 0.1, 0.4
    task = LocalTask(0, start, torch.ones(N), rule=APFLRule(personal, alpha, adaptive, eta))
    got = executor.train(task, images, labels, seed=0)

    w0, v0 = start.double().numpy(), personal.double().numpy()
    w1 = w0 - eta * gradient(w0, x, y)  # the global copy's SGD step
    g = gradient(alpha * v0 + (1 - alpha) * w1, x, y)  # ∇f at the mixture's parameters
    v1 = v0 - eta * alpha * g  # ∇_v f(v̄) = α ∇f(v̄)
    np.testing.assert_allclose(got.params.numpy(), w1, atol=1e-6)
    np.testing.assert_allclose(got.extras["personal"].numpy(), v1, atol=1e-6)
    expected = alpha
    if adaptive:  # ∇_w f(v̄) = (1 − α) ∇f(v̄); the authors' 0.02 α term; clipped to [0, 1]
        slope = (v1 - w1) @ (alpha * alpha * g + (1 - alpha) * (1 - alpha) * g)
        expected = min(max(alpha - eta * (slope + 0.02 * alpha), 0.0), 1.0)
        assert expected != alpha
    assert float(got.extras["alpha"]) == pytest.approx(expected, abs=1e-6)


def test_apfl_adapts_alpha_on_the_first_batch_only() -> None:
    executor, start, images, labels = linear(batch_size=4)
    personal = start + 0.3 * torch.randn(start.numel())
    rule = APFLRule(personal, 0.5, True, 0.1)
    seen = []
    original = rule.batch

    def spy(net, images, labels):
        out = original(net, images, labels)
        seen.append(rule.alpha)
        return out

    rule.batch = spy
    executor.train(LocalTask(0, start, torch.ones(N), rule=rule), images, labels, seed=0)
    assert len(seen) == 3 and seen[0] != 0.5 and seen[0] == seen[1] == seen[2]


def test_pfedme_step_is_the_hand_computation() -> None:
    executor, start, images, labels = linear()
    x, y = inputs(images, labels)
    s = PFedMeSettings(lam=2.0, inner_steps=3, personal_lr=0.2, local_lr=0.05, personal_decay=0.01)
    task = LocalTask(0, start, torch.ones(N), rule=PFedMeRule(s))
    got = executor.train(task, images, labels, seed=0)

    w = start.double().numpy()
    theta = w.copy()
    for _ in range(s.inner_steps):  # θ̂(w) approximately: K steps on the same batch
        pull = s.lam * (theta - w) + s.personal_decay * theta
        theta = theta - s.personal_lr * (gradient(theta, x, y) + pull)
    w = w - s.local_lr * s.lam * (w - theta)  # w ← w − ηλ (w − θ)
    np.testing.assert_allclose(got.extras["personal"].numpy(), theta, atol=1e-6)
    np.testing.assert_allclose(got.params.numpy(), w, atol=1e-6)


def test_pfedme_keeps_theta_from_one_batch_to_the_next() -> None:
    """Two batches: θ goes on from where the first left it, w from its own step."""
    executor, start, images, labels = linear(batch_size=N // 2)
    s = PFedMeSettings(lam=2.0, inner_steps=2, personal_lr=0.2, local_lr=0.05, personal_decay=0)
    got = executor.train(LocalTask(0, start, torch.ones(N), rule=PFedMeRule(s)), images, labels, 3)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(3))
    x, y = inputs(images[order], labels[order])
    w = start.double().numpy()
    theta = w.copy()
    for part in (slice(0, N // 2), slice(N // 2, N)):
        for _ in range(s.inner_steps):
            step = gradient(theta, x[part], y[part]) + s.lam * (theta - w)
            theta = theta - s.personal_lr * step
        w = w - s.local_lr * s.lam * (w - theta)
    np.testing.assert_allclose(got.extras["personal"].numpy(), theta, atol=1e-6)
    np.testing.assert_allclose(got.params.numpy(), w, atol=1e-6)


def apfl(**values):
    return build_algorithm(make_config(algorithm="apfl", **values), 4, C)


def test_apfl_keeps_each_clients_model_and_alpha_and_mixes_outputs() -> None:
    algorithm = apfl()
    models = torch.randn(1, 5)
    algorithm.begin_round(models)
    (task,) = algorithm.local_tasks(2, torch.ones(6, 1), models, torch.zeros(1, 6, C))
    assert task.rule.alpha == 0.5 and torch.equal(task.rule.personal, models[0])  # the start
    trained, personal = torch.randn(5), torch.randn(5)
    extras = {"personal": personal, "alpha": torch.tensor([0.3], dtype=torch.float64)}
    algorithm.fold(2, task, LocalResult(trained, 1.0, None, extras=extras))
    new = algorithm.aggregate(models)
    torch.testing.assert_close(new[0], trained)  # one client: its w
    assert torch.equal(algorithm.personal[2], personal) and algorithm.alpha[2] == pytest.approx(0.3)
    assert algorithm.personal_model(1) is None  # not trained yet: the global model predicts
    torch.testing.assert_close(algorithm.personal_model(2), torch.stack([personal, new[0]]))
    logits = torch.randn(2, 7, C)
    mixed = algorithm.combine_personal(2, logits)
    torch.testing.assert_close(mixed, (0.3 * logits[0] + 0.7 * logits[1])[None], rtol=1e-6, atol=0)
    assert algorithm.round_info() == {"mean_alpha": pytest.approx(0.3)}


@pytest.mark.parametrize("algorithm", ["apfl", "pfedme"])
def test_persistent_momentum_is_refused(algorithm: str) -> None:
    config = make_config(algorithm=algorithm, persistent_momentum=True)
    refusal = r"^train\.persistent_momentum: .* fresh momentum; set it to false$"
    with pytest.raises(FedrcError, match=refusal):
        build_algorithm(config, 4, C)


@pytest.mark.parametrize("algorithm", ["apfl", "pfedme"])
def test_local_adam_and_pfedmes_schedule_are_refused(algorithm: str) -> None:
    """Their rules take SGD steps (pFedMe's at its own rates, which no schedule moves)."""
    config = make_config(algorithm=algorithm, optimizer="adam")
    with pytest.raises(FedrcError, match=r"^train\.optimizer: .* whose steps are SGD's; set it"):
        build_algorithm(config, 4, C)
    scheduled = make_config(algorithm=algorithm, lr_schedule="cosine")
    if algorithm == "apfl":  # its steps take the round's lr
        build_algorithm(scheduled, 4, C)
        return
    with pytest.raises(FedrcError, match=r"^train\.lr_schedule: pfedme steps at its own rates"):
        build_algorithm(scheduled, 4, C)


# --- behaviour: what a personal model does that one global model cannot ---------------------
# The concept-shift benchmark of test_behaviour.py: three equally common concepts, IID labels,
# so one model cannot fit every client, and a model per client can.


def final(run: Path) -> dict:
    return read_metrics(run / METRICS)[-1]


@pytest.mark.slow  # 2–3 minutes on the 2-core CPU
def test_apfl_trains_fedavgs_global_model_and_a_mixture_that_fits_each_client(
    concept_data: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """APFL's global model is FedAvg's, step for step (its w trains on its own loss, as
    FedAvg's model does); its personal mixtures fit each client's concept, which FedAvg's one
    model cannot."""
    runs = {a: train(concept_data, tmp_path / a, rounds=5, algorithm=a) for a in ("fedavg", "apfl")}
    rows = {a: read_metrics(run / METRICS) for a, run in runs.items()}
    for avg, mixed in zip(rows["fedavg"], rows["apfl"]):
        assert mixed["train_loss"] == pytest.approx(avg["train_loss"], rel=1e-5)
        assert mixed["global_accuracy"] == pytest.approx(avg["global_accuracy"], abs=0.02)
    models = [load_state(run / MODEL)["models"] for run in runs.values()]
    torch.testing.assert_close(models[1], models[0], rtol=1e-4, atol=1e-5)
    assert final(runs["apfl"])["local_accuracy"] >= 0.75
    assert final(runs["apfl"])["local_accuracy"] > final(runs["fedavg"])["local_accuracy"] + 0.3


@pytest.mark.slow  # 2 minutes on the 2-core CPU
def test_pfedme_personal_models_fit_each_client_where_fedprox_does_not(
    concept_data: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """pFedMe and FedProx both pull towards a global model; only pFedMe keeps the personal
    model θ_i that the pull is about, and it fits its client's concept."""
    fedprox = final(train(concept_data, tmp_path / "fedprox", rounds=4, algorithm="fedprox"))
    values = dict(personal_lr=0.05, local_lr=0.05)  # a faster global model than the authors'
    pfedme = final(train(concept_data, tmp_path / "pfedme", rounds=4, algorithm="pfedme", **values))
    assert pfedme["local_accuracy"] >= 0.85
    assert pfedme["local_accuracy"] > fedprox["local_accuracy"] + 0.3
