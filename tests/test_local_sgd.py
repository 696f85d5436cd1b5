"""The sequential executor's local training against `torch.optim.SGD`, bit for bit, and the
fold of a result into float64 sums against torch's own mixed-dtype add."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline.algorithms.base as base
from pipeline.engine import LocalTask, SequentialExecutor
from pipeline.engine.sequential import as_input


def compact_model() -> nn.Module:
    """Every tensor starts on a 64-byte boundary of the flat layout (64, 16, then 48 floats)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3, bias=False)
    )


def loose_model() -> nn.Module:
    """The bias starts 48 bytes into the flat layout: the module keeps its own tensors."""
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (n, 1, 2, 2), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, 3, (n,), generator=gen), torch.rand(n, generator=gen)


def executor(build, **kw) -> SequentialExecutor:
    torch.manual_seed(0)
    return SequentialExecutor(build(), torch.device("cpu"), **kw)


def reference(build, start, task: LocalTask, seed: int, kw: dict):
    """The same training written with torch.optim.SGD on a module of its own."""
    model = build()
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(start[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    params = list(model.parameters())
    opt = torch.optim.SGD(
        params, lr=kw["lr"], momentum=kw["momentum"], weight_decay=kw["weight_decay"]
    )
    if task.momentum is not None:
        sizes = [p.numel() for p in params]
        for p, buf in zip(params, task.momentum.split(sizes)):
            opt.state[p]["momentum_buffer"] = buf.view_as(p).clone()
    images, labels, weights = data()
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(kw["local_epochs"]):
        order = torch.randperm(labels.shape[0], generator=gen)
        for s in range(0, labels.shape[0], kw["batch_size"]):
            idx = order[s : s + kw["batch_size"]]
            loss = (
                weights[idx]
                * F.cross_entropy(model(as_input(images[idx])), labels[idx], reduction="none")
            ).sum()
            opt.zero_grad()
            (loss / idx.numel()).backward()
            if task.anchor is not None:
                with torch.no_grad():
                    sizes = [p.numel() for p in params]
                    for p, a in zip(params, task.anchor[: sum(sizes)].split(sizes)):
                        p.grad.add_(p - a.view_as(p), alpha=task.mu)
            opt.step()
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    momentum = None
    if task.momentum is not None:
        momentum = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in params])
    return flat, momentum


@pytest.mark.parametrize("build", [compact_model, loose_model], ids=["compact", "loose"])
@pytest.mark.parametrize(
    "sgd",
    [
        dict(momentum=0.9, weight_decay=0.0, local_epochs=1, batch_size=16),  # one step
        dict(momentum=0.9, weight_decay=0.0, local_epochs=2, batch_size=3),
        dict(momentum=0.9, weight_decay=5e-4, local_epochs=2, batch_size=3),
        dict(momentum=0.0, weight_decay=0.0, local_epochs=2, batch_size=3),
    ],
    ids=["one-step", "momentum", "momentum-decay", "plain"],
)
@pytest.mark.parametrize("extra", ["none", "anchor", "momentum"])
def test_local_training_is_torch_sgd_bit_for_bit(build, sgd: dict, extra: str) -> None:
    kw = dict(lr=0.1, drop_last=False, **sgd)
    ex = executor(build, **kw)
    assert ex.compact == (build is compact_model)
    gen = torch.Generator().manual_seed(1)
    start = ex.flatten() + 0.01 * torch.randn(ex.num_params, generator=gen)
    images, labels, weights = data()
    task = LocalTask(0, start, weights)
    if extra == "anchor":
        task = LocalTask(0, start, weights, anchor=torch.zeros(ex.num_params), mu=0.5)
    if extra == "momentum":
        task = LocalTask(
            0, start, weights, momentum=0.1 * torch.randn(ex.num_trainable, generator=gen)
        )
    got = ex.train(task, images, labels, seed=5)
    flat, momentum = reference(build, start, task, 5, kw)
    assert torch.equal(got.params, flat)
    assert (got.momentum is None) == (momentum is None)
    if momentum is not None:
        assert torch.equal(got.momentum, momentum)


@pytest.mark.parametrize("build", [compact_model, loose_model], ids=["compact", "loose"])
def test_a_result_is_never_written_by_later_work(build) -> None:
    """A compact layout trains in the result's own memory: afterwards the module must be back
    on its own tensors, so that the next training, `load` and `logits` leave the result be."""
    ex = executor(
        build, lr=0.1, momentum=0.9, weight_decay=0.0, batch_size=3, local_epochs=1, drop_last=False
    )
    images, labels, weights = data()
    start = ex.flatten()
    first = ex.train(LocalTask(0, start, weights), images, labels, seed=0).params
    kept = first.clone()
    assert not torch.equal(first, start)
    second = ex.train(LocalTask(0, first, weights), images, labels, seed=1).params
    kept_second = second.clone()
    ex.logits(torch.stack([start, first]), images)
    ex.load(torch.zeros_like(start))
    assert torch.equal(first, kept) and torch.equal(second, kept_second)
    assert torch.equal(ex.flatten(), torch.zeros_like(start))  # `load` still reaches the module


def test_the_fold_is_torchs_mixed_dtype_add(monkeypatch: pytest.MonkeyPatch) -> None:
    """`add_into` casts a float32 result a block at a time: the numbers of `add_` with alpha."""
    monkeypatch.setattr(base, "FOLD_CHUNK", 7)  # several blocks and a short last one
    gen = torch.Generator().manual_seed(0)
    sums = torch.randn(50, generator=gen, dtype=torch.float64)
    expected = sums.clone()
    for weight in (0.3, 1.7, 1e-3):
        vector = torch.randn(50, generator=gen)
        expected.add_(vector, alpha=weight)
        base.add_into(sums, vector, weight)
    assert torch.equal(sums, expected)


def test_training_after_inference_is_in_training_mode() -> None:
    """`logits` leaves the module in eval mode; the next training switches it back (BatchNorm
    then normalizes with the batch's statistics), as a fresh executor's training does."""
    kw = dict(lr=0.1, momentum=0.9, weight_decay=0.0, batch_size=3, local_epochs=1, drop_last=False)
    images, labels, weights = data()
    used, fresh = executor(compact_model, **kw), executor(compact_model, **kw)
    start = fresh.flatten()
    used.logits(start[None], images)
    assert not used.model[2].training
    got = used.train(LocalTask(0, start, weights), images, labels, seed=2).params
    assert used.model[2].training
    expected = fresh.train(LocalTask(0, start, weights), images, labels, seed=2).params
    assert torch.equal(got, expected)
