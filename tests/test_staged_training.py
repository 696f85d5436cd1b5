"""Staged local training (`LocalTask.stages`, FedCCFA's decoupled training) on the sequential
executor: which slice trains, class-balanced sampling, the alignment term, the prototypes, and
the executor choice for algorithms that need it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.common.errors import FedrcError
from pipeline.data.shards import load_federated
from pipeline.engine import LocalTask, SequentialExecutor
from pipeline.engine.sequential import alignment, as_input, balanced_rows
from pipeline.engine.task import Stage
from pipeline.models.layout import head_range
from pipeline.run import setup as run_setup
from pipeline.run import training
from pipeline.run.resolve import make_config

SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-5, batch_size=8, local_epochs=2, drop_last=False)


def tiny() -> tuple[SequentialExecutor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    executor = SequentialExecutor(model, torch.device("cpu"), **SGD)
    images = torch.randint(0, 256, (30, 1, 2, 6), dtype=torch.uint8)
    labels = torch.tensor([0] * 14 + [1] * 10 + [2] * 6)
    return executor, executor.flatten(), images, labels


def test_head_only_and_body_only_stages_leave_the_other_part_bit_identical() -> None:
    executor, start, images, labels = tiny()
    head = head_range(executor.model)
    assert head == (104, 131)  # L1 96 + 8, then L2 24 + 3
    ones = torch.ones(30)
    only_head = LocalTask(0, start, ones, stages=(Stage(2, 0.1, train=head),))
    out = executor.train(only_head, images, labels, seed=1).params
    assert torch.equal(out[: head[0]], start[: head[0]])
    assert not torch.equal(out[head[0] :], start[head[0] :])
    only_body = LocalTask(0, start, ones, stages=(Stage(2, 0.1, freeze=head),))
    out = executor.train(only_body, images, labels, seed=1).params
    assert torch.equal(out[head[0] :], start[head[0] :])
    assert not torch.equal(out[: head[0]], start[: head[0]])
    assert all(p.requires_grad for p in executor.params)  # restored for the next task
    with pytest.raises(ValueError, match="cuts the parameter"):
        executor.train(LocalTask(0, start, ones, stages=(Stage(1, 0.1, train=(100, 131)),)),
                       images, labels, seed=1)  # fmt: skip


def test_one_whole_model_stage_is_the_plain_training_bit_for_bit() -> None:
    """Same epochs, lr and data: the staged path draws the same batches and takes the same
    steps as the plain one (the plain path is what every existing algorithm runs)."""
    executor, start, images, labels = tiny()
    weights = torch.linspace(0.5, 1.5, 30)
    plain = executor.train(LocalTask(0, start, weights), images, labels, seed=7)
    staged = executor.train(
        LocalTask(0, start, weights, stages=(Stage(2, 0.1),)), images, labels, seed=7
    )
    assert torch.equal(plain.params, staged.params)
    assert staged.loss_sum == pytest.approx(plain.loss_sum, rel=1e-12)


def test_class_balanced_sampling_draws_each_class_equally_without_replacement() -> None:
    labels = torch.tensor([0] * 10 + [1] * 3 + [2] * 7 + [4] * 5)  # class 3 absent
    gen = torch.Generator().manual_seed(0)
    rows = balanced_rows(labels, 5, gen)  # min(5, smallest present class 3) = 3 each
    assert torch.bincount(labels[rows], minlength=5).tolist() == [3, 3, 3, 0, 3]
    assert rows.unique().numel() == rows.numel()
    rows = balanced_rows(labels, 2, gen)
    assert torch.bincount(labels[rows], minlength=5).tolist() == [2, 2, 2, 0, 2]


def test_a_balanced_stage_trains_on_the_balanced_subset_only(monkeypatch) -> None:
    executor, start, images, labels = tiny()
    seen = []
    original = executor.model.forward
    monkeypatch.setattr(executor.model, "forward", lambda x: seen.append(len(x)) or original(x))
    task = LocalTask(0, start, torch.ones(30), stages=(Stage(3, 0.1, balanced=4),))
    result = executor.train(task, images, labels, seed=0)
    assert seen == [8, 4] * 3  # 3 epochs over 4 × 3 classes, batches of 8
    assert result.loss_sum == 0.0  # a balanced subset is not counted in the train loss


def test_alignment_term_matches_hand_computation() -> None:
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # cos = [[1, 0], [0, 1]], τ = 1: ℓ = −log(e / (e + 1)) = log(1 + e⁻¹) for both samples
    ell = alignment(h, torch.tensor([0, 1]), anchors, 1.0)
    torch.testing.assert_close(ell, torch.full((2,), math.log(1 + math.exp(-1))))
    # τ = 0.5 doubles the logits: log(1 + e⁻²)
    ell = alignment(h, torch.tensor([0, 1]), anchors, 0.5)
    torch.testing.assert_close(ell, torch.full((2,), math.log(1 + math.exp(-2))))
    # class 1 without an anchor (NaN row): class 0 alone, ℓ = 0; a class-1 sample adds 0
    missing = torch.tensor([[1.0, 0.0], [math.nan, math.nan]])
    torch.testing.assert_close(alignment(h, torch.tensor([0, 1]), missing, 1.0), torch.zeros(2))


def test_l2_alignment_matches_hand_computation_and_the_authors_mse() -> None:
    """`penalize: L2`: ℓ_b = ‖h_b − A_{y_b}‖² / D, so the batch mean is MSELoss(h, A_y)."""
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # own anchors: (0, 0) → 0 and (0, 1) → 1/2; the other class's: (1, −1) → 1, (−1, 2) → 5/2
    ell = alignment(h, torch.tensor([0, 1]), anchors, 0.1, "L2")
    torch.testing.assert_close(ell, torch.tensor([0.0, 0.5]))
    ell = alignment(h, torch.tensor([1, 0]), anchors, 0.1, "L2")
    torch.testing.assert_close(ell, torch.tensor([1.0, 2.5]))
    mse = nn.MSELoss()(h, anchors[torch.tensor([1, 0])])
    torch.testing.assert_close(ell.mean(), mse)
    # class 1 without an anchor: its sample adds 0, and no NaN reaches the gradient
    missing = torch.tensor([[1.0, 0.0], [math.nan, math.nan]])
    x = torch.tensor([[3.0, 0.0], [0.0, 2.0]], requires_grad=True)
    ell = alignment(x, torch.tensor([0, 1]), missing, 0.1, "L2")
    torch.testing.assert_close(ell, torch.tensor([2.0, 0.0]))  # ‖(2, 0)‖² / 2
    ell.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[2.0, 0.0], [0.0, 0.0]]))  # 2(h − A)/D


def test_alignment_moves_the_extractor_and_prototypes_are_class_means() -> None:
    executor, start, images, labels = tiny()
    head = head_range(executor.model)
    anchors = torch.randn(3, 8)
    stage = dict(freeze=head, temperature=0.1)
    plain = LocalTask(0, start, torch.ones(30), stages=(Stage(1, 0.1, **stage),), prototypes=True)
    pulled = LocalTask(
        0, start, torch.ones(30), stages=(Stage(1, 0.1, align=1.0, **stage),),
        class_anchors=anchors, prototypes=True,
    )  # fmt: skip
    a = executor.train(plain, images, labels, seed=3)
    b = executor.train(pulled, images, labels, seed=3)
    assert not torch.equal(a.params, b.params)
    l2 = LocalTask(
        0, start, torch.ones(30), stages=(Stage(1, 0.1, align=1.0, penalize="L2", **stage),),
        class_anchors=anchors,
    )  # fmt: skip
    c = executor.train(l2, images, labels, seed=3)
    assert not torch.equal(c.params, a.params) and not torch.equal(c.params, b.params)
    assert torch.equal(c.params[head[0] :], start[head[0] :])  # the classifier stays fixed
    assert a.loss_sum == pytest.approx(executor.train(plain, images, labels, seed=3).loss_sum)
    # the prototypes: mean of the final layer's input per class, under the trained model
    executor.load(b.params)
    with torch.no_grad():
        h = executor.model[:3](as_input(images))
    expected = torch.stack([h[labels == c].mean(0) for c in range(3)])
    torch.testing.assert_close(b.prototypes, expected)
    assert b.prototypes.shape == (3, 8)


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """make_executor's choice, without building an executor (the CUDA branch runs on a CPU)."""
    made: list[str] = []
    monkeypatch.setattr(run_setup, "BatchedExecutor", lambda *a, **k: made.append("batched"))
    monkeypatch.setattr(run_setup, "SequentialExecutor", lambda *a, **k: made.append("sequential"))
    return made


def test_needs_sequential_algorithms_take_the_plain_loop_on_cuda(
    calls: list[str], tiny_data: Path
) -> None:
    data, cuda = load_federated(tiny_data), torch.device("cuda")
    training.make_executor(make_config(algorithm="fedavg"), data, cuda)
    training.make_executor(make_config(algorithm="fedccfa"), data, cuda)
    assert calls == ["batched", "sequential"]
    with pytest.raises(FedrcError, match=r"^train\.executor: fedccfa trains in stages"):
        training.make_executor(make_config(algorithm="fedccfa", executor="batched"), data, cuda)
