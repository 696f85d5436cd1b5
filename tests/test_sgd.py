"""The sequential executor's SGD step (`pipeline.engine.sgd`) against torch.optim.SGD: the same
parameters and momentum, bit for bit, step after step."""

from __future__ import annotations

import pytest
import torch

from pipeline.engine.sgd import LocalSGD


def run(optimizer_of, steps: int, start_buffers: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [
        torch.randn(50, 7, generator=g).requires_grad_(),
        torch.randn(13, generator=g).requires_grad_(),
    ]
    buffers = [torch.randn(p.shape, generator=g) for p in params] if start_buffers else None
    optimizer, momentum_of = optimizer_of(params, buffers)
    for step in range(steps):
        loss = sum(((p - step) ** 2 * (i + 1)).sum() for i, p in enumerate(params))
        for p in params:
            p.grad = None
        loss.backward()
        optimizer.step()
    return [p.detach() for p in params], momentum_of(params)


def torch_sgd(momentum: float, weight_decay: float):
    def make(params, buffers):
        optimizer = torch.optim.SGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay)
        if buffers is not None:
            for p, b in zip(params, buffers):
                optimizer.state[p]["momentum_buffer"] = b.clone()

        def momentum_of(params):
            return torch.cat(
                [
                    optimizer.state[p].get("momentum_buffer", torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
            )

        return optimizer, momentum_of

    return make


def local_sgd(momentum: float, weight_decay: float):
    def make(params, buffers):
        sgd = LocalSGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay)
        sgd.start(buffers)
        return sgd, lambda params: sgd.flat_momentum()

    return make


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
@pytest.mark.parametrize("start_buffers", [False, True])
@pytest.mark.parametrize("steps", [1, 4])
def test_the_same_bits_as_torch(
    momentum: float, weight_decay: float, start_buffers: bool, steps: int
) -> None:
    ours = run(local_sgd(momentum, weight_decay), steps, start_buffers)
    theirs = run(torch_sgd(momentum, weight_decay), steps, start_buffers)
    for a, b in zip(ours[0], theirs[0]):
        assert torch.equal(a, b)
    assert torch.equal(ours[1], theirs[1])


def test_a_parameter_without_a_gradient_is_left_alone() -> None:
    used, unused = torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)
    sgd = LocalSGD([used, unused], lr=0.1, momentum=0.9, weight_decay=0.1)
    (used * 2).sum().backward()
    sgd.step()
    assert torch.equal(unused.detach(), torch.ones(2)) and sgd.buffers[1] is None
    assert not torch.equal(used.detach(), torch.ones(3))
