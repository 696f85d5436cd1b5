"""FedGWC: the Gaussian rewards, the interaction matrix's update, the affinity and the spectral
split on hand-checked cases; the spectral pieces against scikit-learn where it is installed; and
what it does that IFCA and CFL do not: clusters formed from the loss trajectories alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.fedgwc import affinity, gaussian_rewards
from pipeline.algorithms.spectral import (
    best_partition,
    cluster_qr,
    davies_bouldin,
    spectral_embedding,
)
from pipeline.engine import LocalResult, LocalTask
from pipeline.run.resolve import make_config


def test_gaussian_rewards_are_the_hand_computation() -> None:
    losses = torch.tensor([[2.0, 1.5, 1.0], [2.2, 1.9, 1.7], [1.0, 1.0, 1.0]], dtype=torch.float64)
    sizes = torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64)
    got = gaussian_rewards(losses, sizes, population=0, gen=torch.Generator())
    w = sizes.numpy() / 100
    mu = w @ losses.numpy()
    var = w @ (losses.numpy() - mu) ** 2 + 1e-16
    expected = np.exp(-0.5 * (losses.numpy() - mu) ** 2 / var).mean(1)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    assert int(got.argmin()) == 1  # the client far from the weighted mean, at every step


def test_drawn_losses_complete_the_population() -> None:
    """Fewer sampled clients than `loss_sampling_size`: draws from N(μ, σ²) join them, and the
    population's mean and unbiased variance set the Gaussian."""
    losses = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    sizes = torch.tensor([1.0, 3.0], dtype=torch.float64)
    got = gaussian_rewards(losses, sizes, population=5, gen=torch.Generator().manual_seed(3))
    mu = torch.tensor([1.25, 2.5], dtype=torch.float64)
    var = torch.tensor([0.1875, 0.75], dtype=torch.float64)
    draws = torch.randn(3, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    pool = torch.cat([draws * var.sqrt() + mu, losses])
    expected = torch.exp(-0.5 * (losses - pool.mean(0)) ** 2 / (pool.var(0) + 1e-16)).mean(1)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def fedgwc(clients: int, participation: float, **values):
    algorithm = build_algorithm(
        make_config(algorithm="fedgwc", clusters=4, participation=participation, **values),
        clients,
        10,
    )
    algorithm.participants(list(range(clients)))
    return algorithm


def play(algorithm, sampled: list[int], losses: dict[int, list[float]], models: torch.Tensor):
    """One round of the server's side: each sampled client trained its cluster's model."""
    algorithm.begin_round(models)
    algorithm.plan_round(sampled)
    for c in sampled:
        k = int(algorithm.cluster[c])
        task = LocalTask(k, models[k], torch.ones(20), weight=20.0)
        extras = {"losses": torch.tensor(losses[c], dtype=torch.float64)}
        algorithm.fold(c, task, LocalResult(models[k] + 1.0, 0.0, None, extras=extras))
    models = algorithm.aggregate(models)
    algorithm.end_round()
    return models


def test_interactions_move_towards_the_normalised_rewards() -> None:
    """W starts at 1/n²; the sampled block moves by α = (sampled)/n towards r_i / Σr (row i),
    and the settling average starts from 1."""
    algorithm = fedgwc(6, 0.5, loss_sampling_size=0)
    losses = {0: [2.0, 1.0], 2: [2.5, 1.5], 5: [1.0, 0.5]}
    models = play(algorithm, [0, 2, 5], losses, torch.zeros(4, 3))
    steps = torch.tensor([losses[c] for c in (0, 2, 5)], dtype=torch.float64)
    rewards = gaussian_rewards(steps, torch.full((3,), 20.0, dtype=torch.float64), 0, None)
    w = algorithm.interactions[0]
    at = torch.tensor([0, 2, 5])
    expected = 0.5 / 36 + 0.5 * (rewards / rewards.sum())[:, None].expand(3, 3)
    torch.testing.assert_close(w[at[:, None], at[None, :]], expected, rtol=1e-12, atol=0)
    assert float(w[1, 1]) == pytest.approx(1 / 36) and float(w[0, 1]) == pytest.approx(1 / 36)
    change = float(((expected - 1 / 36) ** 2).sum()) / 9
    assert algorithm.change[0] == pytest.approx(0.5 * 1.0 + 0.5 * change)
    assert torch.equal(models[0], torch.ones(3)) and algorithm.patience[0] == 0


def test_affinity_compares_how_the_others_see_two_clients() -> None:
    w = torch.tensor(
        [[0.0, 0.2, 0.4, 0.1], [0.3, 0.1, 0.0, 0.2], [0.5, 0.2, 0.3, 0.4], [0.1, 0.6, 0.2, 0.0]],
        dtype=torch.float64,
    )
    got = affinity(w, gamma=2.0)
    scaled = (w.T.numpy() - 0.0) / 0.6
    for i in range(4):
        for j in range(4):
            others = [k for k in range(4) if k not in (i, j)]
            gap = ((scaled[i, others] - scaled[j, others]) ** 2).sum()
            assert got[i, j] == pytest.approx(0.0 if i == j else np.exp(-2.0 * gap))


def blocks(seed: int, sizes: tuple[int, ...], noise: float) -> np.ndarray:
    """A symmetric affinity with strong blocks plus noise, zero diagonal."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    a = np.where(labels[:, None] == labels[None, :], 0.9, 0.1) + noise * rng.random(
        (len(labels),) * 2
    )
    a = (a + a.T) / 2
    np.fill_diagonal(a, 0.0)
    return a


def test_a_clear_block_structure_is_found() -> None:
    count, labels = best_partition(blocks(0, (5, 4, 3), 0.05), range(2, 5))
    assert count == 3
    assert len({tuple(labels[s]) for s in (slice(0, 5), slice(5, 9), slice(9, 12))}) == 3
    assert all(len(set(labels[s])) == 1 for s in (slice(0, 5), slice(5, 9), slice(9, 12)))


@pytest.mark.parametrize("seed", range(6))
def test_the_spectral_pieces_are_scikit_learns(seed: int) -> None:
    """The authors cluster with scikit-learn (SpectralEmbedding, SpectralClustering with
    cluster_qr, davies_bouldin_score); fedrc's NumPy versions agree on the same matrices."""
    manifold = pytest.importorskip("sklearn.manifold")
    cluster = pytest.importorskip("sklearn.cluster")
    metrics = pytest.importorskip("sklearn.metrics")
    a = blocks(seed, (4, 5, 3), noise=0.6)
    for n in (2, 3, 4):
        theirs = manifold.SpectralEmbedding(
            n_components=n, affinity="precomputed", random_state=seed
        ).fit_transform(a)
        ours = spectral_embedding(a, n, drop_first=True)
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
        labels = cluster.SpectralClustering(
            n_clusters=n, n_components=n, affinity="precomputed", assign_labels="cluster_qr",
            random_state=seed,
        ).fit_predict(a)  # fmt: skip
        np.testing.assert_array_equal(
            cluster_qr(spectral_embedding(a, n, drop_first=False)), labels
        )
        expected = metrics.davies_bouldin_score(theirs, labels)
        assert davies_bouldin(ours, labels) == pytest.approx(expected, rel=1e-9)


def simulate(participation: float, rounds: int, eps: float, seed: int = 0):
    """12 clients whose losses fall and 6 whose losses stay high, over `rounds` rounds at
    `participation`: the round of the first split (None: none) and the clusters then."""
    algorithm = fedgwc(18, participation, eps=eps, seed=seed)
    rng = np.random.default_rng(seed)
    models = torch.zeros(4, 3)
    for r in range(rounds):
        sampled = sorted(rng.choice(18, size=round(18 * participation), replace=False).tolist())
        steps = np.arange(7)
        losses = {
            c: (2.0 - 0.15 * steps if c < 12 else 2.0 + 0.05 * steps)
            + 0.05 * rng.standard_normal(7)
            for c in sampled
        }
        models = play(algorithm, sampled, {c: v.tolist() for c, v in losses.items()}, models)
        if int(algorithm.in_use.sum()) > 1:
            return r, algorithm.cluster.tolist()
    return None, algorithm.cluster.tolist()


def test_clusters_form_from_the_loss_trajectories_alone() -> None:
    """Two groups of clients whose losses take different paths, and nothing else told apart:
    at partial participation the interactions settle and the first split separates the two
    groups exactly (IFCA and CFL would need models that differ); with every client in every
    round no cluster exceeds the round's sample, and FedGWC never splits (FedAvg)."""
    at, clusters = simulate(0.3, 200, eps=5e-4)
    assert at is not None and at > 20
    assert len(set(clusters[:12])) == 1 and len(set(clusters[12:])) == 1
    assert clusters[0] != clusters[12]
    assert simulate(1.0, 60, eps=5e-4) == (None, [0] * 18)
