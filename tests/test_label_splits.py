"""Label splits: sizes, classes per client, heterogeneity direction, determinism, retries."""

import numpy as np
import pytest

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.describe import mean_pairwise_tv
from pipeline.data.label_splits import LABEL_SPLITS, class_sets, split_labels

LABELS = np.repeat(np.arange(10), 300)  # 3,000 samples, ten balanced classes


def split(seed: int = 0, **settings):
    config = PartitionConfig(dataset="synthetic", **{"clients": 20, **settings})
    return split_labels(config, LABELS, 10, np.random.default_rng(seed))


def histograms(parts: list[np.ndarray]) -> np.ndarray:
    return np.stack([np.bincount(LABELS[p], minlength=10) for p in parts]).astype(float)


def classes(part: np.ndarray) -> set[int]:
    return set(np.unique(LABELS[part]).tolist())


@pytest.mark.parametrize("kind", LABEL_SPLITS)
def test_disjoint_deterministic_and_seeded(kind: str) -> None:
    a, b, c = split(label_split=kind), split(label_split=kind), split(1, label_split=kind)
    everything = np.concatenate(a.indices)
    assert np.unique(everything).size == everything.size  # no sample given twice
    assert all(p.size >= 2 for p in a.indices) and len(a.indices) == 20
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))
    assert not all(np.array_equal(x, y) for x, y in zip(a.indices, c.indices))


@pytest.mark.parametrize("kind", ["sequential_dirichlet", "n_class", "cluster_n_class"])
def test_quota_splits_give_exact_sizes(kind: str) -> None:
    parts = split(label_split=kind, samples_per_client=60).indices
    assert [p.size for p in parts] == [60] * 20


@pytest.mark.parametrize("kind", ["dirichlet", "cluster_dirichlet"])
def test_dirichlet_splits_divide_the_pool(kind: str) -> None:
    whole = split(label_split=kind, alpha=0.5).indices
    assert sum(p.size for p in whole) == LABELS.size and min(p.size for p in whole) >= 10
    sub = split(label_split=kind, alpha=0.5, samples_per_client=60).indices
    assert sum(p.size for p in sub) == 20 * 60


@pytest.mark.parametrize("kind", ["sequential_dirichlet", "dirichlet"])
def test_smaller_alpha_is_more_heterogeneous(kind: str) -> None:
    tv = {
        a: mean_pairwise_tv(histograms(split(label_split=kind, alpha=a).indices)) for a in (0.1, 10)
    }
    assert tv[0.1] > tv[10] + 0.2


def test_n_class_gives_every_client_k_classes_evenly() -> None:
    parts = split(label_split="n_class", classes_per_client=3).indices
    assert all(len(classes(p)) == 3 for p in parts)
    holders = np.bincount([c for p in parts for c in classes(p)], minlength=10)
    assert holders.min() == holders.max() == 6  # 20 clients × 3 classes over 10 classes
    assert sum(p.size for p in parts) == LABELS.size  # the whole pool, each class divided evenly


def test_cluster_n_class_draws_within_the_group_classes() -> None:
    s = split(label_split="cluster_n_class", label_groups=4, group_classes=3, classes_per_client=2)
    assert s.groups is not None and np.bincount(s.groups).tolist() == [5, 5, 5, 5]
    for g in range(4):
        members = [classes(p) for p, grp in zip(s.indices, s.groups) if grp == g]
        assert all(len(m) == 2 for m in members)
        assert len(set().union(*members)) <= 3


def test_cluster_dirichlet_groups_are_alike_inside_and_apart_outside() -> None:
    s = split(label_split="cluster_dirichlet", label_groups=4, alpha=0.1, alpha_within=100)
    h = histograms(s.indices)
    inside = np.mean([mean_pairwise_tv(h[s.groups == g]) for g in range(4)])
    assert mean_pairwise_tv(h) > inside + 0.2


def test_no_label_shift_is_iid() -> None:
    parts = split(shifts=["feature", "concept"], samples_per_client=100).indices
    assert all(len(classes(p)) == 10 for p in parts)


def test_class_sets_are_distinct_and_balanced() -> None:
    sets = class_sets(7, np.arange(10), 4, np.random.default_rng(0))
    assert all(len(set(s.tolist())) == 4 for s in sets)
    uses = np.bincount(np.concatenate(sets), minlength=10)
    assert uses.max() - uses.min() <= 1


def test_dirichlet_retries_are_bounded_and_named() -> None:
    with pytest.raises(FedrcError, match=r"partition\.min_samples: after 100"):
        split(label_split="dirichlet", alpha=0.01, min_samples=140)


def test_n_class_quota_larger_than_a_class_is_named() -> None:
    with pytest.raises(FedrcError, match=r"partition\.samples_per_client"):
        split(label_split="n_class", clients=7, classes_per_client=1, samples_per_client=400)
