"""PACFL (Vahidian et al., AAAI 2023): one-shot clustering by the angles between data subspaces.

Signature (client side, once): for each class c the client holds, the raw flattened inputs form
the columns of X_c (d × n_c); a thin SVD X_c = U Σ Vᵀ gives the first p = `n_basis` left
singular vectors U_{i,c}; the client's signature is U_i = [U_{i,c1}, U_{i,c2}, …] (d × p·#classes).
Proximity (server): A[i, j] = min over entries of arccos(clip(U_iᵀ U_j, −1, 1)), in degrees, the
smallest angle between a basis vector of i and one of j (the authors' code; an elementwise
stand-in for the smallest principal angle). `angle: principal` takes instead the smallest
principal angle between any class subspace of i and any of j, arccos σ_max(U_{i,c}ᵀ U_{j,c'}).
Clustering: agglomerative on A: merge the two closest clusters while their distance is ≤ β
(`cluster_alpha`, degrees), the merged row being the mean ('average'), max ('complete') or min
('single') of the two rows. Training: FedAvg within each cluster, N_i-weighted; clusters never
change.

fedrc's rounds see only the sampled clients, so the one-shot step is spread over the rounds:
- the first round's sampled clients are clustered as above (with full participation, the
  default, that is every participating client before any training, as in the authors' code);
  if that leaves more clusters than the K rows (`--clusters`), merging goes on past β until K;
- a client sampled for the first time later is a newcomer (the paper's rule): it joins the
  cluster at the smallest linkage distance (mean / max / min of its angles to the members), or
  opens a cluster in a free row if every distance is > β; with no free row it joins the nearest.
Held-out clients take the lowest-loss cluster model (`assign_held_out` sees losses, not images).

Statistic layout (`describe` → `observe`): C blocks of d × p, class c's block holding its basis
vectors as columns; a zero column means no vector (an absent class, or a class with fewer than p
samples). The server keeps the non-empty blocks and forgets which class each was, as the
authors' `hstack` does: the angles cannot tell which label a subspace carries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering, hard_gamma, lowest_loss, one_hot
from pipeline.algorithms.settings import PACFLSettings


def subspace_bases(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, p: int, signed: bool = True
) -> torch.Tensor:
    """(C, d, p): per class, the first p left singular vectors of X_c (d × n_c, raw pixels);
    zero columns where there are fewer. Each vector's sign is fixed so that its largest entry
    in magnitude is positive (the SVD leaves it free, and the elementwise angle depends on it);
    `signed=False` keeps the SVD's own signs, as the authors' code does (`lapack_signs`)."""
    x = images.reshape(len(images), -1).double()
    out = torch.zeros(num_classes, x.shape[1], p, dtype=torch.float64, device=x.device)
    for c in labels.unique().tolist():
        u = torch.linalg.svd(x[labels == c].T, full_matrices=False).U[:, :p]  # X_c = U Σ Vᵀ
        if signed:
            u = u * u.gather(0, u.abs().argmax(0, keepdim=True)).sign()
        out[c, :, : u.shape[1]] = u
    return out


def angles(mine: torch.Tensor, others: list[torch.Tensor], rule: str) -> torch.Tensor:
    """A[i, j] in degrees from signature i to each signature j (blocks × d × p, float64; a zero
    column is no vector)."""
    theirs = torch.cat(others)
    cos = torch.einsum("adp,bdq->abpq", mine, theirs)  # U_{i,c}ᵀ U_{j,c'}, every pair of blocks
    if rule == "principal":
        top = torch.linalg.matrix_norm(cos, ord=2).amax(0)  # cos θ_1 = σ_max, per block of j
    else:
        used = (mine.norm(dim=1) > 0.5)[:, None, :, None] & (theirs.norm(dim=1) > 0.5)[
            None, :, None
        ]
        top = cos.masked_fill(~used, -math.inf).amax((0, 2, 3))  # min arccos = arccos max
    per_client = torch.stack([t.max() for t in top.split([len(o) for o in others])])
    return torch.rad2deg(torch.arccos(per_client.clamp(-1.0, 1.0)))


def agglomerate(distance: np.ndarray, beta: float, linkage: str, cap: int) -> list[list[int]]:
    """The authors' hierarchical clustering: merge the closest pair (the first minimum, row by
    row) while it is ≤ β, or while more than `cap` clusters remain; the merged row is the
    mean / max / min of the two. Returns the clusters (sorted members), ordered by first member."""
    a = distance.astype(np.float64).copy()
    groups = [[i] for i in range(len(a))]
    combine = {"average": lambda x, y: (x + y) / 2, "complete": np.maximum, "single": np.minimum}
    while len(groups) > 1:
        np.fill_diagonal(a, np.inf)
        i, j = np.unravel_index(np.argmin(a), a.shape)
        i, j = min(i, j), max(i, j)
        if a[i, j] > beta and len(groups) <= cap:
            break
        merged = combine[linkage](a[i], a[j])
        a[i], a[:, i] = merged, merged
        a = np.delete(np.delete(a, j, 0), j, 1)
        groups[i] = sorted(groups[i] + groups.pop(j))
    return groups


@described("pacfl")
class PACFL(HardClustering):
    """State: each described client's signature (its non-empty blocks, float32), its cluster
    (−1 until described) and the number of clusters in use; ω_i one-hot on the cluster."""

    settings: PACFLSettings
    describes = True

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.full((self.num_clients,), -1, dtype=torch.long)
        self.clusters = 0
        self.bases: dict[int, torch.Tensor] = {}
        self._new: list[int] = []  # described this round, clustered at the round's first assign

    # --- the signature ------------------------------------------------------------------------
    def wants_statistics(self, sampled: list[int]) -> list[int]:
        return [c for c in sampled if int(self.cluster[c]) < 0]

    def describe(
        self, client: int, images: torch.Tensor, labels: torch.Tensor, models: torch.Tensor
    ) -> torch.Tensor:
        s = self.settings
        bases = subspace_bases(images, labels, self.num_classes, s.n_basis, not s.lapack_signs)
        return bases.flatten()

    def observe(self, client: int, statistic: torch.Tensor) -> None:
        blocks = statistic.reshape(self.num_classes, -1, self.settings.n_basis)
        self.bases[client] = blocks[blocks.abs().sum((1, 2)) > 0].float()
        self._new.append(client)

    # --- one-shot clustering, then newcomers --------------------------------------------------
    def distances(self, client: int, others: list[int]) -> np.ndarray:
        """A[client, j] for each j of `others`, in degrees."""
        theirs = [self.bases[j].double() for j in others]
        return angles(self.bases[client].double(), theirs, self.settings.angle).numpy()

    def settle(self) -> None:
        """Cluster the clients described this round (see the module docstring)."""
        new, self._new = sorted(self._new), []
        if not new:
            return
        s = self.settings
        if self.clusters == 0:
            a = np.stack([self.distances(i, new) for i in new])
            for k, members in enumerate(
                agglomerate(a, s.cluster_alpha, s.linkage, self.num_models)
            ):
                self.join([new[m] for m in members], k)
            return
        link = {"average": np.mean, "complete": np.max, "single": np.min}[s.linkage]
        for client in new:
            gaps = [link(self.distances(client, self.members(k))) for k in range(self.clusters)]
            nearest = int(np.argmin(gaps))
            opens = gaps[nearest] > s.cluster_alpha and self.clusters < self.num_models
            self.join([client], self.clusters if opens else nearest)

    def members(self, k: int) -> list[int]:
        return (self.cluster == k).nonzero().flatten().tolist()

    def join(self, clients: list[int], k: int) -> None:
        self.clusters = max(self.clusters, k + 1)
        for i in clients:
            self.cluster[i] = k
            self.omega[i] = one_hot(k, self.num_models)

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.settle()
        return hard_gamma(losses, int(self.cluster[client]))

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return lowest_loss(losses, self.num_models, list(range(max(self.clusters, 1))))

    def round_info(self) -> dict[str, Any]:
        return {"active_models": self.clusters}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "cluster": self.cluster,
            "clusters": self.clusters,
            "bases": self.bases,
        }
