"""IFCA (Ghosh et al., NeurIPS 2020): each client joins the model with the lowest loss.

Client i picks k* = argmin_k (1/N_i) Σ_j f(x_ij, y_ij; θ_k) with the models it just received,
trains only θ_{k*}, and the server averages each model over its members (N_i-weighted). A model
with no member this round keeps its parameters (the FedRC port zeroes it: a bug, protocol §2).
"""

from __future__ import annotations

import torch

from pipeline.algorithms.base import HardClustering, hard_gamma


class IFCA(HardClustering):
    name = "ifca"
    title = "IFCA"
    paper = "Ghosh et al., NeurIPS 2020"

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return hard_gamma(losses, int(losses.mean(0).argmin()))
