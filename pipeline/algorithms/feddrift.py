"""FedDrift (Jothimurugesan et al., AISTATS 2023): a new model when a client's concept drifts,
and hierarchical merging of models that fit each other's clients.

A pool of K = `--clusters` rows (the authors' `concept_num`); each client is on one row (hard)
and keeps it for the whole time step. At a client's first E-step of a step (its losses under
every row on the step's new data, before any training on them), with s_k its mean loss under
row k and the candidates the rows in use that are not isolated:

    best = argmin_k s_k                                  (the client joins its best model ...)
    if s_best − prev_i > δ:  row = a fresh row, a copy of θ_best, isolated for W steps
    prev_i ← s_best                                      (... unless its loss rose by > δ)

A fresh row is the first row not in use, else the least recently used row that no client holds;
with none, the client stays on its best model. Isolated clients keep their row without a check.
Once a step (from step 1) the rows in use, not isolated and scored this step are merged: with
L_a(θ_b) the mean loss of model b on cluster a's data,

    D(a, b) = max(L_a(θ_b) − L_a(θ_a), L_b(θ_a) − L_b(θ_b), 0)

(`distance: data`, the authors' option 'B'). `distance: model` is their option 'A', the one
their README's FedDrift setting uses: how much each model's loss rises from its own cluster's
data to the other's, D(a, b) = max(L_b(θ_a) − L_a(θ_a), L_a(θ_b) − L_b(θ_b), 0). Complete
linkage cut at δ′ groups the rows; each group folds into its first row,
θ_a ← p θ_a + (1 − p) θ_b with p = n_a / (n_a + n_b), n the (client, step) chunks each model
was trained on, and the freed row leaves the pool.

FedDrift-Eager: the same detector, but all clients that drift within a step share one new row;
no isolation window and no merging.

Where fedrc differs (protocol §10): the detector and D use the cross-entropy the paper writes,
not the accuracy of the authors' code (δ is in nats). fedrc keeps no past data, where the
authors replay every past batch assigned to a cluster, in training and in scoring: a model
trains on its members' data of the current step, and cluster a is scored on the current data of
every client whose batches went to row a since its concept last changed (a detected drift, or a
move to a model in use whose loss on its data is lower than its old model's by more than δ).
Each client scores the models in its first E-step of the step, and the merge comes at the end
of the round by which every client seen so far has done so (the step's first round with full
participation) or at the step's last round: after that round's training, where the authors
merge before it.

Where the data stays (the client part, `FedDriftStep`): a client's first E-step of a step is a
scoring step (`score_steps`): it sends each model's mean loss on its new data, s_k (the
authors' clients send each model's accuracy), and while a merge is due the sums of those losses
and N_i, which score the clusters its data stands for. The server runs the detector on these K
numbers in client order (`receive_scores`) and hands every sampled client its row and the row
its training starts from; the client sends up ω_i, one-hot on that row, with its trained model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import (
    ClientOutcome,
    ClientStep,
    Memory,
    Rows,
    Upload,
    hard_outcome,
    one_hot,
)
from pipeline.algorithms.settings import FedDriftEagerSettings, FedDriftSettings
from pipeline.engine.task import LocalTask


def lowest(scores: torch.Tensor, allowed: torch.Tensor) -> int:
    """The allowed row with the lowest score (ties: the lowest row)."""
    return int(scores.masked_fill(~allowed, float("inf")).argmin())


def mean_losses(losses: torch.Tensor) -> torch.Tensor:
    """s_k = L_i(θ_k), each model's mean loss over the client's samples (float64)."""
    return losses.mean(0).to("cpu", torch.float64)


@dataclass
class FedDriftStep(ClientStep):
    """A scoring step sends the client's mean loss under each model (with `merging`, also the
    sums of its losses and N_i); a training step trains the client's row, starting from row
    `start` (a new row's copy). Either sends nothing per sample."""

    scoring: bool
    merging: bool
    row: int  # the client's row this round (−1: none yet)
    start: int
    in_use: torch.Tensor  # the rows in use (int64): a held-out client chooses among them

    def run(self, losses: torch.Tensor, labels: torch.Tensor, memory: Memory | None):
        if self.scoring:
            return ClientOutcome(torch.zeros_like(losses), self.scores(losses))
        return hard_outcome(losses, self.row)

    def reads(self, predictors: int) -> Rows:
        """Every model's losses to score; none to train its row."""
        return tuple(range(predictors)) if self.scoring else ()

    def scores(self, losses: torch.Tensor) -> Upload:
        upload = {"scores": mean_losses(losses)}
        if self.merging:
            upload["sums"] = losses.sum(0).to("cpu", torch.float64)
            upload["size"] = torch.tensor(float(losses.shape[0]), dtype=torch.float64)
        return upload

    def local_tasks(self, gamma: torch.Tensor, models: torch.Tensor) -> list[LocalTask]:
        if self.scoring:
            return []
        k, n = self.row, float(gamma.shape[0])
        return [LocalTask(k, models[self.start], gamma[:, k], weight=n)]

    def held_out(self, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The in-use model with the lowest loss on the client's labelled part."""
        allowed = torch.zeros(losses.shape[1], dtype=torch.bool)
        allowed[self.in_use] = True
        return one_hot(lowest(mean_losses(losses), allowed), losses.shape[1])


@described("feddrift")
class FedDrift(HardClustering):
    unlabeled_rule = "fallback: the model in use with the lowest prediction entropy"
    settings: FedDriftSettings
    Step = FedDriftStep

    def init_state(self) -> None:
        super().init_state()
        k, m = self.num_models, self.num_clients
        self.omega = torch.stack([one_hot(0, k)] * m)
        self.cluster = torch.full((m,), -1, dtype=torch.long)  # -1: not seen yet
        self.prev = torch.zeros(m, dtype=torch.float64)  # prev_i, once the client has a row
        self.checked = torch.full((m,), -1, dtype=torch.long)  # the step of the last check
        self.release = torch.full((m,), -1, dtype=torch.long)  # isolated until (-1: not)
        # the rows a client's chunks went to since its last drift: its data stands for theirs
        self.lineage = torch.zeros(m, k, dtype=torch.bool)
        self.in_use = torch.zeros(k, dtype=torch.bool)
        self.chunks = torch.zeros(k, dtype=torch.float64)  # n_k: (client, step) chunks
        self.last_used = torch.full((k,), -1, dtype=torch.long)  # the last step with a member
        self.step = 0
        # set at a step's start; merging waits for the round by which every client seen before
        # has checked in (the step's first round when all take part), or the step's last round
        self.merge_due = False
        self.round_in_step = 0
        self.copies: dict[int, int] = {}  # new row → the row it starts from (this round)
        self.table = torch.zeros(k, k, dtype=torch.float64)  # Σ losses of row b on cluster a
        self.mass = torch.zeros(k, dtype=torch.float64)  # samples of cluster a in the table

    @property
    def delta_merge(self) -> float:
        dm = self.settings.delta_merge
        return self.settings.delta if dm is None else dm

    # --- drift detection --------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self.release[(self.release >= 0) & (self.release <= step)] = -1  # the window ends
        self.merge_due = step > 0
        self.round_in_step = 0
        self.table.zero_()
        self.mass.zero_()

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self.round_in_step += 1

    def isolated(self) -> torch.Tensor:
        """(K,) the rows of clients still in their isolation window."""
        rows = torch.zeros(self.num_models, dtype=torch.bool)
        rows[self.cluster[self.release >= 0]] = True
        return rows

    def candidates(self) -> torch.Tensor:
        return self.in_use & ~self.isolated()

    def step_for(self, client: int, scoring: bool) -> FedDriftStep:
        k = int(self.cluster[client])
        in_use = self.in_use.nonzero().flatten()
        return FedDriftStep(scoring, self.merge_due, k, self.copies.get(k, k), in_use)

    def score_steps(self, sampled: list[int]) -> dict[int, ClientStep]:
        """The clients at their first E-step of this step: they score every model."""
        return {c: self.step_for(c, True) for c in sampled if int(self.checked[c]) != self.step}

    def client_step(self, client: int) -> FedDriftStep:
        return self.step_for(client, False)

    def receive_scores(self, client: int, upload: Upload) -> None:
        """The client's row for this step from s_k, its mean losses under every row; while a
        merge is due, its loss sums also score the clusters its data stands for."""
        self.checked[client] = self.step
        scores = upload["scores"].to("cpu", torch.float64)  # s_k = L_i^t(θ_k)
        before = int(self.cluster[client])
        row, drifted = self.check(client, scores)
        # a new concept: a detected drift, or a move to a model in use that fits the data by
        # more than δ better than its old one (a recurring concept): its current data no
        # longer stands for its batches in its earlier rows
        moved = before >= 0 and float(scores[before] - scores[row]) > self.settings.delta
        if drifted or before < 0 or moved:
            self.lineage[client] = False
        self.lineage[client, row] = True
        self.cluster[client] = row
        self.chunks[row] += 1
        self.last_used[row] = self.step
        if self.merge_due:  # the client's data, under every model b, in its clusters a
            rows = self.lineage[client]
            self.table[rows] += upload["sums"].to("cpu", torch.float64)
            self.mass[rows] += float(upload["size"])

    def check(self, client: int, scores: torch.Tensor) -> tuple[int, bool]:
        """The client's row for this step, from its mean losses under every row, and whether
        its concept drifted."""
        drifted = False
        if int(self.cluster[client]) < 0:
            row = best = self.first_row(scores)
        elif int(self.release[client]) >= 0:
            return int(self.cluster[client]), False  # isolated: no check, prev_i kept
        else:
            row = best = lowest(scores, self.candidates())
            drifted = float(scores[best] - self.prev[client]) > self.settings.delta
            if drifted:
                fresh = self.drift_row(best)
                if fresh >= 0:
                    row = fresh
                    self.release[client] = self.step + self.window
        self.prev[client] = scores[best]
        return row, drifted

    @property
    def window(self) -> int:
        return self.settings.window

    @property
    def init(self) -> str:
        return self.settings.init

    def first_row(self, scores: torch.Tensor) -> int:
        """A client seen for the first time: at step 0 the initial clustering ('single': row 0;
        'per-client': a row of its own while there is one), later its best model."""
        if self.step == 0 and self.init == "per-client":
            free = (~self.in_use).nonzero().flatten()
            if len(free):
                return self.open_row(int(free[0]), None)
        candidates = self.candidates()
        pool = candidates if candidates.any() else self.in_use
        return lowest(scores, pool) if pool.any() else self.open_row(0, None)

    def drift_row(self, best: int) -> int:
        """A fresh row starting from θ_best, or -1 when every row is held."""
        row = self.fresh_row()
        return row if row < 0 else self.open_row(row, best)

    def fresh_row(self) -> int:
        """The first row not in use, else the least recently used row nobody holds, else -1."""
        free = (~self.in_use).nonzero().flatten()
        if len(free):
            return int(free[0])
        held = torch.zeros(self.num_models, dtype=torch.bool)
        held[self.cluster[self.cluster >= 0]] = True
        if held.all():
            return -1
        age = self.last_used.masked_fill(held, torch.iinfo(torch.long).max)
        return int(age.argmin())  # ties: the lowest row

    def open_row(self, row: int, source: int | None) -> int:
        """Row `row` enters the pool; it starts as a copy of row `source` (None: as it is)."""
        self.in_use[row] = True
        self.chunks[row] = 0.0
        self.lineage[:, row] = False  # an evicted row's chunks are forgotten
        self.last_used[row] = self.step
        if source is not None:
            self.copies[row] = source
        return row

    # --- training and aggregation -------------------------------------------------------------
    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        """A client on a row opened this round trains from the copy it starts as."""
        return self.client_step(client).local_tasks(gamma, models)

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        base = models.clone()
        for row, source in self.copies.items():
            base[row] = models[source]  # the new row's round starts from θ_source
        self.copies = {}
        new = super().aggregate(base)
        known = self.cluster >= 0
        everyone = bool((self.checked[known] == self.step).all())
        if self.merge_due and (everyone or self.round_in_step == self.config.rounds_per_step):
            self.merge_due = False
            new = self.merge(new)
        return new

    def merge(self, models: torch.Tensor) -> torch.Tensor:
        """Complete-linkage merging of the scored rows at distance δ′."""
        rows = (self.candidates() & (self.mass > 0)).nonzero().flatten()
        if len(rows) < 2:
            return models
        loss = self.table[rows][:, rows] / self.mass[rows, None]  # loss[a, b] = L_a(θ_b)
        if self.settings.distance == "model":
            loss = loss.T  # loss[a, b] = L_b(θ_a): model a on the other cluster's data
        gap = loss - loss.diagonal()[:, None]  # L_a(θ_b) − L_a(θ_a) (model: L_b(θ_a) − L_a(θ_a))
        distance = torch.maximum(gap, gap.T).clamp(min=0).numpy()  # D(a, b)
        np.fill_diagonal(distance, 0.0)
        tree = linkage(squareform(distance, checks=False), method="complete")
        groups = fcluster(tree, self.delta_merge, criterion="distance")
        new = models.clone()
        rows = rows.tolist()
        for group in np.unique(groups):
            base, *others = [r for r, g in zip(rows, groups) if g == group]
            for other in others:
                p = float(self.chunks[base] / (self.chunks[base] + self.chunks[other]))
                new[base] = p * new[base] + (1 - p) * new[other]  # θ_a ← p θ_a + (1 − p) θ_b
                self.fold_row(base, other)
        return new

    def fold_row(self, base: int, other: int) -> None:
        """Row `other`'s clients and chunks go to `base`; `other` leaves the pool."""
        members = self.cluster == other
        self.cluster[members] = base
        self.omega[members] = one_hot(base, self.num_models)
        self.chunks[base] += self.chunks[other]
        self.lineage[:, base] |= self.lineage[:, other]
        self.lineage[:, other] = False
        self.last_used[base] = max(self.last_used[base], self.last_used[other])
        self.in_use[other] = False
        self.chunks[other] = 0.0

    # --- prediction and bookkeeping -----------------------------------------------------------
    def assign_unlabeled(
        self, client: int, logits: torch.Tensor, images: torch.Tensor
    ) -> torch.Tensor:
        """fedrc's label-free fallback (FedDrift has none), among the models in use only: a
        free row holds a stale or untrained model."""
        logp = torch.log_softmax(logits.double(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1).mean(1)  # (K,)
        return one_hot(lowest(entropy.cpu(), self.in_use), self.num_models)

    def round_info(self) -> dict[str, Any]:
        return {"active_models": int(self.in_use.sum())}

    def state_dict(self) -> dict[str, Any]:
        names = ("cluster", "prev", "checked", "release", "lineage", "in_use", "chunks")
        names += ("last_used", "step", "merge_due", "round_in_step", "table", "mass")
        return {**super().state_dict(), **{n: getattr(self, n) for n in names}}


@described("feddrift-eager")
class FedDriftEager(FedDrift):
    """FedDrift-Eager: every client that drifts in a step joins the step's one new row (opened
    by the first of them); the new row sits out the detector for the rest of its step, like a
    row of FedDrift's window of one step; nothing merges."""

    settings: FedDriftEagerSettings

    def init_state(self) -> None:
        super().init_state()
        self.opened: int | None = None  # this step's new row (-1: none was free)

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.merge_due = False
        self.opened = None

    @property
    def window(self) -> int:
        return 1

    @property
    def init(self) -> str:
        return "single"

    def drift_row(self, best: int) -> int:
        if self.opened is None:
            self.opened = super().drift_row(best)
        return self.opened

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "opened": self.opened}
