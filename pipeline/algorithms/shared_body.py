"""One feature extractor shared by the K models, K heads (FedRC paper, Table 11).

Each local copy trains body and head with its γ; the server averages the K heads separately
(its host's rule) and the bodies of all copies together, each weighted by its γ-mass
Σ_j γ_{ij;k}. That mass stays on the client with γ, so this variant runs its E-step on the
server (the fallback: `Algorithm.client_part` is False).
"""

from __future__ import annotations

import torch

from pipeline.algorithms.base import Algorithm, add_into
from pipeline.algorithms.settings import SharedBodySettings
from pipeline.engine.task import LocalResult, LocalTask


class SharedBody(Algorithm):
    """The server's part: the bodies' γ-mass-weighted sum, then every row's body replaced by
    it (`self.head` is where the head sits in a flat model)."""

    settings: SharedBodySettings

    @property
    def client_part(self) -> bool:
        return super().client_part and not self.settings.shared_body

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        if self.settings.shared_body:
            self._body_sum = torch.zeros(models.shape[1], dtype=torch.float64, device=models.device)
            self._body_mass = torch.zeros(1, dtype=torch.float64, device=models.device)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        super().fold(client, task, result)
        if self.settings.shared_body:
            mass = float(task.weights.sum())
            add_into(self._body_sum, result.params, mass)
            self._body_mass += mass

    def contributions(self) -> list[torch.Tensor]:
        extra = [self._body_sum, self._body_mass] if self.settings.shared_body else []
        return [*super().contributions(), *extra]

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        if self.settings.shared_body and float(self._body_mass) > 0:
            start, stop = self.head
            body = (self._body_sum / float(self._body_mass)).to(models.dtype)
            head = new[:, start:stop].clone()
            new[:] = body
            new[:, start:stop] = head
        return new
