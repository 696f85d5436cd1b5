"""Adaptive K (FedConceptEM, Algorithm 2), for a mixture that starts with more models than it
needs (FedRC): models are removed everywhere, and each client's ω renormalised over the rest.

- `prune_threshold: δ`  a model whose average γ over all samples falls below δ is removed; the
  paper checks "when the weights converge", which `prune_after` makes a round number (an
  untrained model's γ collapses on noise)
- `merge_gap: ε`  our addition: two models that fit each other's samples to within ε nats are
  one concept held twice (EM splits that concept's γ between them for good, so δ never removes
  either); the one with less γ-mass is removed. Each client uploads
  X_i[k, l] = Σ_j γ_{ij;k} f(x_ij, y_ij; θ_l), K² numbers from its E-step

The server reads N_i (`sizes`) and ω_i from its host algorithm. A client's Adam memory γ^{t−1}
gets the same renormalisations when it next runs its E-step, where its data is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientStep, Memory, Upload, soft_tasks
from pipeline.algorithms.settings import AdaptiveKSettings
from pipeline.engine.task import LocalTask


def keep_after(removed_at: torch.Tensor, event: int) -> torch.Tensor:
    """The models still active after renormalisation `event` (1-based), as float64 0/1."""
    return ((removed_at == 0) | (removed_at > event)).to(torch.float64)


@dataclass
class AdaptiveKStep(ClientStep):
    """A client step's part: which models are active, when the others were removed (for its
    Adam memory), and whether to send X_i."""

    active: torch.Tensor  # (K,) bool
    removed_at: torch.Tensor  # (K,) the renormalisation that removed a model (0: active)
    renormalised: int  # renormalisations so far
    cross: bool  # send X_i (merge_gap)

    def moved(
        self, plain: torch.Tensor, memory: Memory | None, active: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Memory | None]:
        """The E-step's move over the active models, from a memory caught up with the
        renormalisations since the client's last E-step; the count is kept with it."""
        gamma, memory = super().moved(plain, self.caught_up(memory), self.active)
        if memory is not None:
            memory = {**memory, "renormalised": torch.tensor(self.renormalised)}
        return gamma, memory

    def caught_up(self, memory: Memory | None) -> Memory | None:
        """Alg. 2, lines 5–9, on the memory: every renormalisation since the client's last
        E-step, in turn (a removed model's γ dropped, the rest renormalised; a sample with
        nothing left starts uniform over the remaining models)."""
        if memory is None:
            return None
        g = memory["gamma"]
        # a memory from an older checkpoint, renormalised when it was written, lacks the count
        seen = int(memory.get("renormalised", self.renormalised))
        for event in range(seen + 1, self.renormalised + 1):
            keep = keep_after(self.removed_at, event)
            g = g * keep.to(g)
            total = g.sum(1, keepdim=True)
            g = torch.where(total > 0, g / total.clamp(min=1e-30), (keep / keep.sum()).to(g))
        return {**memory, "gamma": g}

    def upload(self, gamma: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor) -> Upload:
        """With `merge_gap`, X_i[k, l] = Σ_j γ_{ij;k} f_{ij;l} besides the rest."""
        sent = super().upload(gamma, losses, labels)
        if self.cross:
            finite = torch.nan_to_num(losses.detach(), posinf=0.0)  # a removed model's column
            sent["cross"] = (gamma.detach().T @ finite).to("cpu", torch.float64)
        return sent

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        """Every active model k with weights γ_{:,k}."""
        return soft_tasks(gamma, models, [k for k in range(gamma.shape[1]) if self.active[k]])


class AdaptiveK(Algorithm):
    """The server's part: which models are active, the X_i tables, and the removals at the end
    of a round. Its host keeps N_i in `sizes` and has a `step_values` (FedEM)."""

    settings: AdaptiveKSettings
    sizes: torch.Tensor

    def init_state(self) -> None:
        super().init_state()
        k = self.num_models
        self.active = torch.ones(k, dtype=torch.bool)
        self.removed_at = torch.zeros(k, dtype=torch.long)  # 0: active
        self.renormalised = 0  # how often Alg. 2's renormalisation ran
        self.cross = torch.zeros(self.num_clients, k, k, dtype=torch.float64)
        self.rounds_done = 0

    def step_values(self, client: int) -> dict[str, Any]:
        return {
            **super().step_values(client),
            "active": self.active.clone(),
            "removed_at": self.removed_at.clone(),
            "renormalised": self.renormalised,
            "cross": self.settings.merge_gap is not None,
        }

    def receive(self, client: int, upload: Upload) -> None:
        super().receive(client, upload)
        if "cross" in upload:
            self.cross[client] = upload["cross"].to("cpu", torch.float64)

    def end_round(self) -> None:
        super().end_round()
        self.rounds_done += 1
        s = self.settings
        if self.rounds_done < s.prune_after or not (self.sizes > 0).any():
            return
        if s.prune_threshold is not None:
            self.prune(s.prune_threshold)
        if s.merge_gap is not None:
            self.merge_interchangeable(s.merge_gap)

    def gamma_mass(self) -> torch.Tensor:
        """Σ_ij γ_{ij;k} per model over every client's latest E-step (ω_i = mean_j γ)."""
        return (self.sizes[:, None] * self.omega).sum(0)

    def prune(self, threshold: float) -> None:
        """Remove every model whose average γ over all samples seen is below δ (never the last)."""
        mean_gamma = self.gamma_mass() / self.sizes.sum()
        for k in mean_gamma.argsort().tolist():
            if self.active[k] and mean_gamma[k] < threshold and int(self.active.sum()) > 1:
                self.remove(k)
        self.renormalise()

    def merge_interchangeable(self, gap: float) -> None:
        """Remove the lighter of two models when each fits the other's samples within `gap`,
        the closest pairs first."""
        mass = self.gamma_mass()
        for _, a, b in sorted(self.interchangeable(mass, gap)):
            if self.active[a] and self.active[b]:
                self.remove(b if mass[b] < mass[a] else a)
        self.renormalise()

    def interchangeable(self, mass: torch.Tensor, gap: float) -> list[tuple[float, int, int]]:
        """(excess, a, b) for active models a < b that each fit the other's samples within `gap`:
        A[a, b] = Σ_i X_i[a, b] / Σ_ij γ_{ij;a} is model b’s mean loss on model a’s samples."""
        mean_loss = self.cross.sum(0) / mass.clamp(min=1e-30)[:, None]
        own = mean_loss.diagonal()
        live = [k for k in range(self.num_models) if self.active[k] and mass[k] > 0]
        pairs = []
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                excess = max(mean_loss[a, b] - own[a], mean_loss[b, a] - own[b])
                if excess < gap:
                    pairs.append((float(excess), a, b))
        return pairs

    def remove(self, k: int) -> None:
        """Model k is removed by the renormalisation about to run."""
        self.active[k] = False
        self.removed_at[k] = self.renormalised + 1

    def renormalise(self) -> None:
        """Alg. 2, lines 5–9: drop the removed models' ω and renormalise the rest (a client
        that had nothing left starts uniform over the remaining models). Each client's γ^{t−1}
        (its Adam memory) gets the same, counted here, when it next runs its E-step
        (`AdaptiveKStep.caught_up`): the memory stays where the client's data is."""
        self.renormalised += 1
        keep = self.active.to(self.omega.dtype)
        kept = self.omega * keep
        self.omega = torch.where(
            kept.sum(1, keepdim=True) > 0,
            kept / kept.sum(1, keepdim=True).clamp(min=1e-300),
            keep / keep.sum(),
        )

    def round_info(self) -> dict[str, Any]:
        return {**super().round_info(), "active_models": int(self.active.sum())}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "active": self.active,
            "cross": self.cross,
            "rounds_done": self.rounds_done,
            "removed_at": self.removed_at,
            "renormalised": self.renormalised,
        }
