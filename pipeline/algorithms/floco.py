"""Floco (Grinwald, Wiesner & Nakajima, NeurIPS 2024): federated learning over connected modes,
each client training its own region of a shared solution simplex.

The model's final linear layer becomes a simplex of M endpoint weights W_1 … W_M with one bias:
W(α) = Σ_m α_m W_m (`SimplexLinear`; α is a buffer, the flat model's last M numbers). Every
client trains the whole model, drawing a point α for each batch:
- before round τ, uniformly from the simplex (normalised exponential draws);
- in round τ every participating client trains (the authors' projection round); from the
  pseudo-gradients of their endpoints g_i = W(start) − W_i(trained) the server takes the first M
  principal components κ_i and projects them onto the simplex: β_i = the Euclidean projection
  of κ_i onto {Σ β = z, β ≥ 0}, scaled to sum 1, for the z in 1000 steps of (10⁻⁴, 1] whose
  points spread most evenly (the least Riesz s-energy, log mean 1/d² over the pairs);
- after round τ, client i draws α = β_i + r u, r uniform in [0, ρ] and u = sign(v)|v| / Σ|v|,
  v uniform in [−1, 1]^M: its subregion (the authors' `_sample_L1_ball`, not clipped).
The server averages every parameter (FedAvg). A projected client predicts at its region's
centre β_i (its personal model: the global model with α = β_i); the global model, and so a
held-out client or one not yet projected, at the simplex's centre α = 1/M.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.algorithms import described
from pipeline.algorithms.personal import OneModelByRule
from pipeline.algorithms.settings import FlocoSettings
from pipeline.common.errors import FedrcError
from pipeline.engine.rows import RowStore
from pipeline.engine.rules import LocalRule, Net
from pipeline.engine.task import LocalResult, LocalTask

SCALES = np.linspace(1e-4, 1, 1000)  # the z the authors try for the simplex's scale


class SimplexLinear(nn.Module):
    """A linear layer whose weight is the point α of a simplex of M endpoint weights."""

    def __init__(self, linear: nn.Linear, endpoints: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.empty(endpoints, *linear.weight.shape))
        with torch.no_grad():
            for w in self.weights:
                nn.init.xavier_normal_(w)  # each endpoint as the authors initialise it
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.register_buffer("alphas", torch.full((endpoints,), 1.0 / endpoints))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.einsum("m,moi->oi", self.alphas.to(self.weights.dtype), self.weights)
        return F.linear(x, weight, self.bias)


def simplex_model(model: nn.Module, endpoints: int) -> nn.Module:
    """`model` with its final layer (the last module owning parameters) a `SimplexLinear`."""
    names = [n for n, m in model.named_modules() if any(True for _ in m.parameters(False))]
    parent_name, _, attribute = names[-1].rpartition(".")
    final = model.get_submodule(names[-1])
    if not isinstance(final, nn.Linear) or final.bias is None:
        raise FedrcError("train.model: floco needs a linear final layer with a bias")
    setattr(model.get_submodule(parent_name), attribute, SimplexLinear(final, endpoints))
    return model


def uniform_simplex(count: int, gen: torch.Generator) -> torch.Tensor:
    """A point drawn uniformly from the simplex: normalised exponential draws."""
    draws = -torch.log(torch.rand(count, generator=gen, dtype=torch.float64))
    return draws / draws.sum()


def l1_ball(centre: torch.Tensor, radius: float, gen: torch.Generator) -> torch.Tensor:
    """centre + r u: u = sign(v)|v| / Σ|v|, v uniform in [−1, 1]^M, r uniform in [0, ρ]."""
    v = torch.rand(centre.numel(), generator=gen, dtype=torch.float64) * 2 - 1
    u = torch.sign(v) * v.abs() / v.abs().sum()
    return centre + float(torch.rand(1, generator=gen, dtype=torch.float64)) * radius * u


def principal_components(points: np.ndarray, count: int) -> np.ndarray:
    """The first `count` principal components of the rows (scikit-learn's PCA.fit_transform:
    centred, each axis signed so that its largest entry is positive)."""
    centred = points - points.mean(0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    axes = axes[:count]
    axes *= np.sign(axes[np.arange(count), np.abs(axes).argmax(1)])[:, None]
    return centred @ axes.T


def onto_simplex(kappas: np.ndarray, z: float) -> np.ndarray:
    """Each row's Euclidean projection onto {β ≥ 0, Σ β = z} (Duchi et al., 2008)."""
    ordered = np.sort(kappas, axis=1)[:, ::-1]
    sums = np.cumsum(ordered, axis=1) - z
    ranks = np.arange(1, kappas.shape[1] + 1)
    support = np.count_nonzero(ordered - sums / ranks > 0, axis=1)
    shift = sums[np.arange(len(kappas)), support - 1] / support
    return np.maximum(kappas - shift[:, None], 0)


def riesz_energy(points: np.ndarray) -> float:
    """log of the mean of 1/d² over the pairs of points (distances floored at 10⁻⁴)."""
    gaps = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    pairs = gaps[np.triu_indices(len(points), 1)]
    pairs = np.maximum(pairs, 1e-4)
    return float(np.log((1 / pairs**2).sum()) - np.log(len(pairs)))


def project_clients(gradients: np.ndarray, endpoints: int) -> np.ndarray:
    """β (clients, M): the clients' pseudo-gradients' principal components projected onto the
    simplex at the scale whose points have the least Riesz energy (module docstring)."""
    kappas = principal_components(gradients, endpoints)
    best, lowest = None, np.inf
    for z in SCALES:
        betas = onto_simplex(kappas, z)
        betas = betas / betas.sum(1, keepdims=True)
        energy = riesz_energy(betas)
        if np.isfinite(energy) and energy < lowest:
            best, lowest = betas, energy
    return best


class FlocoRule(LocalRule):
    """The plain local training, with a point α of the client's region drawn for each batch."""

    def __init__(self, centre: torch.Tensor | None, radius: float, seed: int, count: int):
        self.centre, self.radius, self.count = centre, radius, count
        self.gen = torch.Generator().manual_seed(seed)

    def begin(self, net: Net, start: torch.Tensor) -> None:
        self.params, self.buffers = net.split(start)

    def batch(self, net: Net, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.centre is None:
            alpha = uniform_simplex(self.count, self.gen)
        else:
            alpha = l1_ball(self.centre, self.radius, self.gen)
        self.buffers[-self.count :] = alpha.to(self.buffers)
        losses = F.cross_entropy(
            net.logits(self.params, self.buffers, images), labels, reduction="none"
        )
        (grad,) = torch.autograd.grad(losses.mean(), self.params)
        net.sgd("w", self.params, grad, net.executor.lr)
        return losses.detach().sum().double()

    def end(self, net: Net) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return net.join(self.params, self.buffers), {}


@described("floco")
class Floco(OneModelByRule):
    """State: each client's region centre β_i and whether it has one (`placed`), the latest
    global model (for the personal predictors) and the rounds done."""

    settings: FlocoSettings
    local_training = "draws a point of its solution simplex for each batch (LocalTask.rule)"
    state_attributes: ClassVar[tuple[str, ...]] = ("centres", "placed", "current", "rounds_done")

    @classmethod
    def adapt_model(cls, model: nn.Module, settings: FlocoSettings) -> nn.Module:
        return simplex_model(model, settings.endpoints)

    def init_state(self) -> None:
        super().init_state()
        m = self.settings.endpoints
        self.centres = torch.zeros(self.num_clients, m, dtype=torch.float64)
        self.placed = torch.zeros(self.num_clients, dtype=torch.bool)
        self.current: torch.Tensor | None = None
        self.rounds_done = 0
        self._start: torch.Tensor | None = None
        self._gradients: RowStore | None = None

    def participants(self, clients: list[int]) -> None:
        m = self.settings.endpoints
        if len(clients) < m:
            raise FedrcError(
                f"train.floco.endpoints: {m} endpoints need as many participating clients "
                f"(their principal components); the benchmark has {len(clients)}"
            )

    def round_clients(self, round_: int, sampled: list[int], participating: list[int]):
        return list(participating) if round_ == self.settings.tau else sampled

    def rule(self, client: int, models: torch.Tensor) -> FlocoRule:
        """A point of the whole simplex for each batch, or of the client's region once placed."""
        s = self.settings
        centre = self.centres[client] if bool(self.placed[client]) else None
        seed = np.random.SeedSequence([self.config.seed, self.rounds_done + 1, client])
        return FlocoRule(centre, s.rho, int(seed.generate_state(1)[0]), s.endpoints)

    @property
    def endpoint_span(self) -> slice:
        """Where the M endpoint weights sit in a flat model."""
        start, stop = self.head
        return slice(start, stop - self.num_classes)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._gradients = None
        if self.rounds_done + 1 == self.settings.tau:
            span = self.endpoint_span
            self._start = models[0, span].to("cpu", torch.float32).clone()
            self._gradients = RowStore(span.stop - span.start)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        self.accumulate(task.model, result.params, task.weight)
        if self._gradients is not None:
            trained = result.params[self.endpoint_span].to("cpu", torch.float32)
            self._gradients.add(client, self._start - trained)

    def shared_rows(self) -> RowStore | None:
        return self._gradients

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """FedAvg; the global model at the simplex's centre; in round τ, the projection."""
        new = super().aggregate(models)
        m = self.settings.endpoints
        new[0, -m:] = 1.0 / m
        if self._gradients is not None:
            clients = self._gradients.stored_keys()
            rows = torch.cat([block for _, block in self._gradients.blocks()])
            betas = project_clients(rows.double().numpy(), m)
            self.centres[clients] = torch.from_numpy(betas)
            self.placed[clients] = True
            self._gradients.close()
        self.current = new[0].to("cpu", torch.float32).clone()
        return new

    def end_round(self) -> None:
        self.rounds_done += 1

    def personal_model(self, client: int) -> torch.Tensor | None:
        """The global model at the client's region centre β_i, once projected."""
        if self.current is None or not bool(self.placed[client]):
            return None
        own = self.current.clone()
        own[-self.settings.endpoints :] = self.centres[client].to(own)
        return own
