"""FedRC (Guo et al., ICML 2024): FedEM plus one term, the label prior C_{y,k}.

Paper eq. 2: maximise Σ_ij ln Σ_k ω_{i;k} exp(−f(x_ij, y_ij; θ_k)) / C_{y_ij,k}. Dividing by
C_{y,k} ≈ P(y; θ_k) stops clusters from forming around labels, so they form around concepts.

E-step (Alg. 1, in log space): γ_{ij;k} = softmax_k(log ω_{i;k} − f − log C_{y_ij,k}).
Label statistics: client i sends S_i[k, y] = Σ_{j: y_ij = y} γ_{ij;k}; the server sums every
client's latest table, floors the entries and normalises each row over y to get C_{y,k}, which
the *next* round's E-steps use (the authors' one-round lag; round 1 is a FedEM E-step).

The paper's variants are pieces of their own, each switched on by its settings
(`--set KEY=VALUE` or `train: {fedrc: {KEY: VALUE}}`), each skippable on a first reading:
`estep: adam` (`adam_estep`, shared with FedEM), `prune_threshold` / `merge_gap` (adaptive K,
`adaptive_k`), `hard_train` (TrHC, `hard_train`), `table_noise` (`table_noise`), `shared_body`
(`shared_body`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.adaptive_k import AdaptiveK, AdaptiveKStep
from pipeline.algorithms.client import Upload
from pipeline.algorithms.fedem import FedEM, FedEMStep
from pipeline.algorithms.hard_train import HardTrainStep
from pipeline.algorithms.settings import FedRCSettings
from pipeline.algorithms.shared_body import SharedBody
from pipeline.algorithms.table_noise import TableNoise


@dataclass
class FedRCStep(HardTrainStep, AdaptiveKStep, FedEMStep):
    """What a FedRC client needs besides FedEM's ω_i: the label prior C_{y,k}. It sends ω_i,
    its label table S_i[k, y] = Σ_{j: y_j = y} γ_{ij;k} and N_i."""

    prior: torch.Tensor  # (K, classes) C_{y,k}
    heldout_label_prior: bool

    def label_term(self, labels: torch.Tensor, held_out: bool) -> torch.Tensor | float:
        if held_out and not self.heldout_label_prior:
            return 0.0  # the authors' code scores held-out clients with FedEM's E-step
        return -torch.log(self.prior.T.to(labels.device)[labels]).float()  # (N, K)

    def upload(self, gamma: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor) -> Upload:
        table = torch.zeros(self.prior.shape[1], self.prior.shape[0], dtype=torch.float64)
        table.index_add_(0, labels.cpu(), gamma.detach().cpu().to(torch.float64))
        return {
            **super().upload(gamma, losses, labels),
            "table": table.T.contiguous(),
            "size": torch.tensor(float(labels.numel()), dtype=torch.float64),
        }


@described("fedrc")
class FedRC(AdaptiveK, SharedBody, TableNoise, FedEM):
    settings: FedRCSettings
    Step = FedRCStep

    def init_state(self) -> None:
        super().init_state()
        k, classes = self.num_models, self.num_classes
        self.tables = torch.zeros(self.num_clients, k, classes, dtype=torch.float64)  # S_i
        self.prior = torch.full((k, classes), 1.0 / classes, dtype=torch.float64)  # C_{y,k}
        self.sizes = torch.zeros(self.num_clients, dtype=torch.float64)  # N_i

    def step_values(self, client: int) -> dict[str, Any]:
        c = self.settings
        return {
            **super().step_values(client),
            "prior": self.prior.clone(),
            "heldout_label_prior": c.heldout_label_prior,
            "hard_train": c.hard_train,
        }

    def receive(self, client: int, upload: Upload) -> None:
        """N_i and the label table S_i; then ω_i and the variants' parts (`super`)."""
        self.sizes[client] = float(upload["size"])
        self.tables[client] = upload["table"].to("cpu", torch.float64)
        super().receive(client, upload)

    def end_round(self) -> None:
        """C_{y,k} from every client's latest table, for the next round's E-steps."""
        totals = self.tables.sum(0).clamp(min=self.settings.label_floor)
        self.prior = totals / totals.sum(1, keepdim=True)
        super().end_round()

    def state_dict(self) -> dict[str, Any]:
        state = {"tables": self.tables, "prior": self.prior, "sizes": self.sizes}
        return {**super().state_dict(), **state}
