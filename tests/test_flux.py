"""FLUX (docs/protocol.md §11): descriptors, scaling, knee, DBSCAN and the cap on hand-checked
cases; the round loop's warm-up trigger, one-shot clustering, newcomers and re-clustering at a
drift step; and on the synthetic benchmark what it separates (label groups, a label swap when
labels are seen) and what it cannot without labels (the same swap for a new client)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.flux import (
    CLUSTER,
    CLUSTERED,
    RECLUSTER,
    WARMUP,
    cap_clusters,
    dbscan,
    descriptor,
    knee_index,
    scale,
    unit_projection,
)
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.engine import LocalResult
from pipeline.evaluation.accuracy import per_sample_losses
from pipeline.run.files import ASSIGNMENTS, MODEL, load_state, read_assignments
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, run_config, train_stage


def make(clients: int = 5, k: int = 2, classes: int = 2, **kw):
    return build_algorithm(make_config(algorithm="flux", clusters=k, **kw), clients, classes)


# --- client side ------------------------------------------------------------------------------
def test_descriptor_layout_by_hand() -> None:
    """dim 1, C = 2: the PCA has one axis, (1), and a zero column; with b = 0, p = (z, 0).
    z = 1, 3, 5 with labels 0, 0, 1: P(X) mean (3, 0), std (√(8/3), 0); class 0 → mean (2, 0),
    std (1, 0); class 1 has one sample → −1s. Order: [mean, std, means by class, stds by class]."""
    mean_u, basis = unit_projection(1, 2)
    torch.testing.assert_close(basis, torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    z = torch.tensor([[1.0], [3.0], [5.0]])
    got = descriptor(z, torch.tensor([0, 0, 1]), 2, bound=0.0)
    s = math.sqrt(8 / 3)
    expected = [3, 0, s, 0, 2, 0, -1, -1, 1, 0, -1, -1]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    # the bound moves p by −b·μ_U: the means shift, the stds do not
    moved = descriptor(z, torch.tensor([0, 0, 1]), 2, bound=2.0)
    assert moved[0] == pytest.approx(3 - 2 * float(mean_u[0]))
    torch.testing.assert_close(moved[2:4], got[2:4])
    assert descriptor(z, None, 2, bound=0.0).numel() == 4  # P(X) alone: 2·C


def test_projection_is_the_authors_pca_on_seeded_uniform_points() -> None:
    """scikit-learn's PCA (exact solver) on np.random.seed(1); uniform(0, b, (200, dim)), the
    authors' sample, projects as (z − b·μ_U) V, up to each axis' sign."""
    decomposition = pytest.importorskip("sklearn.decomposition")
    dim, c, b = 12, 4, 3.7
    np.random.seed(1)
    points = np.random.uniform(0, b, size=(200, dim))
    pca = decomposition.PCA(n_components=c, svd_solver="full").fit(points)
    z = np.random.default_rng(0).uniform(0, b, size=(7, dim))
    mean_u, basis = unit_projection(dim, c)
    ours = (torch.from_numpy(z) - b * mean_u) @ basis
    theirs = torch.from_numpy(pca.transform(z))
    signs = torch.sign((ours * theirs).sum(0))
    torch.testing.assert_close(ours, theirs * signs)


def test_describe_is_pure_and_reads_the_last_linear_layer() -> None:
    """The probe of the warm-up and the descriptor after it, under the cnn on 16×16 images:
    deterministic, the global generator untouched."""
    config = make_config(algorithm="flux", clusters=2)
    algo = build_algorithm(config, 3, 10)
    from pipeline.models import build_model
    from pipeline.models.layout import head_range

    torch.manual_seed(0)
    net = build_model((16, 16, 1), 10, "cnn")
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    assert head_range(net)[1] == flat.numel()
    images = torch.randint(0, 256, (20, 1, 16, 16), dtype=torch.uint8)
    labels = torch.arange(20) % 10
    state = torch.get_rng_state()
    probe = algo.describe(0, images, labels, flat[None].expand(2, -1))
    assert torch.equal(torch.get_rng_state(), state)
    with torch.no_grad():
        hidden = net.classifier[:-1](net.features(images.float() / 127.5 - 1).flatten(1))
        correct = (net(images.float() / 127.5 - 1).argmax(1) == labels).sum()
    assert probe.tolist() == pytest.approx([float(hidden.max()), float(correct), 20.0])
    algo.phase, algo.bound = CLUSTER, 2.0
    got = algo.describe(0, images, labels, flat[None].expand(2, -1))
    torch.testing.assert_close(got, descriptor(hidden, labels, 10, 2.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, algo.describe(0, images, labels, flat[None].expand(2, -1)))


# --- server side ------------------------------------------------------------------------------
def test_min_max_scaling_per_group() -> None:
    """Two groups of C = 2: group 0 spans [0, 6] over both clients; group 1 is constant (5),
    which is shifted only."""
    x = torch.tensor([[0.0, 2.0, 5.0, 5.0], [4.0, 6.0, 5.0, 5.0]], dtype=torch.float64)
    low, high = torch.tensor([0.0, 5.0]).double(), torch.tensor([6.0, 5.0]).double()
    expected = torch.tensor([[0, 1 / 3, 0, 0], [2 / 3, 1, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(scale(x, low, high), expected)


def test_knee_by_hand() -> None:
    """y = 0, .1, .2, .3, 1 at x = 0, ¼, ½, ¾, 1: flipped u = 0, .7, .8, .9, 1, difference
    d = u − x = 0, .45, .3, .15, 0. Its maximum .45 (i = 1) sets T = .45 − ¼ = .2; d falls below
    it at i = 3 (.15), so the knee is the flip of i = 1: index 3, the last point before the
    jump. (The rule agrees with kneed 0.8.5 on 3,000 random curves.)"""
    assert knee_index(np.array([0.0, 0.1, 0.2, 0.3, 1.0])) == 3
    assert knee_index(np.array([1.0, 1.0, 1.0])) is None  # flat
    assert knee_index(np.array([0.5, 2.0])) is None  # too short


def test_dbscan_by_hand_and_noise_becomes_singletons() -> None:
    """eps .6 on 0, .5, 1 | 5, 5.4 | 9: two chains of core points, and 9 alone (noise) is its
    own cluster, numbered after them."""
    points = torch.tensor([[0.0], [0.5], [1.0], [5.0], [5.4], [9.0]], dtype=torch.float64)
    assert dbscan(points, 0.6).tolist() == [0, 0, 0, 1, 1, 2]


def test_dbscan_partition_is_scikit_learns() -> None:
    cluster = pytest.importorskip("sklearn.cluster")
    rng = np.random.default_rng(3)
    for _ in range(20):
        points = rng.normal(size=(30, 3)) + rng.integers(0, 3, size=(30, 1)) * 3
        ours = dbscan(torch.from_numpy(points), 0.9).numpy()
        theirs = cluster.DBSCAN(eps=0.9, min_samples=2).fit_predict(points)
        noise = theirs < 0
        theirs[noise] = theirs.max() + 1 + np.arange(noise.sum())
        assert (ours[:, None] == ours[None]).tolist() == (theirs[:, None] == theirs[None]).tolist()


def test_cap_merges_by_ward_so_noise_joins_its_nearest_cluster() -> None:
    """Five points around 0, five around 4, a noise point at 9; cap 2. Centroids 0, 4, 9 and
    sizes 5, 5, 1: Ward costs (0,1) 5·5/10·16 = 40, (1,2) 5/6·25 ≈ 20.8, (0,2) 5/6·81 = 67.5, so
    the noise point joins the cluster at 4 (the nearest centroids, 0 and 4, would have merged)."""
    around = [-0.2, -0.1, 0.0, 0.1, 0.2]
    points = torch.tensor([[v] for v in around + [4 + v for v in around] + [9.0]]).double()
    labels = torch.tensor([0] * 5 + [1] * 5 + [2])
    assert cap_clusters(points, labels, 2).tolist() == [0] * 5 + [1] * 6
    assert cap_clusters(points, labels, 3).tolist() == labels.tolist()


# --- the round loop ---------------------------------------------------------------------------
def probe(algo, clients: list[int], accuracy: float, top: float = 2.0) -> None:
    """One warm-up round in which every client reports (max latent, correct, N = 10)."""
    algo.begin_round(torch.zeros(algo.num_rows, 3))
    assert algo.wants_statistics(clients) == clients
    for c in clients:
        algo.observe(c, torch.tensor([top, 10 * accuracy, 10.0]))
    algo.end_round()


def test_warm_up_trigger_is_the_authors_check_one_round_later() -> None:
    """Round r measures θ_{r−1}: rounds 2, 3, 4 see θ_1..θ_3 at .5, .8, .82. After round 4 (the
    authors' check after round 3 on the same three accuracies) the last gain, .02 < .06, fires;
    b = 1.02 × the last round's largest latent value."""
    algo = make(rounds=20)
    for accuracy in (0.1, 0.5, 0.8):
        probe(algo, [0, 1], accuracy)
        assert algo.phase == WARMUP
    probe(algo, [0, 1], 0.82, top=3.0)
    assert algo.phase == CLUSTER and algo.bound == pytest.approx(3.06)
    late = make(rounds=5)  # gains of .3 every round: the 0.8·rounds fallback after round 4
    for r in range(4):
        probe(late, [0, 1], 0.1 + 0.3 * r)
    assert late.phase == CLUSTER
    fixed = make(cluster_round=3)
    probe(fixed, [0], 0.1)
    assert fixed.phase == WARMUP
    probe(fixed, [0], 0.1)
    assert fixed.phase == CLUSTER


def stat(a: float, b: float) -> torch.Tensor:
    """A descriptor for C = 2 (12 numbers): P(X) mean (a, a); everything else b."""
    return torch.tensor([a, a] + [b] * 10, dtype=torch.float64)


# after scaling every entry is a (or b): 1-NN distances all √12/4 exactly, so no knee, eps is
# that distance, and DBSCAN finds the two pairs
NEAR_0, NEAR_1 = (stat(0, 0), stat(0.25, 0.25)), (stat(1, 1), stat(0.75, 0.75))


def test_clustering_round_then_fedavg_within_clusters_and_a_newcomer() -> None:
    """Clients 0, 1 (near 0) and 2, 3 (near 1) have far apart descriptors; client 4 is not
    sampled. Each cluster starts from the global row 0: cluster 0 ← (10·[1,1] + 30·[3,3]) / 40
    = [2.5, 2.5], cluster 1 ← (20·[5,5] + 20·[7,7]) / 40 = [6, 6]. Client 4, sampled later,
    joins the nearest centroid."""
    algo = make(clients=5, cluster_round=2)
    probe(algo, [0, 1, 2, 3], 0.5)
    assert algo.phase == CLUSTER
    models = torch.tensor([[9.0, 9.0], [-1.0, -1.0]])  # row 0: the global model
    algo.begin_round(models)
    assert algo.wants_statistics([0, 1, 2, 3]) == [0, 1, 2, 3]
    for c, s in enumerate(NEAR_0 + NEAR_1):
        algo.observe(c, s)
    sizes, trained = [10, 30, 20, 20], [[1.0, 1.0], [3.0, 3.0], [5.0, 5.0], [7.0, 7.0]]
    for c in range(4):
        gamma = algo.e_step(c, torch.zeros(sizes[c], 2), torch.zeros(sizes[c], dtype=torch.long))
        (task,) = algo.local_tasks(c, gamma, models, None)
        assert torch.equal(task.start, models[0]) and task.weight == sizes[c]
        algo.fold(c, task, LocalResult(torch.tensor(trained[c]), 0.0, None))
    assert algo.cluster[:4].tolist() == [0, 0, 1, 1] and algo.cluster[4] == -1
    new = algo.aggregate(models)
    algo.end_round()
    torch.testing.assert_close(new, torch.tensor([[2.5, 2.5], [6.0, 6.0]]))
    assert algo.phase == CLUSTERED and torch.equal(algo.global_model, models[0])
    torch.testing.assert_close(algo.omega[4], torch.tensor([0.5, 0.5], dtype=torch.float64))

    algo.begin_round(new)
    assert algo.wants_statistics([1, 4]) == [4]
    algo.observe(4, stat(0.875, 0.875))
    algo.e_step(1, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    algo.e_step(4, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    assert algo.cluster[4] == 1 and algo.omega[4].tolist() == [0.0, 1.0]
    (task,) = algo.local_tasks(4, torch.zeros(1, 2), new, None)
    assert task.model == 1 and torch.equal(task.start, new[1])


def test_a_new_step_reclusters_from_the_nearest_previous_models() -> None:
    """After the first clustering ({0, 1} near 0, {2, 3} near 1), step 1 swaps the clients'
    descriptors: the new cluster of clients 0, 1 (near 1) starts from row 1, and vice versa."""
    algo = make(clients=4, cluster_round=2)
    probe(algo, [0, 1, 2, 3], 0.5)
    models = torch.tensor([[0.0], [0.0]])
    algo.begin_round(models)
    algo.wants_statistics([0, 1, 2, 3])
    for c, s in enumerate(NEAR_0 + NEAR_1):
        algo.observe(c, s)
    for c in range(4):
        algo.e_step(c, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    algo.aggregate(models)
    algo.end_round()
    algo.begin_step(1)
    assert algo.phase == RECLUSTER
    models = torch.tensor([[10.0], [20.0]])
    algo.begin_round(models)
    assert algo.wants_statistics([0, 1, 2, 3]) == [0, 1, 2, 3]
    for c, s in enumerate(NEAR_1 + NEAR_0):
        algo.observe(c, s)
    for c in range(4):
        algo.e_step(c, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    assert algo.cluster.tolist() == [0, 0, 1, 1]
    (task,) = algo.local_tasks(0, torch.zeros(1, 2), models, None)
    assert task.model == 0 and task.start.tolist() == [20.0]  # cluster 0 ↔ the old cluster 1
    algo.fold(0, task, LocalResult(torch.tensor([21.0]), 0.0, None))
    new = algo.aggregate(models)
    algo.end_round()
    assert new.tolist() == [[21.0], [10.0]] and algo.phase == CLUSTERED


def test_held_out_takes_the_lowest_loss_cluster_in_use() -> None:
    algo = make(k=3)
    algo.clusters = 2
    losses = torch.tensor([[2.0, 1.0, 0.1]])  # row 2 is not a cluster
    assert algo.assign_held_out(0, losses, torch.tensor([0])).tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("key", "value"), [("th_round", -0.1), ("eps_scaling", 0.0), ("cluster_round", 1)]
)
def test_bad_settings_are_one_line_naming_the_key(key: str, value) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.flux\.{key}: expected [^\n]*$"):
        make(**{key: value})


# --- behaviour on the synthetic benchmark -----------------------------------------------------
def synthetic(tmp: Path, **kw) -> Path:
    out = tmp / "data"
    partition_stage(
        PartitionConfig(
            dataset="synthetic", clients=12, samples_per_client=300, holdout_samples=300,
            out=str(out), **kw,
        )
    )  # fmt: skip
    return out


def clustered(data: Path, out: Path) -> Path:
    """Two warm-up rounds, clustering in round 3 (cap 2)."""
    config = make_config(
        data=str(data), out=str(out), algorithm="flux", clusters=2, rounds=3, local_epochs=2,
        batch_size=32, lr=0.05, device="cpu", cluster_round=3,
    )  # fmt: skip
    return train_stage(config)


def same_partition(a: list[int], b: list[int]) -> bool:
    return all((x == y) == (u == v) for x, u in zip(a, b) for y, v in zip(a, b))


def test_clients_with_different_label_sets_are_separated(tmp_path: Path) -> None:
    """Two label groups of five classes: the missing classes' −1 blocks and the latent means
    differ, and the two groups become the two clusters."""
    data_dir = synthetic(
        tmp_path, shifts=["label"], label_split="cluster_n_class", label_groups=2,
        group_classes=5, classes_per_client=5,
    )  # fmt: skip
    data = load_federated(data_dir)
    groups = [data.clients[c].label_group for c in data.participating]
    cluster = load_state(clustered(data_dir, tmp_path / "run") / MODEL)["algorithm"]["cluster"]
    assert same_partition(groups, cluster[: len(groups)].tolist()) and len(set(groups)) == 2


def test_a_label_swap_is_seen_with_labels_and_not_without(tmp_path: Path) -> None:
    """Concepts identity and swap:0-1 on the same images. With labels, P(X|Y = 0) and
    P(X|Y = 1) trade places, and the clients cluster by concept. A new client holds no labels:
    its P(X) is the same under both concepts, so the same images are assigned the same cluster
    whichever concept labels them, while their full descriptors (labels seen) go to different
    clusters and so do their lowest-loss clusters."""
    data_dir = synthetic(
        tmp_path, shifts=["concept"], concepts=["identity", "swap:0-1"], client_mix="custom",
        client_shares=[0.5, 0.0, 0.5, 0.0],
    )  # fmt: skip
    run = clustered(data_dir, tmp_path / "run")
    data = load_federated(data_dir)
    concepts = [data.clients[c].concept for c in data.participating]
    final = load_state(run / MODEL)
    cluster = final["algorithm"]["cluster"][: len(concepts)].tolist()
    assert same_partition(concepts, cluster) and len(set(concepts)) == 2

    algo = build_algorithm(run_config(run), len(data.clients), data.num_classes)
    algo.load_state_dict(final["algorithm"])
    held = data.held_out[0]  # concept identity
    rows = data.train_slices[held]
    images, labels = data.images[rows], data.labels[rows]
    swapped = torch.where(labels == 0, 1, torch.where(labels == 1, 0, labels))
    full = [algo.describe(held, images, y, final["models"]) for y in (labels, swapped)]
    torch.testing.assert_close(full[0][:20], full[1][:20])  # P(X): 2·C numbers, equal
    nearest = [int(torch.cdist(scale(f[None], algo.low, algo.high), algo.centroids).argmin())
               for f in full]  # fmt: skip
    assert nearest[0] != nearest[1]
    logits = algo.combine_logits(torch.zeros(2, len(labels), 10))
    blind = algo.assign_unlabeled(held, logits, images)
    assert blind.tolist() == algo.assign_unlabeled(held + 1, logits, images).tolist()
    assert int(blind.argmax()) in nearest  # one of the two concepts gets the other's model
    assert nearest[0] == cluster[concepts.index(0)]  # identity labels → identity's cluster
    raw = torch.stack([algo._latents(final["models"][k], images)[1] for k in range(2)])
    losses = [per_sample_losses(raw, y) for y in (labels, swapped)]
    assert [int(algo.assign_held_out(held, x, None).argmax()) for x in losses] == nearest


def test_flower_refuses_flux_in_one_line() -> None:
    """The descriptors are client statistics, which Flower nodes do not compute (the server's
    own test: tests/flower/test_server.py)."""
    from pipeline.flower.appconfig import check_config

    with pytest.raises(FedrcError, match=r"^train\.algorithm: flux asks clients for [^\n]*$"):
        check_config(make_config(algorithm="flux"))


def test_each_new_step_reclusters_by_the_new_concepts(tmp_path: Path) -> None:
    """Concepts identity and reverse, a quarter of the clients flipping at steps 1 and 2 (5 rounds
    a step, clustering in round 3): at the end of every step the clusters are the concepts of
    that step, the moved clients included."""
    out = tmp_path / "data"
    partition_stage(
        PartitionConfig(
            dataset="synthetic", clients=12, samples_per_client=110, holdout_samples=200,
            shifts=["concept"], concepts=["identity", "reverse"], client_mix="custom",
            client_shares=[0.5, 0.0, 0.5, 0.0], time_steps=3,
            drift=[{"step": 1, "share": 0.25}, {"step": 2, "share": 0.25}], out=str(out),
        )
    )  # fmt: skip
    config = make_config(
        data=str(out), out=str(tmp_path / "run"), algorithm="flux", rounds=15, local_epochs=2,
        batch_size=16, lr=0.05, clusters=2, device="cpu", eval_every=5, cluster_round=3,
    )  # fmt: skip
    run = train_stage(config)
    schedule = np.asarray(load_federated(out).benchmark.schedule)
    table = read_assignments(run / ASSIGNMENTS).to_pydict()
    for step, r in enumerate((5, 10, 15)):
        rows = [i for i, (q, p) in enumerate(zip(table["round"], table["participating"]))
                if q == r and p]  # fmt: skip
        cluster = [int(table["omega_1"][i] > table["omega_0"][i]) for i in rows]
        assert same_partition(schedule[step].tolist(), cluster), step
        assert len(set(schedule[step].tolist())) == 2
