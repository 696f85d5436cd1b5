"""FedSoft (Ruan & Joe-Wong, AAAI 2022): soft clustering through importance weights.

Importance weights: u_ik = share of client i's samples that model k fits best (lowest loss),
floored at 1e-4 and renormalised. Each client keeps a personal model w_i and trains it on
f_i(w) + (λ/2) Σ_k u_ik ‖w − θ_k‖² = f_i(w) + (λ/2)‖w − Σ_k u_ik θ_k‖² + const (Σ_k u_ik = 1),
λ = `mu` (default 0.1, the value of our FMNIST reproduction: the papers reproduced here do not
give one). The server sets θ_k ← Σ_i u_ik w_i / Σ_i u_ik over the sampled clients.
Local accuracy uses the personal models; a held-out client takes the cluster with the lowest
loss. The FedRC authors' release (protocol §2) counts each sample for the model with the
*largest* loss (`largest_loss`) and scores every held-out client with cluster model 0
(`held_out_model0`: its evaluation copies model 0 into every held-out client).

Memory: the personal models are state, one model per client that has trained (clients × model,
in memory on every place, on the device that trains). A round's new personal models are kept
in memory there too while every client's new model takes at most a quarter of its free memory
(`room_for`), else in a `RowStore` on disk, so that the round itself adds only K × model.
The trip through the file (each client's model written and read back, and on a GPU copied to
the host and back) is no part of FedSoft's arithmetic (docs/performance.md, each method's
round against its own work).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm, one_hot
from pipeline.algorithms.settings import FedSoftSettings
from pipeline.engine.rows import RowStore, room_for
from pipeline.engine.task import PERSONAL, LocalResult, LocalTask

FLOOR = 1e-4


@described("fedsoft")
class FedSoft(Algorithm):
    personal_models = True
    settings: FedSoftSettings

    def init_state(self) -> None:
        super().init_state()
        self.personal: dict[int, torch.Tensor] = {}
        self._u: torch.Tensor | None = None  # u_i of the client just assigned (`client_omega`)
        self._trained: RowStore | None = None

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        fits = losses.argmax(1) if self.as_released("largest_loss") else losses.argmin(1)
        best = torch.bincount(fits, minlength=self.num_models).double()
        u = (best / losses.shape[0]).clamp(min=FLOOR).cpu()
        self._u = u / u.sum()
        return self._u.to(losses).expand_as(losses)

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        if self.as_released("held_out_model0"):
            return one_hot(0, self.num_models)
        return super().assign_held_out(client, losses, labels)

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        """ω_i = u_i in float64 (γ holds it in the losses' float32)."""
        return self._u

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        u = self.omega[client].to(models)
        centre = u @ models
        own = self.personal.get(client)
        start = centre if own is None else own.to(models)
        ones = torch.ones(gamma.shape[0], dtype=gamma.dtype, device=gamma.device)
        return [LocalTask(PERSONAL, start, ones, anchor=centre, mu=self.settings.mu)]

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        every = 4 * models.shape[1] * self.num_clients  # bytes: every client's new model
        self._trained = RowStore(models.shape[1], room_for(every, models.device))

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        """Σ_i u_ik w_i and Σ_i u_ik, model by model (no (K, P) temporaries)."""
        u = self.omega[client].to(self.sums)
        self._trained.add(client, result.params)
        params = result.params.double()
        for k in range(self.num_models):
            self.sums[k] += u[k] * params
        self.totals += u

    def shared_rows(self) -> RowStore:
        return self._trained

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        self.personal.update(self._trained.items())
        self._trained.close()
        return super().aggregate(models)

    def personal_model(self, client: int) -> torch.Tensor | None:
        return self.personal.get(client)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "personal": self.personal}
