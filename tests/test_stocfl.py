"""StoCFL's update rules on tiny hand-checked cases, and what it separates on the synthetic
benchmark.

Rows of a 2-cluster run: 0 and 1 the cluster models, 2 the global model θ_g, 3 the anchor θ_a.
The hand case (θ_a = (1, 1), τ = 0.5) observes four clients in round 1:
    client     θ^obs      ψ = θ_a − θ^obs
    0          (0, 1)     (1, 0)
    1          (0, 0)     (1, 1)
    2          (1, 0)     (0, 1)
    3          (2, 1)     (−1, 0)
cos(ψ0, ψ1) = cos(ψ1, ψ2) = 1/√2 ≈ 0.707, cos(ψ0, ψ2) = cos(ψ2, ψ3) = 0, cos(ψ1, ψ3) = −0.707,
cos(ψ0, ψ3) = −1. In decreasing order: (0, 1) unites {0, 1}; (1, 2) unites client 2 with the
cluster that now holds client 1 (directions are not recomputed within a round); (0, 2) = 0 < τ
stops. Clusters: {0, 1, 2} (id 0) and {3}.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_behaviour import concept_data, purity_by_round, train  # noqa: F401 (a fixture)

from pipeline.algorithms import build_algorithm
from pipeline.common.errors import FedrcError
from pipeline.engine import LocalResult
from pipeline.run.files import METRICS, read_metrics
from pipeline.run.resolve import make_config

ANCHOR = [1.0, 1.0]
OBSERVED = {0: [0.0, 1.0], 1: [0.0, 0.0], 2: [1.0, 0.0], 3: [2.0, 1.0]}


def make(k: int = 2, clients: int = 5, **kw):
    return build_algorithm(make_config(algorithm="stocfl", clusters=k, **kw), clients, 3)


def run_round(algo, models, returns, sizes=None, losses=None):
    """Each client assigns, then every task it asks for returns `returns[client][task.model]`."""
    algo.begin_round(models)
    algo.plan_round(sorted(returns))
    tasks = {}
    for client in returns:
        n = (sizes or {}).get(client, 4)
        client_losses = (losses or {}).get(client, torch.zeros(n, algo.num_models))
        gamma = algo.e_step(client, client_losses, torch.zeros(n, dtype=torch.long))
        tasks[client] = algo.local_tasks(client, gamma, models, torch.zeros(algo.num_rows, n, 3))
        for task in tasks[client]:
            params = torch.tensor(returns[client][task.model], dtype=torch.float64)
            algo.fold(client, task, LocalResult(params, 0.0, None))
    new = algo.aggregate(models)
    algo.end_round()
    return new, tasks


def first_round(algo, models):
    """Round 1 of the hand case: clients 0–3 observe; their global models return g_i."""
    globals_ = {0: [0.0, 0.0], 1: [2.0, 0.0], 2: [4.0, 0.0], 3: [6.0, 4.0]}
    returns = {i: {3: OBSERVED[i], 2: globals_[i]} for i in range(4)}
    return run_round(algo, models, returns, sizes={0: 10, 1: 30, 2: 30, 3: 30})


def test_first_contact_observes_from_the_anchor_and_merges_by_psi_cosine() -> None:
    algo = make(tau=0.5)
    models = torch.tensor([[9.0, 9.0], [8.0, 8.0], [5.0, 5.0], ANCHOR])
    new, tasks = first_round(algo, models)
    observe, global_ = tasks[0]
    assert observe.model == 3 and torch.equal(observe.start, models[3]) and observe.mu == 0
    assert global_.model == 2 and torch.equal(global_.start, models[3])  # θ_g starts as θ_a
    torch.testing.assert_close(algo.psi[1], torch.tensor([1.0, 1.0]))  # θ_a − θ^obs
    assert algo.cluster[:5].tolist() == [0, 0, 0, 3, 4]  # client 4, never seen: alone
    # θ_g: the plain mean (0 + 2 + 4 + 6, 0 + 0 + 0 + 4) / 4, not weighted by N_i (10, 30, 30, 30)
    torch.testing.assert_close(new[2], torch.tensor([3.0, 1.0]))
    torch.testing.assert_close(new[[0, 1, 3]], models[[0, 1, 3]])  # no cluster trained; θ_a fixed
    assert algo.round_info() == {"clusters": 2, "active_models": 0}


def test_bi_level_training_and_rows_given_to_clusters_as_they_train() -> None:
    algo = make(tau=0.5)
    models = torch.tensor([[9.0, 9.0], [8.0, 8.0], [5.0, 5.0], ANCHOR])
    models, _ = first_round(algo, models)  # θ_g = (3, 1)
    # round 2: clients 0 and 1 (cluster 0) get row 0, client 3 (cluster 3) row 1, both from θ_g
    returns = {
        0: {0: [4.0, 2.0], 2: [3.0, 1.0]},
        1: {0: [6.0, 2.0], 2: [3.0, 3.0]},
        3: {1: [0.0, -1.0], 2: [3.0, 5.0]},
    }
    new, tasks = run_round(algo, models, returns)
    cluster_task, global_task = tasks[0]
    theta_g = torch.tensor([3.0, 1.0])
    assert cluster_task.model == 0 and torch.equal(cluster_task.start, theta_g)
    assert torch.equal(cluster_task.anchor, theta_g) and cluster_task.mu == 0.05  # (μ/2)‖w − θ_g‖²
    assert global_task.model == 2 and global_task.anchor is None
    assert tasks[3][0].model == 1
    torch.testing.assert_close(new[0], torch.tensor([5.0, 2.0]))  # mean of (4, 2) and (6, 2)
    torch.testing.assert_close(new[1], torch.tensor([0.0, -1.0]))
    torch.testing.assert_close(new[2], torch.tensor([3.0, 3.0]))
    torch.testing.assert_close(new[3], models[3])
    # directions (1, ½) and (−1, 0): cos = −0.894 < τ, no merge
    assert algo.row[[0, 3]].tolist() == [0, 1] and algo.omega[3].tolist() == [0.0, 1.0]
    # round 3: client 2 (cluster 0) trains row 0 from its model, no longer from θ_g
    _, tasks = run_round(algo, new, {2: {0: [5.0, 2.0], 2: [3.0, 3.0]}})
    assert torch.equal(tasks[2][0].start, new[0])


def test_merge_keeps_the_larger_clusters_model_and_frees_the_other_row() -> None:
    algo = make(clients=6)
    algo.cluster = torch.tensor([0, 0, 0, 3, 4, 5])
    algo.row = torch.tensor([1, -1, -1, 0, -1, -1])  # cluster 0 → row 1, cluster 3 → row 0
    algo.unite(3, 1)  # cluster 3 (1 member) into the cluster of client 1 (3 members)
    assert algo.cluster.tolist() == [0, 0, 0, 0, 4, 5] and algo.row[[0, 3]].tolist() == [1, -1]
    assert algo.omega[3].tolist() == [0.0, 1.0] and algo.held_rows() == [1]
    algo.unite(5, 4)  # two singletons without a model: one cluster (id 4), still no model
    assert algo.cluster[4:].tolist() == [4, 4] and algo.row[4] == -1
    algo.row[4] = 0
    algo.unite(0, 4)  # the larger (4 members, row 1) keeps its model; row 0 is free again
    assert algo.cluster.tolist() == [0] * 6 and algo.held_rows() == [1]
    algo = make(clients=3)
    algo.row = torch.tensor([-1, 0, -1])
    algo.unite(1, 0)  # a tie: the lower id's cluster has no model, so the other's is kept
    assert algo.cluster[:2].tolist() == [0, 0] and algo.row[:2].tolist() == [0, -1]


def test_over_the_cap_a_cluster_trains_the_global_model_only() -> None:
    algo = make(k=1, tau=0.5)
    models = torch.tensor([[9.0, 9.0], [5.0, 5.0], ANCHOR])  # one cluster row, θ_g, θ_a
    returns = {i: {2: OBSERVED[i], 1: [0.0, 0.0]} for i in range(4)}
    models, _ = run_round(algo, models, returns)
    _, tasks = run_round(algo, models, {0: {0: [1.0, 1.0], 1: [0.0, 0.0]}, 3: {1: [0.0, 0.0]}})
    assert [t.model for t in tasks[0]] == [0, 1] and [t.model for t in tasks[3]] == [1]
    assert algo.row[[0, 3]].tolist() == [0, -1] and algo.omega[3].tolist() == [1.0]


def test_held_out_clients_take_the_held_model_with_the_lowest_loss() -> None:
    algo = make(k=3)
    losses = torch.tensor([[0.1, 2.0, 1.0], [0.3, 2.0, 1.0]])  # row 0 fits best, but holds nothing
    algo.held_out_step(4, losses, torch.zeros(2, dtype=torch.long))
    assert algo.omega[4].tolist() == pytest.approx([1 / 3] * 3)  # no model held yet: uniform
    algo.row[1], algo.row[2] = 1, 2
    algo.held_out_step(4, losses, torch.zeros(2, dtype=torch.long))
    assert algo.omega[4].tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(("key", "value"), [("tau", 1.5), ("tau", -2.0), ("mu", -0.1)])
def test_bad_settings_name_the_option(key: str, value: float) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.stocfl\.{key}: expected"):
        make(**{key: value})


def test_defaults_are_the_authors_argparse_values() -> None:
    settings = make().settings
    assert (settings.tau, settings.mu) == (0.3, 0.05)


def test_concepts_separate_at_a_tau_between_their_cosines(
    concept_data: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Concept shift only (three concepts, four clients each). ψ of two clients of one concept
    agree more than of two concepts, so τ = 0.5 unites exactly the concepts after round 1 and
    each gets its own model. τ is an absolute threshold, not a number of clusters: at the
    authors' default 0.3 the concepts' directions pass it too and every client ends in one
    cluster (the cap K = 3 cannot stop a merge)."""
    run = train(concept_data, tmp_path / "half", rounds=3, algorithm="stocfl", clusters=3, tau=0.5)
    rows = read_metrics(run / METRICS)
    assert [r["clusters"] for r in rows] == [3, 3, 3] and rows[-1]["active_models"] == 3
    assert purity_by_round(run)[-1] == 1.0 and rows[-1]["global_accuracy"] >= 0.9
    run = train(concept_data, tmp_path / "low", rounds=2, algorithm="stocfl", clusters=3, tau=0.3)
    rows = read_metrics(run / METRICS)
    assert rows[-1]["clusters"] == 1 and rows[-1]["active_models"] == 1
    assert purity_by_round(run)[-1] == pytest.approx(1 / 3)
