"""FedCCFA (Chen et al., NeurIPS 2024): classifier clustering and feature alignment under
distributed concept drift.

The model is a feature extractor (everything before the final layer, shared: one global row)
and a classifier, the final linear layer (`self.head`), which every client keeps for itself.
A sampled client i, in the authors' order (their `methods/FedCCFA.py`):
  (b) trains a copy of the fixed initial classifier on the global extractor, classifier only,
      `balanced_epochs` at `balanced_lr` on a class-balanced subset (min(5, smallest class)
      samples of each class it has): the classifier v_i that is clustered;
  (c) trains its personal classifier (on a first visit: the classifier of (b)) for `clf_epochs`
      at `clf_lr`, then the extractor alone for `rep_epochs` at `rep_lr` with the loss
      CE + λ_i ℓ towards its class anchors A_i: `penalize: CL`, ℓ = −log softmax_c(cos(h, A_ic)
      / τ)[y]; `penalize: L2`, ℓ = ‖h − A_iy‖² / D (the authors' MSELoss over the batch);
      λ_i = H(P_i(Y)) / γ (the entropy of its label distribution, in nats), from round
      `align_after` + 1 on and once the client has anchors;
  then sends the extractor, its classifier and its class prototypes P_ic = mean_{y=c} h.
Server: the extractor ← Σ_i N_i θ_i / Σ_i N_i. For each label c: the sampled clients' rows
v_i[c] = (W_c, b_c) of the classifiers of (b), their MADD distance
  d(i, j) = 1/(n − 2) Σ_{z ≠ i, j} |cos(v_i, v_z) − cos(v_j, v_z)|,
DBSCAN (eps, min_samples = 1) on d; within each group of two or more the members' trained rows
c and their prototypes of c are averaged and written back: the personal classifier row and the
client's anchor A_ic. `weights: uniform` averages plainly; `weights: label` weights member i by
its count of label c (the authors' label_distribution). A client alone in its group keeps its
own row and prototype. `clustered_protos: false` aligns every client instead to the global
prototypes: for each class the mean (by `weights`) of the prototypes of the last round's sampled
clients that have it. `oracle: true` replaces MADD + DBSCAN by the benchmark's truth: for each
label, the sampled clients whose current concepts label it alike form a group (`label_keys`).
As released (`aliased_protos`, docs/authors-check.md §7): the authors' uniform sum of a label's
prototypes adds in place into the first sampled holder's own tensor, so that client enters its
group's mean (or keeps, alone) the sum over all holders; "first" here is the lowest client id.

fedrc's view: K = 1 row, the extractor with the N_i-weighted mean of the round's trained
classifiers (that classifier only scores clients without one of their own: the held-out
clients, which FedCCFA does not handle). ω = 1 for everyone; each participating client predicts
with its personal model (the current extractor and its classifier). `--clusters` is not used:
the grouping is per label and per round, not a partition of the clients.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import Rows
from pipeline.algorithms.settings import FedCCFASettings
from pipeline.common.errors import FedrcError
from pipeline.common.settings import Settings
from pipeline.data.concepts import parse_concept
from pipeline.engine.rows import RowStore, client_rows
from pipeline.engine.task import PERSONAL, LocalResult, LocalTask, Stage


def madd(v: torch.Tensor) -> torch.Tensor:
    """(n, n) MADD distances between the rows of v (n, d): the mean over the other rows z of
    |cos(v_i, v_z) − cos(v_j, v_z)|. Fewer than 3 rows have no other row: +inf (no merging)."""
    n = v.shape[0]
    if n < 3:
        return torch.full((n, n), math.inf, dtype=torch.float64).fill_diagonal_(0.0)
    u = v.double() / v.double().norm(dim=1, keepdim=True).clamp(min=1e-12)
    cos = u @ u.T
    out = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        gaps = (cos[i][None, :] - cos).abs()  # gaps[j, z] = |cos(v_i, v_z) − cos(v_j, v_z)|
        out[i] = (gaps.sum(1) - gaps[:, i] - gaps.diagonal()) / (n - 2)  # drop z = i and z = j
    out.fill_diagonal_(0.0)
    return out


def dbscan(distances: torch.Tensor, eps: float, min_samples: int) -> list[int]:
    """DBSCAN on a precomputed distance matrix (scikit-learn's rule: neighbours within
    distance <= eps, the point itself included; a core point has >= min_samples of them):
    a cluster id per point, -1 for noise. With min_samples = 1 the clusters are the connected
    components of the graph of pairs within eps."""
    n = distances.shape[0]
    near = distances <= eps
    core = near.sum(1) >= min_samples
    labels, cluster = [-1] * n, 0
    for i in range(n):
        if labels[i] != -1 or not core[i]:
            continue
        labels[i], stack = cluster, [i]
        while stack:
            j = stack.pop()
            if not core[j]:
                continue
            for k in near[j].nonzero().flatten().tolist():
                if labels[k] == -1:
                    labels[k] = cluster
                    stack.append(k)
        cluster += 1
    return labels


def groups(labels: list[int]) -> list[list[int]]:
    """Positions sharing a cluster id, in order; each noise point (-1) alone."""
    out: dict[int, list[int]] = {}
    for position, label in enumerate(labels):
        out.setdefault(label if label >= 0 else -1 - position, []).append(position)
    return list(out.values())


PERMUTING = ("identity", "reverse", "shift", "permutation", "swap")  # a label map per class


def label_keys(names: tuple[str, ...] | list[str], num_classes: int) -> torch.Tensor:
    """(concepts, C) `oracle` keys: two clients share label c's classifier row iff their
    concepts' keys of c agree. A label map that permutes the classes keys c by the true class
    it labels c (so a swap a ↔ b splits rows a and b only); a noisy or native concept, whose
    label c has no single true class, keys every label by C + its index (its own group)."""
    keys = torch.empty(len(names), num_classes, dtype=torch.int64)
    for k, name in enumerate(names):
        concept = parse_concept(name)
        if concept.kind not in PERMUTING:
            keys[k] = num_classes + k
            continue
        classes = np.arange(num_classes)
        mapped = concept.relabel(classes, num_classes, np.random.default_rng(0))
        keys[k, torch.from_numpy(mapped)] = torch.from_numpy(classes)  # label m(y) ← class y
    return keys


@described("fedccfa")
class FedCCFA(Algorithm):
    personal_models = True
    needs_sequential = own_training = True  # staged local training (`LocalTask.stages`)
    local_training = "trains in stages (LocalTask.stages, class anchors, prototypes)"
    settings: FedCCFASettings

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        return 1

    def init_state(self) -> None:
        super().init_state()
        if self.config.lr_schedule != "constant":
            raise FedrcError(
                "train.lr_schedule: fedccfa trains each stage with SGD at its own learning rate "
                "(balanced_lr, clf_lr, rep_lr); set it to constant"
            )
        c = self.num_classes
        width = 0 if self.head is None else self.head[1] - self.head[0]  # None: no model given
        if self.head is not None and (width % c or width // c < 2):
            raise FedrcError(f"train.model: fedccfa needs a linear final layer with bias ({width})")
        self.dim = max(width // c - 1, 0)  # D, the features: the head is W (C, D), then b (C,)
        self.heads = torch.zeros(self.num_clients, width)  # personal classifiers
        self.has_head = torch.zeros(self.num_clients, dtype=torch.bool)
        self.anchors = torch.zeros(self.num_clients, c, self.dim)  # A_ic, clustered prototypes
        self.anchored = torch.zeros(self.num_clients, c, dtype=torch.bool)
        self.counts = torch.zeros(self.num_clients, c, dtype=torch.float64)  # labels last seen
        # `clustered_protos: false`: the last round's prototype of each class over all its clients
        self.global_protos = torch.zeros(c, self.dim)
        self.global_anchored = torch.zeros(c, dtype=torch.bool)
        self.start_head: torch.Tensor | None = None  # the fixed initial classifier (b) starts from
        self.extractor: torch.Tensor | None = None  # the latest global row, for personal models
        self.rounds_done = 0
        self.last_clusters = 0.0
        self.grouping: dict[int, list[list[int]]] = {}  # label → the last round's client groups
        # `oracle`: each client's label keys (`label_keys`) at the round's step, -1: none given;
        # given again before every round (`true_concepts`), so not part of the state
        self._truth = torch.full((self.num_clients, c), -1, dtype=torch.int64)
        self._rows: RowStore | None = None
        self._balanced: dict[int, torch.Tensor] = {}

    # --- the classifier's rows in a flat head: W (C, D) row-major, then b (C,) ---------------
    def row(self, head: torch.Tensor, label: int) -> torch.Tensor:
        d, c = self.dim, self.num_classes
        return torch.cat(
            [head[label * d : (label + 1) * d], head[c * d + label : c * d + label + 1]]
        )

    def set_row(self, head: torch.Tensor, label: int, value: torch.Tensor) -> None:
        d, c = self.dim, self.num_classes
        head[label * d : (label + 1) * d] = value[:d]
        head[c * d + label] = value[d]

    def average(self, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """A group's mean of `values` (m, d), one row per member: uniform, or with `weights:
        label` weighted by the members' counts of the label (uniform where none has it)."""
        if self.settings.weights == "uniform" or not bool(counts.sum() > 0):
            return values.mean(0)
        w = counts.to(torch.float64)
        return ((w[:, None] * values.double()).sum(0) / w.sum()).to(values.dtype)

    def weight(self, client: int) -> float:
        """λ_i = H(P_i(Y)) / γ (0 log 0 = 0), or `lam` when γ = 0."""
        if self.settings.gamma == 0:
            return self.settings.lam
        p = self.counts[client] / self.counts[client].sum()
        p = p[p > 0]
        return float(-(p * p.log()).sum()) / self.settings.gamma

    # --- the oracle -------------------------------------------------------------------------
    def wants_true_concepts(self) -> bool:
        return self.settings.oracle

    def true_concepts(self, names: tuple[str, ...], concepts: list[int]) -> None:
        keys = label_keys(names, self.num_classes)
        n = min(len(concepts), self.num_clients)
        self._truth[:n] = keys[torch.tensor(concepts[:n], dtype=torch.int64)]

    def oracle_groups(self, clients: list[int], label: int) -> list[list[int]]:
        """The sampled clients (positions) whose true concepts label `label` alike."""
        keys = self._truth[clients, label]
        if bool((keys < 0).any()):
            raise FedrcError(
                "train.fedccfa.oracle: the round loop gave no true concepts (the in-process "
                "and torchrun loops do; Flower does not)"
            )
        return groups(keys.tolist())

    # --- round ------------------------------------------------------------------------------
    def reads(self, client: int) -> Rows:
        """No loss: the one row trains on every sample."""
        return ()

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """No E-step (one row): keep the client's label counts, P_i(Y) of this round's data."""
        self.counts[client] = torch.bincount(labels.cpu(), minlength=self.num_classes).double()
        return torch.ones_like(losses)

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        s, (start, stop) = self.settings, self.head
        ones = torch.ones(gamma.shape[0], dtype=gamma.dtype, device=gamma.device)
        fresh = models[0].clone()
        fresh[start:stop] = self.start_head.to(fresh)
        balanced = Stage(
            s.balanced_epochs, s.balanced_lr, train=self.head, balanced=s.balanced_per_class
        )
        tasks = []
        if s.balanced_epochs > 0:  # (b): the classifier that is clustered
            tasks.append(LocalTask(0, fresh, ones, weight=0.0, stages=(balanced,)))
        lam = self.weight(client) if self.rounds_done >= s.align_after else 0.0
        own, has = self.anchors[client], self.anchored[client]
        if not s.clustered_protos:
            own, has = self.global_protos, self.global_anchored
        anchors = None
        if lam > 0 and bool(has.any()):
            anchors = own.clone()
            anchors[~has] = math.nan
            anchors = anchors.to(models)
        personal = Stage(s.clf_epochs, s.clf_lr, train=self.head)
        extractor = Stage(
            s.rep_epochs, s.rep_lr, freeze=self.head, align=lam, temperature=s.temperature,
            penalize=s.penalize,
        )  # fmt: skip
        stages = (personal, extractor) if s.clf_epochs > 0 else (extractor,)
        if bool(self.has_head[client]):
            begin = models[0].clone()
            begin[start:stop] = self.heads[client].to(begin)
        else:  # the authors' first visit: (c) goes on from the classifier of (b)
            begin = fresh
            stages = (balanced, *stages) if s.balanced_epochs > 0 else stages
        n = float(gamma.shape[0])
        tasks.append(
            LocalTask(
                PERSONAL, begin, ones, weight=n, stages=stages, class_anchors=anchors,
                prototypes=True,
            )
        )  # fmt: skip
        return tasks

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        if self.start_head is None:  # the server's classifier, which its code never updates
            self.start_head = models[0, self.head[0] : self.head[1]].to("cpu", torch.float32)
        width = self.head[1] - self.head[0]
        self._rows = client_rows(2 * width + self.num_classes * self.dim, self.num_clients)
        self._balanced = {}

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        """(b)'s classifier waits for (c); (c) adds its extractor to the sum and sends
        [v_i, trained classifier, prototypes] to every place."""
        start, stop = self.head
        if task.model != PERSONAL:
            self._balanced[client] = result.params[start:stop].detach().clone()
            return
        self.accumulate(0, result.params, task.weight)
        trained = result.params[start:stop]
        clustered = self._balanced.pop(client, trained)
        self._rows.add(
            client, torch.cat([clustered, trained, result.prototypes.flatten().to(trained)])
        )

    def shared_rows(self) -> RowStore:
        return self._rows

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """The extractor average, then class-level classifier clustering (module docstring)."""
        new = super().aggregate(models)
        self.extractor = new[0].to("cpu", torch.float32).clone()
        clients, rows = [], []
        for keys, block in self._rows.blocks():
            clients += keys
            rows.append(block)
        self._rows.close()
        if not clients:
            return new
        rows = torch.cat(rows)
        width, c, d = self.head[1] - self.head[0], self.num_classes, self.dim
        clustered, trained = rows[:, :width], rows[:, width : 2 * width].clone()
        protos = rows[:, 2 * width :].reshape(len(clients), c, d)
        counts = self.counts[clients]  # (n, C) the labels of this round's data
        present = counts > 0
        for label in range(c):  # the global prototypes, over every sampled client with the label
            having = present[:, label].nonzero().flatten().tolist()
            if having:
                self.global_protos[label] = self.average(
                    protos[having, label], counts[having, label]
                )
                if self.as_released("aliased_protos") and self.settings.weights == "uniform":
                    protos[having[0], label] = protos[having, label].sum(0)
        anchors, anchored = protos.clone(), present.clone()
        self.global_anchored = present.any(0)
        found = 0
        for label in range(c):
            if self.settings.oracle:
                parts = self.oracle_groups(clients, label)
            else:
                vectors = torch.stack([self.row(h, label) for h in clustered])
                parts = groups(dbscan(madd(vectors), self.settings.eps, self.settings.min_samples))
            self.grouping[label] = [[clients[m] for m in members] for members in parts]
            found += len(parts)
            for members in parts:
                if len(members) < 2:
                    continue
                own = torch.stack([self.row(trained[m], label) for m in members])
                mean_row = self.average(own, counts[members, label])
                for m in members:
                    self.set_row(trained[m], label, mean_row)
                having = [m for m in members if present[m, label]]
                if having:
                    mean_proto = self.average(protos[having, label], counts[having, label])
                    anchors[members, label] = mean_proto
                    anchored[members, label] = True
        index = torch.tensor(clients)
        self.heads[index] = trained
        self.has_head[index] = True
        self.anchors[index] = anchors
        self.anchored[index] = anchored
        self.last_clusters = found / c
        return new

    def end_round(self) -> None:
        self.rounds_done += 1

    def round_info(self) -> dict[str, Any]:
        """The mean number of groups per label among the round's sampled classifiers."""
        return {"classifier_groups": self.last_clusters}

    def personal_model(self, client: int) -> torch.Tensor | None:
        if self.extractor is None or not bool(self.has_head[client]):
            return None
        own = self.extractor.clone()
        own[self.head[0] : self.head[1]] = self.heads[client]
        return own

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "heads": self.heads,
            "has_head": self.has_head,
            "anchors": self.anchors,
            "anchored": self.anchored,
            "counts": self.counts,
            "global_protos": self.global_protos,
            "global_anchored": self.global_anchored,
            "start_head": self.start_head,
            "extractor": self.extractor,
            "rounds_done": self.rounds_done,
            "last_clusters": self.last_clusters,
            "grouping": self.grouping,
        }
