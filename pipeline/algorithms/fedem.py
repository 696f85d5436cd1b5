"""FedEM (Marfoq et al., NeurIPS 2021): clients are mixtures of K models, fitted by EM.

E-step (log space): γ_{ij;k} = softmax_k(log ω_{i;k} − f(x_ij, y_ij; θ_k));
ω_{i;k} = mean_j γ_{ij;k}.
M-step: model k trains locally with per-sample weights γ_{ij;k}; the server averages every model
over the sampled clients with weights N_i. Prediction: p(y|x) = Σ_k ω_{i;k} softmax(m_k(x)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientOutcome, ClientStep, Memory, mean_omega


@dataclass
class FedEMStep(ClientStep):
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
        gamma = self.responsibilities(losses, labels)
        return ClientOutcome(gamma, {"omega": mean_omega(gamma)})

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One E-step on the client's labelled part; ω carries over between evaluations."""
        return mean_omega(self.responsibilities(losses, labels, held_out=True))


class FedEM(Algorithm):
    name = "fedem"
    title = "FedEM"
    paper = "Marfoq et al., NeurIPS 2021"
    Step = FedEMStep

    def client_step(self, client: int) -> FedEMStep:
        return FedEMStep(omega=self.omega[client].clone())
