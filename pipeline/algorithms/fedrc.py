"""FedRC (Guo et al., ICML 2024): FedEM plus one term, the label prior C_{y,k}.

Paper eq. 2: maximise Σ_ij ln Σ_k ω_{i;k} exp(−f(x_ij, y_ij; θ_k)) / C_{y_ij,k}. Dividing by
C_{y,k} ≈ P(y; θ_k) stops clusters from forming around labels, so they form around concepts.

E-step (Alg. 1, in log space): γ_{ij;k} = softmax_k(log ω_{i;k} − f − log C_{y_ij,k}).
Label statistics: client i sends S_i[k, y] = Σ_{j: y_ij = y} γ_{ij;k}; the server sums every
client's latest table, floors the entries and normalises each row over y to get C_{y,k}, which
the *next* round's E-steps use (the authors' one-round lag; round 1 is a FedEM E-step).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms.fedem import FedEM
from pipeline.config import TrainConfig


class FedRC(FedEM):
    name = "fedrc"

    def __init__(self, num_models: int, num_clients: int, num_classes: int, config: TrainConfig):
        super().__init__(num_models, num_clients, num_classes, config)
        self.tables = torch.zeros(num_clients, num_models, num_classes, dtype=torch.float64)
        self.prior = torch.full((num_models, num_classes), 1.0 / num_classes, dtype=torch.float64)

    def label_term(self, labels: torch.Tensor, held_out: bool) -> torch.Tensor | float:
        if held_out and not self.config.heldout_label_prior:
            return 0.0  # the authors' code scores held-out clients with FedEM's E-step
        return -torch.log(self.prior.T.to(labels.device)[labels]).float()  # (N, K)

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        gamma = super().assign(client, losses, labels)
        table = torch.zeros(self.num_classes, self.num_models, dtype=torch.float64)
        table.index_add_(0, labels.cpu(), gamma.detach().cpu().to(torch.float64))
        self.tables[client] = table.T
        return gamma

    def end_round(self) -> None:
        totals = self.tables.sum(0).clamp(min=self.config.label_floor)
        self.prior = totals / totals.sum(1, keepdim=True)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tables": self.tables, "prior": self.prior}
