"""Local trainings that plain SGD on one model does not express: a `LocalRule`.

Some methods train two models together on each batch: APFL moves a global copy w and a personal
model v whose loss is on their mixture; pFedMe solves a personal model θ's proximal problem and
pulls its local model towards θ. A task with a `rule` (`LocalTask.rule`) hands its training to
the rule, batch by batch. The executor keeps what it keeps for every task: the batches (the same
seeded order, epochs and sizes as a plain training), the module, the device and the precision.
The rule keeps its models as flat vectors, computes their outputs with `Net.logits` (the module
run on any flat parameters) and moves them with its own steps, taking `Net.sgd` where its paper
takes a plain SGD step (the run's momentum and weight decay). It returns the task's trained row,
which the algorithm folds as any other, and named extras (a personal model, a mixing weight):
`LocalResult.extras`.

Only the sequential executor runs rules (the algorithm sets `needs_sequential`). Momentum starts
fresh in every training (persistent momentum does not combine with a rule), and the task's
per-sample weights are not used: a rule weighs every sample alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class Net:
    """The executor's module as a function of flat models, for a rule (`LocalRule`)."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor  # a SequentialExecutor (not imported: it imports this module)
        model = executor.model
        self.trainable = executor.num_trainable
        self._params = [(name, p.shape) for name, p in model.named_parameters()]
        floating = [(n, b.shape) for n, b in model.named_buffers() if b.is_floating_point()]
        self._buffers = floating
        self._momentum: dict[str, torch.Tensor] = {}

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A flat model as fresh (parameters, buffers) on the executor's device, the parameters
        a leaf that takes gradients."""
        flat = flat.to(self.executor.device, torch.float32)
        params = flat[: self.trainable].clone().requires_grad_(True)
        return params, flat[self.trainable :].clone()

    @staticmethod
    def join(params: torch.Tensor, buffers: torch.Tensor) -> torch.Tensor:
        """The flat model of (parameters, buffers): the layout of a task's `start`."""
        return torch.cat([params.detach(), buffers])

    def logits(self, params: torch.Tensor, buffers: torch.Tensor, images: torch.Tensor):
        """The module's float32 output on uint8 `images` with these parameters (gradients flow
        to `params`) and buffers (a BatchNorm updates them in place, as in a plain training)."""
        tensors = _shaped(self._params, params) | _shaped(self._buffers, buffers)
        return self.executor.forward_with(tensors, images)

    def sgd(self, key: str, params: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        """One step of the run's SGD on `params`, in place: `torch.optim.SGD`'s update with the
        executor's momentum and weight decay, a momentum buffer per `key` (fresh at its first
        step, as in a plain training)."""
        executor = self.executor
        with torch.no_grad():
            if executor.weight_decay != 0:
                grad = grad.add(params, alpha=executor.weight_decay)
            if executor.momentum != 0:
                buf = self._momentum.get(key)
                if buf is None:
                    buf = self._momentum[key] = grad.clone()
                else:
                    buf.mul_(executor.momentum).add_(grad)
                grad = buf
            params.add_(grad, alpha=-lr)


class LocalRule(ABC):
    """A local training of its own (module docstring); one object per task, which keeps its
    models between batches."""

    @abstractmethod
    def begin(self, net: Net, start: torch.Tensor) -> None:
        """Before the first batch; `start` is the task's (P,) flat model."""

    @abstractmethod
    def batch(self, net: Net, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One batch (uint8 images, labels); returns its Σ_b f(x_b, y_b) of the row the task
        trains (detached), for the round's train loss."""

    @abstractmethod
    def end(self, net: Net) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """After the last batch: the task's trained (P,) row and the named extras."""


def _shaped(layout: list[tuple[str, torch.Size]], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """`flat` cut into views named and shaped as `layout`."""
    pieces = flat.split([shape.numel() for _, shape in layout])
    return {name: piece.view(shape) for (name, shape), piece in zip(layout, pieces)}


class StepLosses(LocalRule):
    """The plain local training (the run's SGD on the mean loss of each batch) that also returns
    each batch's mean loss, in order: extras `losses` (steps,). FedGWC's clients send them."""

    def begin(self, net: Net, start: torch.Tensor) -> None:
        self.params, self.buffers = net.split(start)
        self.losses: list[torch.Tensor] = []

    def batch(self, net: Net, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = net.logits(self.params, self.buffers, images)
        losses = torch.nn.functional.cross_entropy(out, labels, reduction="none")
        (grad,) = torch.autograd.grad(losses.mean(), self.params)
        net.sgd("w", self.params, grad, net.executor.lr)
        self.losses.append(losses.detach().mean())
        return losses.detach().sum().double()

    def end(self, net: Net) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        losses = torch.stack(self.losses) if self.losses else torch.zeros(0)
        return net.join(self.params, self.buffers), {"losses": losses.double().cpu()}
