"""The client part of an algorithm's round: what runs where a client's data lives.

For its E-step the server hands each client a `ClientStep`: the little server state that the
client needs (FedEM: ω_i; FedRC: ω_i, the label prior C_{y,k} and which models are active; IFCA
and FedAvg: nothing but the models). On its own data the client turns its per-sample losses
under the K models into γ (N_i, K), which stays with it (its local trainings weigh samples by
γ), and into an *upload*, which is all that leaves it: what the algorithm's paper sends (ω_i,
FedRC's per-cluster label counts Σ_j γ_jk·1[y_j = y], …). The server folds the upload into its
state with `Algorithm.receive`. One process, every torchrun rank and a Flower node run the same
step, so their numbers agree by construction.

A step is a dataclass whose fields are tensors, numbers, booleans or strings: it pickles (for
torchrun) and travels as Flower records (`pipeline.flower.wire`). What a client keeps between
its own E-steps (FedRC's Adam moments) is its `memory`: it stays on the client's place.

What the E-step reads costs inference: the K models run on the client's samples only for the
predictors its step `reads` (FedEM and FedRC: all K; a step whose cluster the server already
chose: none), and the other columns of the losses it gets are NaN.

The helpers below (`per_sample_losses`, `accuracies`) are the client's side of the E-step and of
evaluation, shared by every place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from pipeline.engine.task import LocalTask

Memory = dict[str, torch.Tensor]
Upload = dict[str, torch.Tensor]
Rows = tuple[int, ...]  # model rows whose logits an E-step reads, in increasing order


@dataclass
class ClientOutcome:
    """One client's E-step: γ stays with the client, the upload goes to the server, the memory
    stays on the client's place until its next E-step (None: nothing to keep)."""

    gamma: torch.Tensor  # (N_i, K)
    upload: Upload
    memory: Memory | None = None


@dataclass
class ClientStep:
    """The client part of one algorithm; a subclass's fields are the server state it needs."""

    # True: `run` and `held_out` also get `predictions=`, the (N_i, K) arg-max class of each
    # sample under each model (`sample_predictions`), e.g. to choose by accuracy
    wants_predictions: ClassVar[bool] = False

    def run(
        self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None
    ) -> ClientOutcome:
        """The E-step on the client's data: its losses (N_i, K) under the K models, its labels
        and its memory from its previous E-step. It must not send per-sample values up."""
        raise NotImplementedError(f"{type(self).__name__} has no run")

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A non-participating client's ω from its labelled part (protocol §2's default: the
        model with the lowest mean loss), the only thing it sends up."""
        return lowest_loss(losses, losses.shape[1])

    def reads(self, predictors: int) -> Rows:
        """The predictors (of K = `predictors`) whose losses or predictions `run` reads: only
        their logits are computed on the client's samples, and the other columns of the losses
        `run` gets are NaN (their shape and dtype stay). Default: all K. A step that needs none
        (its cluster already chosen) returns (), and the round runs no inference for it."""
        return tuple(range(predictors))

    def extra(self, logits: torch.Tensor) -> dict[str, Any]:
        """The optional arguments of `run` and `held_out` from the logits (K, N_i, classes)."""
        return {"predictions": sample_predictions(logits)} if self.wants_predictions else {}

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        """The client's local trainings from its γ (FedEM's default: every model k with weights
        γ_{:,k}, counting N_i)."""
        return soft_tasks(gamma, models)

    def values(self) -> dict[str, object]:
        """The step's fields by name (what travels)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class HardStep(ClientStep):
    """The step of a hard assignment: the client trains its cluster's model alone, on all its
    samples (`hard_tasks`)."""

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        return hard_tasks(gamma, models)


@dataclass
class ClusterStep(HardStep):
    """The step of a cluster the server keeps for the client (−1: none yet, and the client takes
    the model with the lowest loss on its data); the client sends ω_i, one-hot on that model."""

    cluster: int

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        k = self.cluster if self.cluster >= 0 else int(losses.mean(0).argmin())
        return hard_outcome(losses, k)

    def reads(self, predictors: int) -> Rows:
        """Every model's losses while the client has no cluster; none once it has one."""
        return () if self.cluster >= 0 else tuple(range(predictors))


def hard_outcome(losses: torch.Tensor, cluster: int) -> ClientOutcome:
    """A hard assignment's E-step: every sample on `cluster`, ω_i one-hot on it sent up."""
    gamma = hard_gamma(losses, cluster)
    return ClientOutcome(gamma, {"omega": mean_omega(gamma)})


def one_hot(index: int, size: int) -> torch.Tensor:
    row = torch.zeros(size, dtype=torch.float64)
    row[index] = 1.0
    return row


def lowest_loss(losses: torch.Tensor, size: int, rows: list[int] | None = None) -> torch.Tensor:
    """ω one-hot (of `size`) on the model among `rows` (default: all) with the lowest mean
    loss over the client's samples, `losses` (N, K)."""
    if rows is None:
        return one_hot(int(losses.mean(0).argmin()), size)
    return one_hot(rows[int(losses[:, rows].mean(0).argmin())], size)


def hard_gamma(losses: torch.Tensor, cluster: int) -> torch.Tensor:
    """γ of a hard assignment: every sample of the client belongs to `cluster`."""
    gamma = torch.zeros_like(losses)
    gamma[:, cluster] = 1.0
    return gamma


def mean_omega(gamma: torch.Tensor) -> torch.Tensor:
    """ω_i = (1/N_i) Σ_j γ_{ij} (FedEM's update; one-hot for a hard γ)."""
    return gamma.mean(0).to("cpu", torch.float64)


def soft_tasks(gamma: torch.Tensor, models: torch.Tensor, rows: list[int] | None = None):
    """Model k (each of `rows`, default all) trains with weights γ_{:,k}, counting N_i."""
    n = float(gamma.shape[0])
    rows = range(gamma.shape[1]) if rows is None else rows
    return [LocalTask(k, models[k], gamma[:, k], weight=n) for k in rows]


def hard_tasks(gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
    """A hard assignment: the client trains its cluster's model alone, on all its samples."""
    k = int(gamma[0].argmax())
    return [LocalTask(k, models[k], gamma[:, k], weight=float(gamma.shape[0]))]


def sample_predictions(logits: torch.Tensor) -> torch.Tensor:
    """The arg-max class (N, K) of each sample under each model, from logits (K, N, classes):
    `predictions == labels[:, None]` is each sample's correctness under each model."""
    return logits.argmax(-1).T


def per_sample_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (N, K) from logits (K, N, classes)."""
    logp = torch.log_softmax(logits, dim=-1)
    return -logp.gather(-1, labels.expand(logits.shape[0], -1).unsqueeze(-1)).squeeze(-1).T


def accuracies(
    logits: torch.Tensor, labels: torch.Tensor, spans: list[tuple[int, int]], weights: torch.Tensor
) -> torch.Tensor:
    """(2, S) float64: the soft and the hard accuracy (`predictions`) of each of S spans
    [start, stop) of the rows, span s predicting with its weights[s] (K,) over the K predictors'
    logits (K, N, classes).

    All spans in one pass and one read back: a call and a read per client and part made a GPU
    wait once for every number (1,212 waits an evaluation at the paper's scale). Each number is
    the one `(prediction == label).float().mean()` gives on the logits' device."""
    device = logits.device
    lengths = torch.tensor([stop - start for start, stop in spans])
    rows = torch.cat([torch.arange(start, stop) for start, stop in spans]).to(device)
    segment = torch.repeat_interleave(torch.arange(len(spans)), lengths).to(device)
    chosen, each = logits[:, rows], weights.to(device)[segment]  # each sample's weights
    guesses = [predictions(chosen, each, hard) for hard in (False, True)]
    right = torch.stack(guesses) == labels[rows]
    counts = torch.zeros(2, len(spans), device=device).index_add_(1, segment, right.float())
    return mean_of_counts(counts.cpu(), lengths.float(), device).double()


def predictions(logits: torch.Tensor, omega: torch.Tensor, hard: bool) -> torch.Tensor:
    """The predicted class of each sample from the K predictors' logits (K, N, classes) and ω
    (K,), or each sample's own (N, K). Soft: the arg-max of Σ_k ω_k softmax(z_k) over the
    models with ω_k > 0 (the others may be NaN: never computed). Hard: the arg-max of the
    model with the largest ω."""
    rows = omega[None] if omega.dim() == 1 else omega
    if hard:
        picked = rows.argmax(1).expand(logits.shape[1])
        return logits[picked, torch.arange(logits.shape[1], device=logits.device)].argmax(-1)
    share = rows.to(logits).T.unsqueeze(-1)  # (K, N or 1, 1)
    return torch.where(share > 0, share * torch.softmax(logits, dim=-1), 0.0).sum(0).argmax(-1)


def mean_of_counts(counts: torch.Tensor, sizes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """count / size in float32 as torch's `mean` of 0/1 values gives it on `device`: the CPU
    divides the sum, CUDA multiplies it by 1/size (both exact sums below 2**24)."""
    if device.type == "cuda":
        return counts * (torch.ones_like(sizes) / sizes)
    return counts / sizes
