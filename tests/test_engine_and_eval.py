import numpy as np
import pytest
import torch
from torch import nn

from pipeline.algorithms.client import predictions
from pipeline.engine import LocalTask, SequentialExecutor
from pipeline.evaluation.accuracy import concept_purity, label_purity, per_sample_losses


def executor(**kw) -> SequentialExecutor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    args = dict(
        lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=4, local_epochs=1, drop_last=False
    )
    return SequentialExecutor(model, torch.device("cpu"), **{**args, **kw})


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 1, 2, 2), generator=gen, dtype=torch.uint8)
    return images, torch.tensor([0, 1, 2, 0])


def train(ex: SequentialExecutor, start: torch.Tensor, weights: torch.Tensor, **task):
    result = ex.train(LocalTask(0, start, weights, **task), *data(), seed=0)
    return result.params, result.loss_sum


def test_zero_weights_do_not_move_the_model() -> None:
    ex = executor(momentum=0.9)
    start = ex.flatten()
    trained, loss = train(ex, start, torch.zeros(4))
    assert torch.equal(trained, start) and loss == 0.0


def test_weights_scale_the_step() -> None:
    """One full-batch SGD step: weight 2 on every sample = learning rate × 2."""
    ex = executor()
    start = ex.flatten()
    twice, _ = train(ex, start, torch.full((4,), 2.0))
    double_lr, _ = train(executor(lr=0.2), start, torch.ones(4))
    torch.testing.assert_close(twice, double_lr)


def test_proximal_term_pulls_towards_the_anchor() -> None:
    """With zero data weights one step is w ← w − lr·μ(w − a): exactly (1 − lr·μ)w + lr·μ·a."""
    ex = executor()
    start = ex.flatten()
    anchor = torch.zeros_like(start)
    moved, _ = train(ex, start, torch.zeros(4), anchor=anchor, mu=2.0)
    torch.testing.assert_close(moved, start * (1 - 0.1 * 2.0))


def test_offset_logits_enter_the_loss() -> None:
    """A huge offset on the true class makes the loss (and so the step) vanish."""
    ex = executor()
    start = ex.flatten()
    offset = torch.nn.functional.one_hot(data()[1], 3).float() * 100
    moved, loss = train(ex, start, torch.ones(4), offset=offset)
    torch.testing.assert_close(moved, start)
    assert loss < 1e-30


def test_momentum_buffer_round_trips() -> None:
    """Two local runs with a carried buffer = one run of two steps (full batch, same data)."""
    ex = executor(momentum=0.9)
    start = ex.flatten()
    zero = torch.zeros(ex.num_trainable)
    first = ex.train(LocalTask(0, start, torch.ones(4), momentum=zero), *data(), seed=0)
    second = ex.train(
        LocalTask(0, first.params, torch.ones(4), momentum=first.momentum), *data(), seed=0
    )
    both = executor(momentum=0.9, local_epochs=2)
    together, _ = train(both, start, torch.ones(4))
    torch.testing.assert_close(second.params, together)


def test_losses_are_per_sample_cross_entropy() -> None:
    ex = executor()
    models = torch.stack([ex.flatten(), ex.flatten() * 0])
    images, labels = data()
    losses = ex.losses(models, images, labels)
    assert losses.shape == (4, 2)
    torch.testing.assert_close(losses[:, 1], torch.full((4,), float(np.log(3))))
    logits = ex.logits(models, images)
    torch.testing.assert_close(per_sample_losses(logits, labels), losses)


def test_soft_and_hard_predictions() -> None:
    # model 0 says class 0, model 1 says class 1 (more confidently)
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 5.0]]])
    assert predictions(logits, torch.tensor([0.7, 0.3]), hard=True).item() == 0
    # soft: 0.7·softmax(2,0) + 0.3·softmax(0,5) = (0.618, 0.382)... class 0
    assert predictions(logits, torch.tensor([0.7, 0.3]), hard=False).item() == 0
    assert predictions(logits, torch.tensor([0.4, 0.6]), hard=False).item() == 1


def test_concept_purity() -> None:
    sizes = np.ones(4)
    concepts = np.array([0, 0, 1, 1])
    separated = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=float)
    merged = np.array([[1, 0], [1, 0], [1, 0], [1, 0]], dtype=float)
    mixed = np.array([[0.5, 0.5]] * 4)
    assert concept_purity(separated, concepts, sizes) == 1.0
    assert concept_purity(merged, concepts, sizes) == 0.5  # one concept has no cluster left
    assert concept_purity(mixed, concepts, sizes) == 0.5
    assert concept_purity(np.ones((4, 1)), concepts, sizes) is None
    weighted = concept_purity(merged, concepts, np.array([3.0, 3.0, 1.0, 1.0]))
    assert weighted == pytest.approx(0.75)


def test_label_purity() -> None:
    """Two clients with labels {0: 3} and {1: 1}: clusters that follow them score 1, clusters
    that hold every client half and half 1/K = ½, a single cluster nothing."""
    histograms = np.array([[3.0, 0.0], [0.0, 1.0]])
    assert label_purity(np.eye(2), histograms) == 1.0
    assert label_purity(np.full((2, 2), 0.5), histograms) == 0.5
    # client 0 ¾ in cluster 0: label 0 mass (2.25, 0.75), label 1 mass (0, 1) → (2.25 + 1) / 4
    assert label_purity(np.array([[0.75, 0.25], [0.0, 1.0]]), histograms) == pytest.approx(0.8125)
    assert label_purity(np.ones((2, 1)), histograms) is None
