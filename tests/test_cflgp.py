"""CFL-GP (protocol §9): the profile matrix, its clustering, and the model update on a
tiny hand-checked case; what it separates on the synthetic benchmark, and what it cannot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_behaviour import concept_data, purity_by_round, train  # noqa: F401 (a fixture)
from test_drift import DRIFTING, TRAIN

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.cflgp import match_labels
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.engine import LocalResult
from pipeline.evaluation.drift_scores import omega_at
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage


def make(clients: int = 5, k: int = 2, **kw):
    config = make_config(algorithm="cfl-gp", clusters=k, profile_fraction=1.0, **kw)
    return build_algorithm(config, clients, 3)


def run_round(algo, models: torch.Tensor, trained: dict[int, tuple[int, dict[int, list[float]]]]):
    """Each client i (N_i samples) assigns, then its task on model m returns trained[i][1][m]."""
    algo.begin_round(models)
    tasks = {}
    for client, (n, params) in trained.items():
        gamma = algo.e_step(client, torch.zeros(n, algo.num_models), torch.zeros(n).long())
        tasks[client] = algo.local_tasks(client, gamma, models, torch.zeros(2, n, 3))
        for task in tasks[client]:
            result = torch.tensor(params[task.model], dtype=torch.float64)
            algo.fold(client, task, LocalResult(result, 0.0, None))
    new = algo.aggregate(models)
    info = algo.round_info()
    algo.end_round()
    return new, tasks, info


def test_profiles_clustering_and_update_by_hand() -> None:
    """K = 2, P = 2, the whole vector kept (P_c = 2), all on model 0 at first.

    Round t = 0 (clustering, criterion 0 = everyone's model: one task each). β = 1/(⌊1/4⌋+1) = 1,
    so G's block 0 is the updates: (1,0) (2,0) (1.5,0) | (0,1) (0,3); block 1 is zero. Ĝ keeps
    the two directions: K-means gives {0,1,2} and {3,4}; matched to the old labels (all 0) the
    group of three keeps 0. θ_0 ← N-weighted mean: x = (10·1 + 10·2 + 20·1.5)/60 = 1,
    y = (10·1 + 10·3)/60 = 2/3; θ_1 nobody trained: kept.
    Round t = 1: no clustering; clients 0 (model 0) and 3 (model 1) train one task each.
    Round t = 2 (clustering, criterion ⌊2/2⌋ mod 2 = 1): client 0 also trains model 1 (weight 0,
    not in θ_1); client 3's own update is its profile. β = 1/(⌊3/4⌋+1) = 1: block 1 of client 0
    is (−1,0), of client 3 (0,2); θ_1 = (5,7) + (0,2) = (5,9).
    Round t = 4 (criterion ⌊4/2⌋ mod 2 = 0): β = 1/(⌊5/4⌋+1) = 1/2, client 0's block 0 becomes
    (1,0)/2 + (3,0)/2 = (2,0).
    """
    algo = make()
    models = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    updates = {0: [1.0, 0.0], 1: [2.0, 0.0], 2: [1.5, 0.0], 3: [0.0, 1.0], 4: [0.0, 3.0]}
    sizes = {0: 10, 1: 10, 2: 20, 3: 10, 4: 10}
    trained = {i: (sizes[i], {0: u}) for i, u in updates.items()}
    models, tasks, info = run_round(algo, models, trained)
    assert all(len(t) == 1 and t[0].model == 0 for t in tasks.values())
    assert info == {"clustered": True}
    assert algo.cluster.tolist() == [0, 0, 0, 1, 1]
    torch.testing.assert_close(algo.omega[3], torch.tensor([0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(algo.profile[4], torch.tensor([0.0, 3.0, 0.0, 0.0]))
    torch.testing.assert_close(models, torch.tensor([[1.0, 2 / 3], [5.0, 5.0]]))

    models, tasks, info = run_round(
        algo, models, {0: (10, {0: [2.0, 2 / 3]}), 3: (10, {1: [5.0, 7.0]})}
    )
    assert info == {"clustered": False} and len(tasks[0]) == 1
    torch.testing.assert_close(models, torch.tensor([[2.0, 2 / 3], [5.0, 7.0]]))

    models, tasks, info = run_round(
        algo, models, {0: (10, {0: [3.0, 2 / 3], 1: [4.0, 7.0]}), 3: (10, {1: [5.0, 9.0]})}
    )
    assert [t.model for t in tasks[0]] == [0, 1] and tasks[0][1].weight == 0.0
    torch.testing.assert_close(algo.profile[0], torch.tensor([1.0, 0.0, -1.0, 0.0]))
    torch.testing.assert_close(algo.profile[3], torch.tensor([0.0, 1.0, 0.0, 2.0]))
    torch.testing.assert_close(models, torch.tensor([[3.0, 2 / 3], [5.0, 9.0]]))
    assert info == {"clustered": True} and algo.cluster.tolist() == [0, 0, 0, 1, 1]

    algo.round = 4
    run_round(algo, models, {0: (10, {0: [6.0, 2 / 3]})})
    torch.testing.assert_close(algo.profile[0], torch.tensor([2.0, 0.0, -1.0, 0.0]))


def test_criterion_schedule_termination_and_the_released_ablation() -> None:
    algo = make(k=3, clustering_period=2, clustering_termination_threshold=7)
    schedule = []
    for t in range(9):
        algo.round = t
        schedule.append(algo.criterion if algo.clustering else None)
    assert schedule == [0, None, 1, None, 2, None, 0, None, None]  # t = 8 ≥ T: frozen
    fixed = make(k=3, cycle_criterion=False)
    fixed.round = 4
    assert fixed.clustering and fixed.criterion == 0


def test_unprofiled_clients_take_the_lowest_loss_and_labels_are_matched() -> None:
    algo = make()
    algo.profile = {0: torch.zeros(4)}
    gamma = algo.e_step(1, torch.tensor([[2.0, 0.5]]), torch.zeros(1).long())
    assert int(algo.cluster[1]) == 1 and gamma.tolist() == [[0.0, 1.0]]
    new, old = np.array([1, 1, 0, 0, 2]), np.array([0, 0, 1, 2, 2])
    assert match_labels(new, old, 3).tolist() == [0, 0, 1, 1, 2]  # agreement 2 + 1 + 1 = 4


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"clustering_period": 0}, "clustering_period"),
        ({"clustering_termination_threshold": 0}, "clustering_termination_threshold"),
        ({"profile_fraction": 0.0}, "profile_fraction"),
        ({"profile_fraction": 1.5}, "profile_fraction"),
    ],
)
def test_bad_settings_name_the_option(values: dict, key: str) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.cfl-gp\.{key}: expected"):
        make_config(algorithm="cfl-gp", **values)


def test_each_concept_gets_its_own_cluster_from_the_first_round(
    concept_data: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Three concepts, twelve clients: the updates at the common model 0 already differ by
    concept, so the first clustering round separates them, and the later ones keep it."""
    run = train(concept_data, tmp_path / "cflgp", rounds=6, algorithm="cfl-gp", clusters=3)
    assert min(purity_by_round(run)) >= 0.9
    rows = rf.read_metrics(run / rf.METRICS)
    assert [r["clustered"] for r in rows] == [True, False] * 3  # rounds t = 0, 2, 4 of P = 2
    assert rows[-1]["global_accuracy"] >= 0.8


def test_clusters_do_not_follow_a_concept_drift(tmp_path: Path) -> None:
    """What it cannot do: the clustering is static. Two concepts, a quarter of the clients flip
    at steps 1 (round 6) and 2 (round 11). One cluster per concept at the end of step 0; the
    profile is a running average dominated by the large early updates, and clustering stops at
    round T = 10, so every client stays where it was and the clients that flipped share their
    cluster with the other concept (FedRC moves them: test_drift)."""
    data = tmp_path / "data"
    partition_stage(PartitionConfig(**DRIFTING, out=str(data)))
    schedule = np.asarray(load_federated(data).manifest.schedule)
    config = make_config(data=str(data), algorithm="cfl-gp", out=str(tmp_path / "r"), **TRAIN)
    run = train_stage(config)
    assignments = rf.read_assignments(run / rf.ASSIGNMENTS)
    first, last = (omega_at(assignments, r)[0][:12].argmax(1) for r in (5, 15))
    assert len(set(zip(schedule[0], first))) == 2  # one cluster per concept
    assert (first == last).all()
    moved = schedule[2] != schedule[0]
    assert moved.any() and len(set(zip(schedule[2], last))) == 4  # concepts now share clusters
    rows = rf.read_metrics(run / rf.METRICS)
    assert not any(r["clustered"] for r in rows[10:])
