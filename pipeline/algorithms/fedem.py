"""FedEM (Marfoq et al., NeurIPS 2021): clients are mixtures of K models, fitted by EM.

E-step (log space): γ_{ij;k} = softmax_k(log ω_{i;k} − f(x_ij, y_ij; θ_k));
ω_{i;k} = mean_j γ_{ij;k}.
M-step: model k trains locally with per-sample weights γ_{ij;k}; the server averages every model
over the sampled clients with weights N_i. Prediction: p(y|x) = Σ_k ω_{i;k} softmax(m_k(x)).

`estep: adam` moves γ by the Adam E-step of FedConceptEM (`adam_estep`), as FedRC may.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.adam_estep import AdamEStep
from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientOutcome, ClientStep, Memory, Upload, mean_omega
from pipeline.algorithms.settings import EStepSettings
from pipeline.engine.task import LocalTask


@dataclass
class FedEMStep(ClientStep, AdamEStep):
    """The client needs its ω_i; it sends its new ω_i (the paper's upload besides the models)."""

    omega: torch.Tensor  # (K,) ω_i, float64

    def label_term(self, labels: torch.Tensor, held_out: bool) -> torch.Tensor | float:
        """Extra log-likelihood per (sample, model); FedEM has none. FedRC: −log C_{y,k}."""
        return 0.0

    def responsibilities(
        self, losses: torch.Tensor, labels: torch.Tensor, held_out: bool = False
    ) -> torch.Tensor:
        log_omega = torch.log(self.omega).to(losses)
        logits = log_omega - losses + self.label_term(labels, held_out)
        return torch.softmax(logits, dim=1)

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        gamma, memory = self.moved(self.responsibilities(losses, labels), memory)
        return ClientOutcome(gamma, self.upload(gamma, losses, labels), memory)

    def upload(self, gamma: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor) -> Upload:
        """What the client sends after its E-step: ω_i."""
        return {"omega": mean_omega(gamma)}

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One E-step on the client's labelled part; ω carries over between evaluations."""
        return mean_omega(self.responsibilities(losses, labels, held_out=True))


@described("fedem")
class FedEM(Algorithm):
    settings: EStepSettings
    Step = FedEMStep

    def step_values(self, client: int) -> dict[str, Any]:
        """The fields of client `client`'s step (a subclass adds its own)."""
        return {"omega": self.omega[client].clone(), **AdamEStep.options(self.settings)}

    def client_step(self, client: int) -> FedEMStep:
        return self.Step(**self.step_values(client))

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        """The client part's local trainings, run here (the server-side E-step's)."""
        return self.client_step(client).local_tasks(gamma, models)

    @property
    def adam(self) -> dict[int, Memory]:
        """Each client's Adam E-step memory (γ^{t−1}, moments), where its data is."""
        return self.memory

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "adam": self.memory}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.memory = state.pop("adam")
        super().load_state_dict(state)
