"""FedRC (Guo et al., ICML 2024): FedEM plus one term, the label prior C_{y,k}.

Paper eq. 2: maximise Σ_ij ln Σ_k ω_{i;k} exp(−f(x_ij, y_ij; θ_k)) / C_{y_ij,k}. Dividing by
C_{y,k} ≈ P(y; θ_k) stops clusters from forming around labels, so they form around concepts.

E-step (Alg. 1, in log space): γ_{ij;k} = softmax_k(log ω_{i;k} − f − log C_{y_ij,k}).
Label statistics: client i sends S_i[k, y] = Σ_{j: y_ij = y} γ_{ij;k}; the server sums every
client's latest table, floors the entries and normalises each row over y to get C_{y,k}, which
the *next* round's E-steps use (the authors' one-round lag; round 1 is a FedEM E-step).

Variants (`FedRC.Settings`; `--set KEY=VALUE` or `train: {fedrc: {KEY: VALUE}}`):
- `estep: adam`  FedConceptEM app. D.1: γ moves from its previous value along the Adam direction
  of g = γ^{t−1} − γ̃^t (γ̃ the plain E-step), clipped at 0 and renormalised over k. A client's
  first E-step starts, as in the paper's Algorithm 1 and the authors' code, from γ^0 = 1/K with
  zero moments
- `prune_threshold: δ`  adaptive K (FedConceptEM Alg. 2): a model whose average γ over all
  samples falls below δ is removed everywhere; the paper checks "when the weights converge",
  which `prune_after` makes a round number (an untrained model's γ collapses on noise)
- `merge_gap: ε`  our addition to adaptive K: two models that fit each other's samples to within
  ε nats are one concept held twice (EM splits that concept's γ between them for good, so δ never
  removes either); the one with less γ-mass is removed by Alg. 2's step. Each client uploads
  X_i[k, l] = Σ_j γ_{ij;k} f(x_ij, y_ij; θ_l), K² numbers from its E-step
- `hard_train` (TrHC): each client trains only its arg-max ω model, on all its samples
- `table_noise: ξ`  N(0, ξ²) added to every uploaded label table (paper Table 10)
- `shared_body`  one feature extractor shared by the K models, K heads (paper Table 11): each
  local copy trains body and head with its γ; the server averages the K heads separately and
  the bodies of all copies together, each weighted by its γ-mass Σ_j γ_{ij;k}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from pipeline.algorithms.client import ClientOutcome, Memory, mean_omega, soft_tasks
from pipeline.algorithms.fedem import FedEM, FedEMStep
from pipeline.engine.task import LocalResult, LocalTask
from pipeline.settings import Settings, require

ESTEPS = ("em", "adam")


@dataclass(frozen=True)
class FedRCSettings(Settings):
    """FedRC's options; defaults are the paper's (Adam's from FedConceptEM app. D.1)."""

    estep: str = "em"  # em, or adam (FedConceptEM app. D.1)
    adam_lr: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_eps: float = 1e-8
    label_floor: float = 1e-8  # floor on the summed label tables before normalising
    heldout_label_prior: bool = True  # apply C_{y,k} in held-out E-steps (paper eq. 3)
    prune_threshold: float | None = None  # adaptive K: remove models with mean γ < δ
    prune_after: int = 0  # adaptive K: remove no model before this round (γ must settle)
    merge_gap: float | None = None  # adaptive K: remove one of two interchangeable models
    hard_train: bool = False  # TrHC: train only the arg-max ω model
    table_noise: float = 0.0  # std ξ of Gaussian noise on the uploaded label tables
    shared_body: bool = False  # one feature extractor shared by the K models, K heads

    profiles: ClassVar[dict[str, dict[str, Any]]] = {
        "reference": {"heldout_label_prior": False, "adam_beta1": 0.5, "adam_beta2": 0.5}
    }

    def validate(self) -> None:
        require(self.estep in ESTEPS, "estep", f"one of {ESTEPS}", self.estep)
        require(self.adam_lr > 0, "adam_lr", "a number > 0", self.adam_lr)
        require(0 <= self.adam_beta1 < 1, "adam_beta1", "a number in [0, 1)", self.adam_beta1)
        require(0 <= self.adam_beta2 < 1, "adam_beta2", "a number in [0, 1)", self.adam_beta2)
        require(self.adam_eps > 0, "adam_eps", "a number > 0", self.adam_eps)
        require(0 < self.label_floor < 1, "label_floor", "a number in (0, 1)", self.label_floor)
        pt, pa, mg = self.prune_threshold, self.prune_after, self.merge_gap
        require(pt is None or 0 < pt < 1, "prune_threshold", "a number in (0, 1) or null", pt)
        require(pa >= 0, "prune_after", "an integer >= 0", pa)
        require(mg is None or mg > 0, "merge_gap", "a number > 0 (nats) or null", mg)
        require(self.table_noise >= 0, "table_noise", "a number >= 0", self.table_noise)


def fedrc_tasks(
    gamma: torch.Tensor, models: torch.Tensor, active: torch.Tensor, omega: torch.Tensor, hard: bool
) -> list[LocalTask]:
    """Every active model k with weights γ_{:,k}; TrHC (`hard`): only the arg-max ω model,
    every sample with weight 1."""
    if hard:
        k = int(omega.argmax())
        return [LocalTask(k, models[k], torch.ones_like(gamma[:, k]), weight=float(gamma.shape[0]))]
    return soft_tasks(gamma, models, [k for k in range(gamma.shape[1]) if active[k]])


def keep_after(removed_at: torch.Tensor, event: int) -> torch.Tensor:
    """The models still active after renormalisation `event` (1-based), as float64 0/1."""
    return ((removed_at == 0) | (removed_at > event)).to(torch.float64)


@dataclass
class FedRCStep(FedEMStep):
    """What a FedRC client needs besides ω_i: the label prior C_{y,k}, which models are active
    (and when the others were removed, for its Adam memory), and the E-step's options. It
    sends ω_i, its label table S_i[k, y] = Σ_{j: y_j = y} γ_{ij;k}, N_i and, with `merge_gap`,
    X_i[k, l] = Σ_j γ_{ij;k} f_{ij;l} (K²)."""

    prior: torch.Tensor  # (K, classes) C_{y,k}
    active: torch.Tensor  # (K,) bool
    removed_at: torch.Tensor  # (K,) the renormalisation that removed a model (0: active)
    renormalised: int  # renormalisations so far
    estep: str
    adam_lr: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    heldout_label_prior: bool
    cross: bool  # send X_i (merge_gap)
    hard_train: bool

    def label_term(self, labels: torch.Tensor, held_out: bool) -> torch.Tensor | float:
        if held_out and not self.heldout_label_prior:
            return 0.0  # the authors' code scores held-out clients with FedEM's E-step
        return -torch.log(self.prior.T.to(labels.device)[labels]).float()  # (N, K)

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        gamma = self.responsibilities(losses, labels)
        if self.estep == "adam":
            gamma, memory = self.adam_step(gamma, memory)
        else:
            memory = None
        table = torch.zeros(self.prior.shape[1], self.prior.shape[0], dtype=torch.float64)
        table.index_add_(0, labels.cpu(), gamma.detach().cpu().to(torch.float64))
        upload = {
            "omega": mean_omega(gamma),
            "table": table.T.contiguous(),
            "size": torch.tensor(float(labels.numel()), dtype=torch.float64),
        }
        if self.cross:  # X_i[k, l] = Σ_j γ_{ij;k} f_{ij;l}
            finite = torch.nan_to_num(losses.detach(), posinf=0.0)  # a removed model's column
            upload["cross"] = (gamma.detach().T @ finite).to("cpu", torch.float64)
        return ClientOutcome(gamma, upload, memory)

    def adam_step(self, plain: torch.Tensor, memory: Memory | None) -> tuple[torch.Tensor, Memory]:
        """γ ← γ^{t−1} − α (ν/(1−β1)) / (sqrt(a/(1−β2)) + ε), clipped at 0, renormalised."""
        active = self.active.to(plain.device)
        if memory is None:  # first visit: γ^0 = 1/K over the active models, zero moments
            start = active.to(plain).expand_as(plain)
            zeros = torch.zeros_like(plain)
            memory = {"gamma": start / start.sum(1, keepdim=True), "m": zeros, "v": zeros}
        else:
            memory = self.renormalise(memory)
        b1, b2 = self.adam_beta1, self.adam_beta2
        previous = memory["gamma"].to(plain)
        g = previous - plain
        m = b1 * memory["m"].to(plain) + (1 - b1) * g
        v = b2 * memory["v"].to(plain) + (1 - b2) * g * g
        step = (m / (1 - b1)) / (torch.sqrt(v / (1 - b2)) + self.adam_eps)
        gamma = (previous - self.adam_lr * step).clamp(min=0) * active
        total = gamma.sum(1, keepdim=True)
        gamma = torch.where(total > 0, gamma / total.clamp(min=1e-30), plain)  # guard a zero sum
        seen = torch.tensor(self.renormalised)
        return gamma, {"gamma": gamma.cpu(), "m": m.cpu(), "v": v.cpu(), "renormalised": seen}

    def renormalise(self, memory: Memory) -> Memory:
        """Alg. 2, lines 5–9, on the memory: every renormalisation since the client's last
        E-step, in turn (a removed model's γ dropped, the rest renormalised; a sample with
        nothing left starts uniform over the remaining models)."""
        g = memory["gamma"]
        # a memory from an older checkpoint, renormalised when it was written, lacks the count
        seen = int(memory.get("renormalised", self.renormalised))
        for event in range(seen + 1, self.renormalised + 1):
            keep = keep_after(self.removed_at, event)
            g = g * keep.to(g)
            total = g.sum(1, keepdim=True)
            g = torch.where(total > 0, g / total.clamp(min=1e-30), (keep / keep.sum()).to(g))
        return {**memory, "gamma": g}

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        return fedrc_tasks(gamma, models, self.active, mean_omega(gamma), self.hard_train)


class FedRC(FedEM):
    name = "fedrc"
    title = "FedRC"
    paper = "Guo et al., ICML 2024"
    Settings = FedRCSettings
    settings: FedRCSettings
    Step = FedRCStep

    def init_state(self) -> None:
        super().init_state()
        self.tables = torch.zeros(
            self.num_clients, self.num_models, self.num_classes, dtype=torch.float64
        )
        self.prior = torch.full(
            (self.num_models, self.num_classes), 1.0 / self.num_classes, dtype=torch.float64
        )
        self.active = torch.ones(self.num_models, dtype=torch.bool)
        self.sizes = torch.zeros(self.num_clients, dtype=torch.float64)
        self.cross = torch.zeros(
            self.num_clients, self.num_models, self.num_models, dtype=torch.float64
        )
        self.rounds_done = 0
        self.removed_at = torch.zeros(self.num_models, dtype=torch.long)  # 0: active
        self.renormalised = 0  # how often Alg. 2's renormalisation ran
        self.noise = torch.Generator().manual_seed(self.config.seed)

    @property
    def adam(self) -> dict[int, Memory]:
        """Each client's Adam E-step memory (γ^{t−1}, moments), where its data is."""
        return self.memory

    @property
    def client_part(self) -> bool:
        """A shared body is averaged by each task's γ-mass, which stays on the client: that
        variant runs its E-step on the server (the fallback)."""
        return super().client_part and not self.settings.shared_body

    def client_step(self, client: int) -> FedRCStep:
        c = self.settings
        return FedRCStep(
            omega=self.omega[client].clone(),
            prior=self.prior.clone(),
            active=self.active.clone(),
            removed_at=self.removed_at.clone(),
            renormalised=self.renormalised,
            estep=c.estep,
            adam_lr=c.adam_lr,
            adam_beta1=c.adam_beta1,
            adam_beta2=c.adam_beta2,
            adam_eps=c.adam_eps,
            heldout_label_prior=c.heldout_label_prior,
            cross=c.merge_gap is not None,
            hard_train=c.hard_train,
        )

    def receive(self, client: int, upload: dict[str, torch.Tensor]) -> None:
        """ω_i, N_i, the label table (with `table_noise`: plus N(0, ξ²) drawn here, in client
        order, from the run's seeded generator) and, with `merge_gap`, X_i."""
        super().receive(client, upload)
        self.sizes[client] = float(upload["size"])
        table = upload["table"].to("cpu", torch.float64).T  # (classes, K)
        if self.settings.table_noise > 0:
            table = table + self.settings.table_noise * torch.randn(
                table.shape, generator=self.noise
            )
        self.tables[client] = table.T
        if "cross" in upload:
            self.cross[client] = upload["cross"].to("cpu", torch.float64)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        hard = self.settings.hard_train
        return fedrc_tasks(gamma, models, self.active, self.omega[client], hard)

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        if self.settings.shared_body:
            self._body_sum = torch.zeros(models.shape[1], dtype=torch.float64, device=models.device)
            self._body_mass = torch.zeros(1, dtype=torch.float64, device=models.device)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        super().fold(client, task, result)
        if self.settings.shared_body:
            mass = float(task.weights.sum())
            self._body_sum.add_(result.params, alpha=mass)
            self._body_mass += mass

    def contributions(self) -> list[torch.Tensor]:
        """FedEM's sums, plus the bodies' γ-mass-weighted sum with a shared body."""
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

    def end_round(self) -> None:
        totals = self.tables.sum(0).clamp(min=self.settings.label_floor)
        self.prior = totals / totals.sum(1, keepdim=True)
        self.rounds_done += 1
        c = self.settings
        if self.rounds_done < c.prune_after or not (self.sizes > 0).any():
            return
        if c.prune_threshold is not None:
            self.prune(c.prune_threshold)
        if c.merge_gap is not None:
            self.merge_interchangeable(c.merge_gap)

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
        """Remove the lighter of two models when each fits the other's samples within `gap`:
        A[a, b] = Σ_i X_i[a, b] / Σ_ij γ_{ij;a} is model b’s mean loss on model a’s samples."""
        mass = self.gamma_mass()
        mean_loss = self.cross.sum(0) / mass.clamp(min=1e-30)[:, None]
        own = mean_loss.diagonal()
        pairs = []
        for a in range(self.num_models):
            for b in range(a + 1, self.num_models):
                if self.active[a] and self.active[b] and mass[a] > 0 and mass[b] > 0:
                    excess = max(mean_loss[a, b] - own[a], mean_loss[b, a] - own[b])
                    if excess < gap:
                        pairs.append((float(excess), a, b))
        for _, a, b in sorted(pairs):
            if self.active[a] and self.active[b]:
                self.remove(b if mass[b] < mass[a] else a)
        self.renormalise()

    def remove(self, k: int) -> None:
        """Model k is removed by the renormalisation about to run."""
        self.active[k] = False
        self.removed_at[k] = self.renormalised + 1

    def renormalise(self) -> None:
        """Alg. 2, lines 5–9: drop the removed models' ω and renormalise the rest (a client
        that had nothing left starts uniform over the remaining models). Each client's γ^{t−1}
        (its Adam memory) gets the same, counted here, when it next runs its E-step
        (`FedRCStep.renormalise`): the memory stays where the client's data is."""
        self.renormalised += 1
        keep = self.active.to(self.omega.dtype)
        kept = self.omega * keep
        self.omega = torch.where(
            kept.sum(1, keepdim=True) > 0,
            kept / kept.sum(1, keepdim=True).clamp(min=1e-300),
            keep / keep.sum(),
        )

    def round_info(self) -> dict[str, Any]:
        return {"active_models": int(self.active.sum())}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "tables": self.tables,
            "prior": self.prior,
            "active": self.active,
            "sizes": self.sizes,
            "cross": self.cross,
            "rounds_done": self.rounds_done,
            "removed_at": self.removed_at,
            "renormalised": self.renormalised,
            "adam": self.memory,
            "noise_state": self.noise.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.noise.set_state(state.pop("noise_state"))
        self.memory = state.pop("adam", self.memory)
        super().load_state_dict(state)
