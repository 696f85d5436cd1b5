"""PACFL (protocol §8): signatures, angles and the authors' hierarchical clustering on hand-checked
cases, the round loop's one-shot clustering with newcomers, and what it separates on the
synthetic benchmark: label sets, not a label swap on the same images."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.pacfl import agglomerate, angles, subspace_bases
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.engine import LocalResult
from pipeline.run.files import MODEL, load_state
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage


def make(clients: int = 5, k: int = 2, classes: int = 3, **kw):
    return build_algorithm(make_config(algorithm="pacfl", clusters=k, **kw), clients, classes)


def signature(*columns: list[list[float]], d: int = 4) -> torch.Tensor:
    """A statistic of one basis vector per block (n_basis 1): blocks listed, the rest zero."""
    out = torch.zeros(3, d, 1)
    for c, v in enumerate(columns):
        column = torch.tensor(v, dtype=torch.float32)
        out[c, :, 0] = column / column.norm()
    return out.flatten()


COS96 = math.degrees(math.acos(0.96))  # 16.26°


def test_signature_is_the_first_left_singular_vectors_per_class() -> None:
    """Class 0: images (2,0,0,0), (0,1,0,0) → X_0 = [e1 e2], σ = 2, 1 → U = [e1, e2]. Class 1:
    absent → zeros. Class 2: one image (0,0,3,4) → U = (0,0,.6,.8), and no second vector."""
    images = torch.tensor([[2, 0, 0, 0], [0, 0, 3, 4], [0, 1, 0, 0]], dtype=torch.uint8)
    labels = torch.tensor([0, 2, 0])
    bases = subspace_bases(images.reshape(3, 1, 1, 4), labels, 3, 2)
    expected = torch.zeros(3, 4, 2, dtype=torch.float64)
    expected[0, 0, 0] = expected[0, 1, 1] = 1.0
    expected[2, 2:, 0] = torch.tensor([0.6, 0.8])
    torch.testing.assert_close(bases, expected)
    algo = make(n_basis=2)
    algo.observe(0, algo.describe(0, images.reshape(3, 1, 1, 4), labels, torch.zeros(2, 1)))
    assert algo.bases[0].shape == (2, 4, 2)  # the two classes present; which ones is forgotten


def test_angles_elementwise_principal_and_unused_columns() -> None:
    """i: blocks {e1, e2} and {(0,0,.6,.8)}. j = (1,1,0,0)/√2: 45° to e1 and e2, 90° to the
    other, so the elementwise angle is 45°, while j lies in span{e1, e2}: principal angle 0°.
    k = (0,0,.8,.6): cos = .96 with (0,0,.6,.8) → 16.26°. n = −(1, .1, 0, 0)/√1.01 makes
    174.29° with e1 and 95.71° with e2: 95.71°; its unused (zero) column would have given 90°."""
    i = torch.zeros(2, 4, 2, dtype=torch.float64)
    i[0, 0, 0] = i[0, 1, 1] = 1.0
    i[1, 2:, 0] = torch.tensor(
        [0.6, 0.8], dtype=torch.float64
    )  # its second column is unused (zero)
    j = torch.zeros(1, 4, 2, dtype=torch.float64)
    j[0, :2, 0] = 1 / math.sqrt(2)
    k = torch.zeros(1, 4, 2, dtype=torch.float64)
    k[0, 2:, 0] = torch.tensor([0.8, 0.6], dtype=torch.float64)
    elementwise = angles(i, [j, k], "elementwise")
    torch.testing.assert_close(elementwise, torch.tensor([45.0, COS96], dtype=torch.float64))
    principal = angles(i, [j, k], "principal")
    assert principal[0] < 1e-5 and principal[1] == pytest.approx(COS96)
    n = torch.zeros(1, 4, 2, dtype=torch.float64)
    n[0, :2, 0] = -torch.tensor([1.0, 0.1]) / math.sqrt(1.01)
    obtuse = angles(n, [i[:1]], "elementwise")
    assert float(obtuse) == pytest.approx(math.degrees(math.acos(-0.1 / math.sqrt(1.01))))


# d01 = 1, d02 = d12 = 2, d03 = d13 = 4, d23 = 10 (degrees)
FOUR = np.array([[0, 1, 2, 4], [1, 0, 2, 4], [2, 2, 0, 10], [4, 4, 10, 0]], dtype=float)


def test_agglomeration_is_the_authors_rule() -> None:
    """(0,1) merge at 1; their row to 2 is 2, to 3 is 4; 2 joins at 2. Then the distance to 3:
    average = mean of the two rows (4 + 10)/2 = 7 (not UPGMA's (4+4+10)/3 = 6), complete
    max = 10, single min = 4. Merging goes on while the smallest distance is ≤ β."""
    two = [[0, 1, 2], [3]]
    assert agglomerate(FOUR, 6.5, "average", 10) == two
    assert agglomerate(FOUR, 7.0, "average", 10) == [[0, 1, 2, 3]]
    assert agglomerate(FOUR, 9.5, "complete", 10) == two
    assert agglomerate(FOUR, 4.0, "single", 10) == [[0, 1, 2, 3]]
    assert agglomerate(FOUR, 1.5, "average", 10) == [[0, 1], [2], [3]]
    assert agglomerate(FOUR, 1.5, "average", 2) == two  # more clusters than rows: merge on


@pytest.mark.parametrize(("ours", "scipy"), [("average", "weighted"), ("complete", "complete"),
                                             ("single", "single")])  # fmt: skip
def test_agglomeration_equals_scipy_cut_at_beta_without_ties(ours: str, scipy: str) -> None:
    """The authors' 'average' is WPGMA (scipy's 'weighted'); with no tied distances, merging
    while ≤ β is scipy's tree cut at β."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        points = rng.normal(size=(15, 3))
        a = np.linalg.norm(points[:, None] - points[None], axis=2)
        labels = fcluster(linkage(squareform(a), method=scipy), 1.2, criterion="distance")
        expected = sorted(sorted(np.flatnonzero(labels == c).tolist()) for c in set(labels))
        assert sorted(agglomerate(a, 1.2, ours, 15)) == expected


def run_round(algo, models: torch.Tensor, trained: dict[int, tuple[int, list[float]]]):
    algo.begin_round(models)
    for client, (n, params) in trained.items():
        gamma = algo.e_step(client, torch.zeros(n, algo.num_models), torch.zeros(n).long())
        for task in algo.local_tasks(client, gamma, models, torch.zeros(2, n, 3)):
            algo.fold(client, task, LocalResult(torch.tensor(params).double(), 0.0, None))
    new = algo.aggregate(models)
    algo.end_round()
    return new


def test_one_shot_clusters_then_newcomers_and_fedavg_within_clusters() -> None:
    """β = 30°. Round 1: clients 0 (e1) and 1 (10° from e1) merge, 2 (e3) is alone → clusters
    {0, 1}, {2}; each model is its members' N_i-weighted mean. Round 2: 3 (5° from e3) joins
    cluster 1; 4 (e4) is far from both (average linkage: cluster 0 at mean(90°, 90°) = 90°,
    cluster 1 at mean(90°, 85°) = 87.5°) but both rows are taken: it joins the nearest, 1.
    With a third row it opens cluster 2."""
    algo = make(n_basis=1, cluster_alpha=30.0)
    tilt = [math.cos(math.radians(10)), math.sin(math.radians(10)), 0, 0]
    near_e3 = [0, 0, math.cos(math.radians(5)), math.sin(math.radians(5))]
    sigs = {0: [[1, 0, 0, 0]], 1: [tilt], 2: [[0, 0, 1, 0]], 3: [near_e3], 4: [[0, 0, 0, 1]]}
    assert algo.wants_statistics([0, 1, 2]) == [0, 1, 2]
    for c in (0, 1, 2):
        algo.observe(c, signature(*sigs[c]))
    models = torch.zeros(2, 2)
    new = run_round(algo, models, {0: (10, [1.0, 0.0]), 1: (30, [3.0, 4.0]), 2: (5, [7.0, 7.0])})
    assert algo.cluster[:3].tolist() == [0, 0, 1] and algo.clusters == 2
    torch.testing.assert_close(new, torch.tensor([[2.5, 3.0], [7.0, 7.0]]))  # (10a + 30b)/40
    torch.testing.assert_close(algo.omega[2], torch.tensor([0.0, 1.0]).double())
    assert algo.wants_statistics([1, 3, 4]) == [3, 4]
    for c in (3, 4):
        algo.observe(c, signature(*sigs[c]))
    run_round(algo, new, {3: (5, [0.0, 0.0]), 4: (5, [0.0, 0.0])})
    assert algo.cluster.tolist() == [0, 0, 1, 1, 1]

    roomy = make(k=3, n_basis=1, cluster_alpha=30.0)
    for c in range(5):
        roomy.observe(c, signature(*sigs[c]))
        if c == 2:
            roomy.settle()
    roomy.settle()
    assert roomy.cluster.tolist() == [0, 0, 1, 1, 2] and roomy.clusters == 3


def test_held_out_takes_the_lowest_loss_cluster_in_use() -> None:
    algo = make(k=3, n_basis=1)
    algo.observe(0, signature([1, 0, 0, 0]))
    algo.settle()  # one cluster in use; rows 1 and 2 are untrained
    algo.held_out_step(4, torch.tensor([[2.0, 0.1, 0.1]]), torch.zeros(1).long())
    torch.testing.assert_close(algo.omega[4], torch.tensor([1.0, 0.0, 0.0]).double())


@pytest.mark.parametrize(
    ("key", "value"),
    [("n_basis", 0), ("cluster_alpha", 181.0), ("linkage", "ward"), ("angle", "trace")],
)
def test_bad_settings_are_one_line_naming_the_key(key: str, value) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.pacfl\.{key}: expected [^\n]*$"):
        make(**{key: value})


def synthetic(tmp: Path, **kw) -> Path:
    out = tmp / "data"
    partition_stage(
        PartitionConfig(
            dataset="synthetic", clients=12, samples_per_client=100, holdout_samples=300,
            out=str(out), **kw,
        )
    )  # fmt: skip
    return out


def clusters_after_one_round(data: Path, out: Path, clusters: int) -> list[int]:
    config = make_config(
        data=str(data), out=str(out), algorithm="pacfl", clusters=clusters, rounds=1,
        local_epochs=1, batch_size=32, lr=0.05, device="cpu",
    )  # fmt: skip
    return load_state(train_stage(config) / MODEL)["algorithm"]["cluster"].tolist()


def test_a_label_swap_on_the_same_images_is_invisible(tmp_path: Path) -> None:
    """Concepts identity and swap:0-1, no label or feature shift: a client's signature under
    the swap is its blocks 0 and 1 exchanged, at 0° from the original; across the benchmark the
    angles do not depend on the concept, and every client lands in one cluster."""
    data_dir = synthetic(
        tmp_path, shifts=["concept"], concepts=["identity", "swap:0-1"], client_mix="custom",
        client_shares=[0.5, 0.0, 0.5, 0.0],
    )  # fmt: skip
    data = load_federated(data_dir)
    rows = data.train_slices[0]
    images, labels = data.images[rows], data.labels[rows]
    swapped = torch.where(labels == 0, 1, torch.where(labels == 1, 0, labels))
    same, other = (subspace_bases(images, y, 10, 5) for y in (labels, swapped))
    torch.testing.assert_close(same[[1, 0, *range(2, 10)]], other)
    assert float(angles(same, [other], "elementwise")) < 0.1

    part = data.participating
    concept = np.array([data.clients[c].concept for c in part])
    sigs = [subspace_bases(data.images[data.train_slices[c]], data.labels[data.train_slices[c]],
                           10, 5) for c in part]  # fmt: skip
    a = np.stack([angles(s, sigs, "elementwise").numpy() for s in sigs])
    pairs = np.triu_indices(len(part), 1)
    across = concept[pairs[0]] != concept[pairs[1]]
    within_mean, across_mean = a[pairs][~across].mean(), a[pairs][across].mean()
    assert abs(within_mean - across_mean) < 0.5  # degrees, on angles of 7–10°
    assert a[pairs][~across].max() > a[pairs][across].min()
    assert set(clusters_after_one_round(data_dir, tmp_path / "run", 2)[: len(part)]) == {0}


def test_clients_with_different_label_sets_are_separated(tmp_path: Path) -> None:
    """Two label groups of five classes each (every client holds its group's five): about 6°
    within a group, 26° across, so β = 20° gives one cluster per group."""
    data_dir = synthetic(
        tmp_path, shifts=["label"], label_split="cluster_n_class", label_groups=2,
        group_classes=5, classes_per_client=5,
    )  # fmt: skip
    data = load_federated(data_dir)
    groups = [data.clients[c].label_group for c in data.participating]
    got = clusters_after_one_round(data_dir, tmp_path / "run", 3)[: len(groups)]
    assert len(set(got)) == 2
    assert all((g == h) == (c == d) for g, c in zip(groups, got) for h, d in zip(groups, got))
