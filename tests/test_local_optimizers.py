"""The local optimizers beside SGD (Adam, AdamW) and early stopping: the sequential executor
against `torch.optim.Adam` / `AdamW` bit for bit, the batched executor against the sequential
one, and Flash's stopping rule on a hand-made case."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_batched import batchnorm_net, cnn, jobs
from test_local_sgd import compact_model, data, loose_model

from pipeline.engine import BatchedExecutor, LocalTask, SequentialExecutor
from pipeline.engine.local_opt import Adam, local_rule
from pipeline.engine.sequential import as_input

KW = dict(lr=0.01, momentum=0.9, batch_size=3, local_epochs=2, drop_last=False)


def executor(build, cls=SequentialExecutor, **kw) -> SequentialExecutor:
    torch.manual_seed(0)
    return cls(build(), torch.device("cpu"), **kw)


def torch_reference(build, start, task: LocalTask, seed: int, kw: dict) -> torch.Tensor:
    """The same training with torch.optim.Adam or AdamW (single-tensor path) on a module."""
    model = build()
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(start[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    cls = torch.optim.AdamW if kw["optimizer"] == "adamw" else torch.optim.Adam
    opt = cls(
        model.parameters(), lr=kw["lr"], betas=kw["betas"], eps=kw["eps"],
        weight_decay=kw["weight_decay"], foreach=False,
    )  # fmt: skip
    images, labels, weights = data()
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(kw["local_epochs"]):
        order = torch.randperm(labels.shape[0], generator=gen)
        for s in range(0, labels.shape[0], kw["batch_size"]):
            idx = order[s : s + kw["batch_size"]]
            out = model(as_input(images[idx]))
            loss = (weights[idx] * F.cross_entropy(out, labels[idx], reduction="none")).sum()
            opt.zero_grad()
            (loss / idx.numel()).backward()
            opt.step()
    return torch.cat([t.detach().reshape(-1) for t in tensors])


@pytest.mark.parametrize("build", [compact_model, loose_model], ids=["compact", "loose"])
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_local_adam_is_torch_adam_bit_for_bit(build, optimizer: str, weight_decay: float) -> None:
    kw = dict(KW, optimizer=optimizer, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay)
    ex = executor(build, **kw)
    gen = torch.Generator().manual_seed(1)
    start = ex.flatten() + 0.01 * torch.randn(ex.num_params, generator=gen)
    images, labels, weights = data()
    got = ex.train(LocalTask(0, start, weights), images, labels, seed=5)
    assert torch.equal(
        got.params, torch_reference(build, start, LocalTask(0, start, weights), 5, kw)
    )
    assert got.momentum is None


def test_adam_step_by_hand() -> None:
    """Two steps of Adam on one number: g = 1 then g = −1 (β = 0.5, 0.5; ε = 0; η = 0.1).
    t = 1: m = 0.5, v = 0.5, m̂ = 1, v̂ = 1 → θ = 1 − 0.1 = 0.9;
    t = 2: m = −0.25, v = 0.75, m̂ = −1/3, v̂ = 1 → θ = 0.9 + 0.1/3."""
    rule = Adam(0.5, 0.5, 0.0)
    theta, m, v = torch.ones(1, dtype=torch.float64), *torch.zeros(2, 1, dtype=torch.float64)
    theta, m, v = rule.step(theta, torch.ones(1, dtype=torch.float64), m, v, 1, 0.1)
    assert (float(theta), float(m), float(v)) == pytest.approx((0.9, 0.5, 0.5))
    theta, m, v = rule.step(theta, -torch.ones(1, dtype=torch.float64), m, v, 2, 0.1)
    assert (float(theta), float(m), float(v)) == pytest.approx((0.9 + 0.1 / 3, -0.25, 0.75))
    # AdamW with λ = 0.5 first shrinks θ by η λ: 1 → 0.95, then the same step
    decoupled = Adam(0.5, 0.5, 0.0, weight_decay=0.5, decoupled=True)
    start, zeros = torch.ones(1, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64)
    got = decoupled.step(start, torch.ones(1, dtype=torch.float64), *zeros, 1, 0.1)[0]
    assert float(got) == pytest.approx(0.95 - 0.1)
    assert float(start) == 1.0  # inputs are left as they were
    assert local_rule("sgd", (0.9, 0.999), 1e-8, 0.0) is None


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("build", [cnn, batchnorm_net])
def test_batched_adam_matches_sequential(optimizer: str, build) -> None:
    """Clients of different sizes (masked steps keep their moments), a proximal pull, an
    offset: the batched executor's Adam is the sequential one's up to float rounding.

    ε is 1e-3 here: Adam divides each gradient by its own running scale, so a gradient that is
    zero in exact arithmetic but rounding noise in floats (a convolution's bias before
    BatchNorm; a dead ReLU of the CNN on random images) becomes a step of up to ±lr whose sign
    the last bit decides, and the two executors' convolutions round differently. At ε = 1e-8
    a few parameters in a thousand differ (measured: 126 of 193,412 in the CNN by at most 2e-4
    at lr 0.01, and the biases before BatchNorm by up to 0.06 with AdamW); at 1e-3 none is
    more than 5e-6 apart. SGD scales such noise by the lr alone (tests/test_batched.py)."""
    kw = dict(lr=0.01, momentum=0.9, weight_decay=1e-3, batch_size=8, local_epochs=2)
    kw.update(drop_last=False, optimizer=optimizer, eps=1e-3)
    seq = executor(build, **kw)
    bat = executor(build, BatchedExecutor, **kw, chunk_tasks=4)
    work = [job for job in jobs(seq) if job[0].momentum is None]  # no persistent momentum
    for a, b in zip(seq.train_many(work), bat.train_many(work), strict=True):
        torch.testing.assert_close(b.params, a.params, atol=1e-5, rtol=0)
        assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5)
        assert a.momentum is None and b.momentum is None


def test_a_new_lr_reaches_both_executors() -> None:
    """The round loop sets `lr` between rounds (a schedule): both executors then train at it,
    and a step at lr 0 leaves the model where it was."""
    kw = dict(KW, weight_decay=0.0, batch_size=8)
    seq, bat = executor(cnn, **kw), executor(cnn, BatchedExecutor, **kw)
    work = jobs(seq)[:3]
    for ex in (seq, bat):
        ex.lr = 0.0
    for a, b, (task, *_) in zip(seq.train_many(work), bat.train_many(work), work, strict=True):
        assert torch.equal(a.params, task.start) and torch.equal(b.params, task.start)


def test_early_stopping_stops_when_the_loss_gains_too_little() -> None:
    """Flash's client rule: after epoch e (with more to go) the loss L_e on the client's
    samples; stop when L_{e−1} − L_e < γ / e. A γ no loss gain reaches stops after epoch 2,
    γ = 0 runs every epoch, and the result is the model after the epochs that ran."""
    kw = dict(KW, local_epochs=4, weight_decay=0.0)
    ex = executor(compact_model, **kw)
    start = ex.flatten()
    images, labels, weights = data()
    losses = []
    real = ex.early_stop_loss
    ex.early_stop_loss = lambda *a: losses.append(real(*a)) or losses[-1]
    stopped = ex.train(LocalTask(0, start, weights, stop_gain=1e6), images, labels, seed=3)
    assert len(losses) == 2  # L_1 (compared with ∞), then L_2: a gain below γ / 2 stops
    losses.clear()
    full = ex.train(LocalTask(0, start, weights), images, labels, seed=3)
    assert not losses  # γ = 0: no check at all
    two = executor(compact_model, **dict(kw, local_epochs=2))
    after_two = two.train(LocalTask(0, start, weights), images, labels, seed=3)
    assert torch.equal(stopped.params, after_two.params)
    assert not torch.equal(stopped.params, full.params)
    assert stopped.loss_sum == pytest.approx(after_two.loss_sum)
    # the loss it checks is the model's mean loss on the samples, in eval mode
    mean = float((weights * ex.losses(after_two.params[None], images, labels)[:, 0]).sum())
    ex.early_stop_loss = real
    ex.load(after_two.params)
    assert real(LocalTask(0, start, weights), images, labels) == pytest.approx(
        mean / float(weights.sum()), rel=1e-6
    )
    assert math.isfinite(mean)


def test_the_batched_executor_refuses_early_stopping() -> None:
    bat = executor(cnn, BatchedExecutor, **dict(KW, weight_decay=0.0))
    task, x, y, seed = jobs(bat)[0]
    task.stop_gain = 0.1
    with pytest.raises(ValueError, match="early stopping"):
        bat.train(task, x, y, seed)
