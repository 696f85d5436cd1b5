"""FLUX (Fenoglio et al., NeurIPS 2025): cluster clients once by descriptors of their data.

protocol §11 lists where fedrc departs from the authors' code (the trigger's one-round lag, the
cap, training in a re-clustering round, newcomers under partial participation).

Warm-up: FedAvg of one global model (row 0; the other rows wait). Each warm-up round the
sampled clients also report, for the model they received, the largest latent value and how
many of their training samples it classifies correctly (`describe`): the authors' evaluation
round, whose accuracy decides when the global model is "good enough" and whose largest latent
value bounds the projection below.

Descriptor of client i (the authors' `Px_label_long`, extended), from the global model θ_g:
    z(x)      the input of the model's final linear layer (latent vector, `latents`)
    p(x) = (z(x) − b·μ_U) V   PCA with C = n_classes components, fitted on 200 points drawn
              uniformly in [0, b]^dim with seed 1 (b = 1.02 × the largest latent value of the
              last warm-up round): the same projection on every client, learnt from no data
    P(X)      mean_x p(x), std_x p(x)                                      (2·C numbers)
    P(X|Y)    mean and std of p(x) over the samples of each class c; −1 where class c has
              fewer than two samples                                      (2·C·C numbers)
Server: each block of C numbers (a "group") is min-max scaled with one min and max over all
its entries and clients; eps = knee of the sorted 1-NN distances (Kneedle, `knee_index`) ×
`eps_scaling`; DBSCAN(eps, min_samples = 2) (`dbscan`), every noise point its own cluster;
more than K clusters (fedrc's cap): the two whose merge adds the least within-cluster variance
(Ward) merge until K remain. Centroid = the mean of the members' scaled descriptors.

Clustering round: the members of cluster k train the global model and the server averages
them (N_i-weighted): θ_k ← θ_g + η_g (Σ_i N_i θ_i / Σ_i N_i − θ_g). Then FedAvg within each
cluster, hard ω. The global model is frozen at clustering and kept in the state: it computes
every later descriptor. A client first sampled after the clustering round is described then
and joins the nearest centroid. A drifting benchmark's new step (`begin_step`, step ≥ 1) is
the authors' oracle drift round: the sampled clients are described again with the frozen model
and the stored scaling, clustered again, and each new cluster starts from the model of its
nearest previous centroid.

New clients without labels (`assign_unlabeled`): the P(X) part of their descriptor, scaled
with the stored groups, joins the nearest centroid restricted to P(X). So a concept that only
swaps labels on the same images cannot be told apart at test time.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering, hard_gamma, lowest_loss, one_hot
from pipeline.algorithms.client import Rows
from pipeline.algorithms.settings import FLUXSettings
from pipeline.common.errors import FedrcError
from pipeline.config import TrainConfig
from pipeline.engine.sequential import INFERENCE_CHUNK, as_input
from pipeline.engine.task import LocalResult, LocalTask
from pipeline.models import build_model

WARMUP, CLUSTER, CLUSTERED, RECLUSTER = 0, 1, 2, 3  # `phase`
POINTS, SEED, MARGIN = 200, 1, 1.02  # the projection's sample, its seed, the bound's margin


# --- the descriptor, client side ------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def unit_projection(dim: int, components: int) -> tuple[torch.Tensor, torch.Tensor]:
    """μ_U (dim,) and V (dim, components) of the PCA of 200 points uniform in [0, 1]^dim drawn
    with seed 1 (exact SVD; each axis signed so that its largest entry is positive). Scaling the
    points by b keeps V and makes the mean b·μ_U, so one fit serves every bound. Fewer than
    `components` axes exist when dim or the sample is smaller: those columns are zero."""
    points = np.random.RandomState(SEED).uniform(0.0, 1.0, size=(POINTS, dim))
    mean = points.mean(0)
    _, _, vt = np.linalg.svd(points - mean, full_matrices=False)
    vt = vt[:components]
    biggest = np.abs(vt).argmax(1)
    vt = vt * np.sign(vt[np.arange(len(vt)), biggest])[:, None]
    basis = np.zeros((dim, components))
    basis[:, : len(vt)] = vt.T
    return torch.from_numpy(mean), torch.from_numpy(basis)


def descriptor(
    latent: torch.Tensor, labels: torch.Tensor | None, classes: int, bound: float
) -> torch.Tensor:
    """[mean p, std p] and, with labels, [mean p | y=c, for c] and [std p | y=c, for c] (the
    per-class blocks −1 below two samples); p = (z − b·μ_U) V, population std (float64)."""
    mean_u, basis = unit_projection(latent.shape[1], classes)
    p = (latent.double() - bound * mean_u.to(latent.device)) @ basis.to(latent.device)
    parts = [p.mean(0), p.std(0, correction=0)]
    if labels is not None:
        missing = torch.full((classes,), -1.0, dtype=p.dtype, device=p.device)
        by_class = [p[labels == c] for c in range(classes)]
        parts += [q.mean(0) if len(q) > 1 else missing for q in by_class]
        parts += [q.std(0, correction=0) if len(q) > 1 else missing for q in by_class]
    return torch.cat(parts).cpu()


def scratch_net(
    nets: dict[tuple, nn.Module], images: torch.Tensor, classes: int, config: TrainConfig
) -> nn.Module:
    """The run's model for images of this shape on their device, built once into `nets` (its
    parameters are loaded with `load_flat` before each use)."""
    shape = (images.shape[2], images.shape[3], images.shape[1], str(images.device))
    if shape not in nets:
        with torch.random.fork_rng(devices=[]):  # the global generator is left as it was
            net = build_model(shape[:3], classes, config.model, config.model_settings)
        nets[shape] = net.to(images.device)
    return nets[shape]


def load_flat(net: nn.Module, flat: torch.Tensor) -> None:
    """The executors' flat layout: every parameter, then every floating-point buffer."""
    tensors = [*net.parameters(), *(b for b in net.buffers() if b.is_floating_point())]
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def latents(net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z(x), the input of the last `nn.Linear`, and the logits, in eval mode without grads."""
    heads = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not heads:
        raise FedrcError("train.algorithm: flux reads the input of the final nn.Linear layer")
    caught: list[torch.Tensor] = []
    hook = heads[-1].register_forward_hook(lambda m, x, y: caught.append(x[0].flatten(1)))
    net.eval()
    try:
        with torch.no_grad():
            logits = [net(as_input(images[s : s + INFERENCE_CHUNK])) for s in
                      range(0, images.shape[0], INFERENCE_CHUNK)]  # fmt: skip
    finally:
        hook.remove()
    return torch.cat(caught), torch.cat(logits)


# --- the clustering, server side ------------------------------------------------------------
def scale(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Min-max scaling per group of C entries (x: (n, G·C); low, high: (G,)); a group whose
    entries are all equal is shifted only (scikit-learn's MinMaxScaler on a constant)."""
    span = torch.where(high > low, high - low, torch.ones_like(high))
    groups = x.reshape(x.shape[0], low.numel(), -1)
    return ((groups - low[:, None]) / span[:, None]).reshape(x.shape)


def knee_index(y: np.ndarray, sensitivity: float = 1.0) -> int | None:
    """Kneedle (Satopää et al., 2011), offline, first knee, for a convex increasing curve y at
    x = 0, 1, …, n−1 (kneed's KneeLocator(curve="convex", direction="increasing")).

    Both axes are scaled to [0, 1]; the curve is turned into a concave increasing one by
    u_i = 1 − ŷ_{n−1−i}; d_i = u_i − x_i is the difference curve. Walking from its first local
    maximum, each maximum sets the threshold T = d_max − S/(n−1), each minimum resets it to 0;
    the knee is the last maximum before d falls below T, mapped back through the flip. None
    when there is no such fall (a straight line, fewer than three points, a flat curve)."""
    n = len(y)
    if n < 3 or y[-1] == y[0]:
        return None
    x = np.arange(n) / (n - 1)
    d = (1.0 - (y - y[0]) / (y[-1] - y[0]))[::-1] - x
    step = sensitivity * np.diff(x).mean()  # S / (n − 1), rounded as kneed does
    left, right = d[np.r_[0, : n - 1]], d[np.r_[1:n, n - 1]]
    is_max, is_min = (d >= left) & (d >= right), (d <= left) & (d <= right)
    threshold, at = -np.inf, None
    for i in range(int(np.argmax(is_max)), n - 1):
        if is_max[i]:
            threshold, at = d[i] - step, i
        if is_min[i]:
            threshold = 0.0
        if d[i + 1] < threshold:
            return n - 1 - at
    return None


def dbscan(points: torch.Tensor, eps: float, min_samples: int = 2) -> torch.Tensor:
    """DBSCAN (Ester et al., 1996): a point with at least `min_samples` points (itself
    included) within distance ≤ eps is a core point; clusters are grown from core points in
    index order; points in no cluster (noise) then become one cluster each, in index order."""
    near = torch.cdist(points, points) <= eps
    core = near.sum(1) >= min_samples
    labels = torch.full((len(points),), -1, dtype=torch.long)
    count = 0
    for seed in range(len(points)):
        if labels[seed] >= 0 or not core[seed]:
            continue
        labels[seed], stack = count, [seed]
        while stack:
            p = stack.pop()
            for q in near[p].nonzero().flatten().tolist():
                if labels[q] < 0:
                    labels[q] = count
                    if core[q]:
                        stack.append(q)
        count += 1
    noise = labels < 0
    labels[noise] = torch.arange(count, count + int(noise.sum()))
    return labels


def centroids(points: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    count = int(labels.max()) + 1
    sums = torch.zeros(count, points.shape[1], dtype=points.dtype).index_add_(0, labels, points)
    return sums / torch.bincount(labels, minlength=count)[:, None].to(points)


def cap_clusters(points: torch.Tensor, labels: torch.Tensor, cap: int) -> torch.Tensor:
    """While more than `cap` clusters: merge the two closest by Ward's criterion, the growth of
    the within-cluster sum of squares n_a n_b / (n_a + n_b) ‖c_a − c_b‖² (the later into the
    earlier), keeping the labels 0, 1, … A noise point, far from every centroid by DBSCAN's
    definition, then joins its nearest cluster before two large clusters are joined."""
    labels = labels.clone()
    while int(labels.max()) + 1 > cap:
        middle = centroids(points, labels)
        sizes = torch.bincount(labels).to(points)
        cost = (
            torch.cdist(middle, middle) ** 2 * (sizes[:, None] * sizes) / (sizes[:, None] + sizes)
        )
        cost.fill_diagonal_(float("inf"))
        a, b = sorted(divmod(int(cost.argmin()), cost.shape[0]))
        labels[labels == b] = a
        labels[labels > b] -= 1
    return labels


def adaptive_dbscan(points: torch.Tensor, eps_scaling: float, cap: int) -> torch.Tensor:
    """eps = the knee of the sorted distances to each point's nearest other point, × eps_scaling
    (no knee: the largest of them, so that no point is noise); then `dbscan` and the cap."""
    if len(points) == 1:
        return torch.zeros(1, dtype=torch.long)
    distance = torch.cdist(points, points)
    distance.fill_diagonal_(float("inf"))
    nearest = distance.min(1).values.sort().values.numpy()
    at = knee_index(nearest)
    eps = float(nearest[-1] if at is None else nearest[at]) * eps_scaling
    return cap_clusters(points, dbscan(points, eps), cap)


@described("flux")
class FLUX(HardClustering):
    """State: the phase, the warm-up's last accuracy, the bound b, each client's cluster
    (−1: not described yet), the centroids and group scaling, the frozen global model."""

    settings: FLUXSettings
    describes = True  # every round of the warm-up, the clustering rounds and newcomers
    unlabeled_rule = "nearest cluster centroid of the P(X) descriptor (the frozen global model)"

    def init_state(self) -> None:
        super().init_state()
        c, k = self.num_classes, self.num_models
        self.phase, self.round = WARMUP, 0
        self.accuracy, self.slow, self.bound = -1.0, False, 0.0
        self.cluster = torch.full((self.num_clients,), -1, dtype=torch.long)
        self.clusters = 0
        self.centroids = torch.zeros(k, 2 * c * (c + 1), dtype=torch.float64)
        self.low = torch.zeros(2 * (c + 1), dtype=torch.float64)
        self.high = torch.zeros(2 * (c + 1), dtype=torch.float64)
        self.global_model: torch.Tensor | None = None  # θ_g as frozen at clustering
        self._stats: dict[int, torch.Tensor] = {}
        self._source = torch.arange(k)  # the row each cluster's training starts from
        self._nets: dict[tuple, nn.Module] = {}  # scratch modules for `describe`

    # --- the client's statistic -----------------------------------------------------------
    def wants_statistics(self, sampled: list[int]) -> list[int]:
        if self.phase == CLUSTERED:
            return [c for c in sampled if self.cluster[c] < 0]
        return list(sampled)

    def _latents(self, flat: torch.Tensor, images: torch.Tensor):
        net = scratch_net(self._nets, images, self.num_classes, self.config)
        load_flat(net, flat.to(images.device))
        return latents(net, images)

    def describe(
        self, client: int, images: torch.Tensor, labels: torch.Tensor, models: torch.Tensor
    ) -> torch.Tensor:
        """Warm-up: [max z, number correct, N_i] under the received global model. Otherwise
        the descriptor, under the global model (the frozen one after clustering)."""
        if self.phase == WARMUP:
            z, logits = self._latents(models[0], images)
            correct = float((logits.argmax(1) == labels).sum())
            return torch.tensor([float(z.max()), correct, float(len(labels))])
        flat = models[0] if self.phase == CLUSTER else self.global_model
        z, _ = self._latents(flat, images)
        return descriptor(z, labels, self.num_classes, self.bound)

    def observe(self, client: int, statistic: torch.Tensor) -> None:
        self._stats[client] = statistic.double()

    # --- assignment -----------------------------------------------------------------------
    def reads(self, client: int) -> Rows:
        """No loss: clusters come from the descriptors."""
        return ()

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.phase == WARMUP:
            return torch.ones_like(losses) / self.num_models
        if self.phase in (CLUSTER, RECLUSTER) and self._stats:
            self._cluster(sorted(self._stats))
        elif client in self._stats:  # first sampled after the clustering: nearest centroid
            scaled = scale(self._stats.pop(client)[None], self.low, self.high)
            self._join(client, int(torch.cdist(scaled, self.centroids[: self.clusters]).argmin()))
        return hard_gamma(losses, int(self.cluster[client]))

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        """Warm-up: ω keeps its value (the global model alone predicts); then one-hot."""
        return self.omega[client] if self.phase == WARMUP else super().client_omega(client, gamma)

    def _join(self, client: int, k: int) -> None:
        self.cluster[client] = k
        self.omega[client] = one_hot(k, self.num_models)

    def _cluster(self, clients: list[int]) -> None:
        """The sampled clients' descriptors → clusters (fit the scaling at the first
        clustering, reuse it after); the others wait to be described."""
        x = torch.stack([self._stats.pop(c) for c in clients])
        groups = x.reshape(len(clients), self.low.numel(), -1)
        if self.phase == CLUSTER:
            self.low, self.high = groups.amin((0, 2)), groups.amax((0, 2))
        points = scale(x, self.low, self.high)
        labels = adaptive_dbscan(points, self.settings.eps_scaling, self.num_models)
        new = centroids(points, labels)
        if self.phase == CLUSTER:  # every cluster starts from the global model (row 0)
            self._source[: len(new)] = 0
        else:  # from the model of the nearest previous centroid (`match_centroids_to_previous`)
            self._source[: len(new)] = torch.cdist(new, self.centroids[: self.clusters]).argmin(1)
        self.clusters = len(new)
        self.centroids.zero_()
        self.centroids[: len(new)] = new
        waiting = torch.zeros(self.num_models, dtype=torch.float64)
        waiting[: len(new)] = 1.0 / len(new)
        self.cluster.fill_(-1)
        self.omega[:] = waiting  # not described yet: the mean of the clusters
        for c, k in zip(clients, labels.tolist()):
            self._join(c, k)

    def assign_unlabeled(
        self, client: int, logits: torch.Tensor, images: torch.Tensor
    ) -> torch.Tensor:
        """The nearest centroid on P(X) (the first 2·C scaled numbers), from the frozen global
        model; before any clustering every row predicts with the global model: row 0."""
        if self.global_model is None:
            return one_hot(0, self.num_models)
        z, _ = self._latents(self.global_model, images)
        px = descriptor(z, None, self.num_classes, self.bound).float().double()
        scaled = scale(px[None], self.low[:2], self.high[:2])
        part = self.centroids[: self.clusters, : px.numel()]
        return one_hot(int(torch.cdist(scaled, part).argmin()), self.num_models)

    def assign_held_out(
        self, client: int, losses: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """With labels: the cluster model with the lowest loss (the authors' "known" accuracy
        uses the training membership, which a new client does not have)."""
        return lowest_loss(losses, self.num_models, list(range(max(self.clusters, 1))))

    # --- training and aggregation ---------------------------------------------------------
    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        """Warm-up: the global model (row 0). Then the client's cluster, from `_source`."""
        k = 0 if self.phase == WARMUP else int(self.cluster[client])
        start = models[int(self._source[k])]
        return [LocalTask(k, start, torch.ones_like(gamma[:, 0]), weight=float(gamma.shape[0]))]

    def begin_step(self, step: int) -> None:
        if step >= 1 and self.phase == CLUSTERED:
            self.phase = RECLUSTER

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._source = torch.arange(self.num_models)
        self._stats = {}

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        self.accumulate(task.model, result.params, task.weight)

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """θ_k ← θ_s(k) + η_g (Σ_i N_i θ_i / Σ_i N_i − θ_s(k)), s(k) the row cluster k started
        from (itself, but the global row at clustering and the matched row at a re-clustering)."""
        if self.phase == CLUSTER:
            self.global_model = models[0].detach().to("cpu", copy=True)
        return super().aggregate(models[self._source.to(models.device)])

    def end_round(self) -> None:
        """Warm-up: the accuracy of the model the clients received (θ_{r−1}, from the probes)
        and the bound b; the trigger. After a (re-)clustering round: clustered."""
        self.round += 1
        if self.phase in (CLUSTER, RECLUSTER):
            self.phase = CLUSTERED
        if self.phase != WARMUP or not self._stats:
            return
        probes = torch.stack(list(self._stats.values()))
        self.bound = MARGIN * float(probes[:, 0].max())
        accuracy = float(probes[:, 1].sum() / probes[:, 2].sum())
        if self.round >= 2:  # round 1 measured the initial model, which the authors never do
            gain = accuracy - self.accuracy
            self.slow = self.slow or (self.accuracy >= 0 and gain < self.settings.th_round)
            self.accuracy = accuracy
        if self.settings.cluster_round is not None:
            due = self.round + 1 >= self.settings.cluster_round
        else:  # the authors' check after round s ≥ 3 of θ_1..θ_s, made once θ_s is measured
            late = self.round >= max(3, 0.8 * self.config.rounds)
            due = (self.round - 1 >= 3 and self.slow) or late
        if due:
            self.phase = CLUSTER

    # --- prediction -----------------------------------------------------------------------
    def combine_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """Until clustering, every predictor is the global model."""
        if self.phase in (WARMUP, CLUSTER):
            return raw[0].expand(self.num_models, *raw.shape[1:])
        return raw

    def combined_rows(self, predictors: Rows) -> Rows:
        return (0,) if self.phase in (WARMUP, CLUSTER) else predictors

    def round_info(self) -> dict[str, Any]:
        return {"active_models": max(self.clusters, 1)}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "phase": self.phase,
            "round": self.round,
            "accuracy": self.accuracy,
            "slow": self.slow,
            "bound": self.bound,
            "cluster": self.cluster,
            "clusters": self.clusters,
            "centroids": self.centroids,
            "low": self.low,
            "high": self.high,
            "global_model": self.global_model,
        }
