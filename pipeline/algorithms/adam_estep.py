"""The Adam E-step (FedConceptEM, app. D.1), for any mixture whose E-step gives γ: FedEM, FedRC.

Per sample, g = γ^{t−1} − γ̃^t with γ̃ the plain E-step; first and second moments ν, a;
γ ← γ^{t−1} − α (ν/(1−β1)) / (sqrt(a/(1−β2)) + ε), clipped at 0 and renormalised over k.
A client's first E-step starts, as in the paper's Algorithm 1 and the authors' code, from
γ^0 = 1/K with zero moments. γ^{t−1} and the moments are the client's memory (`ClientStep`):
they stay where its data is, between its E-steps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from pipeline.algorithms.client import Memory
from pipeline.algorithms.settings import EStepSettings
from pipeline.common.settings import Settings


@dataclass
class AdamEStep:
    """A client step's part for the E-step's options (the fields of `EStepSettings`)."""

    estep: str
    adam_lr: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float

    @staticmethod
    def options(settings: Settings) -> dict[str, Any]:
        """The step's fields from the run's settings (the plain E-step for a subclass's settings
        that lack them)."""
        source = settings if isinstance(settings, EStepSettings) else EStepSettings()
        return {f.name: getattr(source, f.name) for f in fields(AdamEStep)}

    def moved(
        self, plain: torch.Tensor, memory: Memory | None, active: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Memory | None]:
        """γ (N, K) and the memory to keep from the plain E-step's γ̃ `plain`: γ̃ itself and no
        memory with `estep: em`; the Adam move with `adam`, over the `active` models (all when
        None)."""
        if self.estep != "adam":
            return plain, None
        if active is None:
            active = torch.ones(plain.shape[1], dtype=torch.bool)
        active = active.to(plain.device)
        if memory is None:  # first visit: γ^0 = 1/K over the active models, zero moments
            start = active.to(plain).expand_as(plain)
            zeros = torch.zeros_like(plain)
            memory = {"gamma": start / start.sum(1, keepdim=True), "m": zeros, "v": zeros}
        b1, b2 = self.adam_beta1, self.adam_beta2
        previous = memory["gamma"].to(plain)
        g = previous - plain
        m = b1 * memory["m"].to(plain) + (1 - b1) * g
        v = b2 * memory["v"].to(plain) + (1 - b2) * g * g
        step = (m / (1 - b1)) / (torch.sqrt(v / (1 - b2)) + self.adam_eps)
        gamma = (previous - self.adam_lr * step).clamp(min=0) * active
        total = gamma.sum(1, keepdim=True)
        gamma = torch.where(total > 0, gamma / total.clamp(min=1e-30), plain)  # guard a zero sum
        return gamma, {"gamma": gamma.cpu(), "m": m.cpu(), "v": v.cpu()}
