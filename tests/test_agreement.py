"""ARI, NMI and the per-client spread on hand-checked cases, the single-concept rule, and the
scores eval.json and the drift table carry."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.evaluation.agreement import (
    adjusted_rand_index,
    cluster_agreement,
    contingency,
    normalized_mutual_info,
)
from pipeline.evaluation.spread import client_spread


def test_the_contingency_table_counts_pairs_of_labels() -> None:
    table = contingency(np.array([0, 0, 1, 2]), np.array([5, 5, 7, 7]))
    assert table.tolist() == [[2, 0], [0, 1], [0, 1]]


def test_ari_by_hand() -> None:
    """truth [0,0,1,2], found [0,0,1,1]: Σ C(n_ij,2) = 1, rows Σ C(a,2) = 1, columns
    Σ C(b,2) = 2, C(4,2) = 6: E = 1·2/6 = 1/3, M = 3/2, ARI = (1 − 1/3) / (3/2 − 1/3) = 4/7."""
    assert adjusted_rand_index(np.array([0, 0, 1, 2]), np.array([0, 0, 1, 1])) == pytest.approx(
        4 / 7
    )
    # truth [0,0,0,1,1,1], found [0,0,1,1,2,2]: index 2, rows 6, columns 3, C(6,2) = 15:
    # E = 1.2, M = 4.5, ARI = 0.8 / 3.3
    truth, found = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 2, 2])
    assert adjusted_rand_index(truth, found) == pytest.approx(0.8 / 3.3)


def test_ari_and_nmi_ignore_the_names_of_clusters() -> None:
    truth = np.array([0, 0, 1, 1, 2, 2])
    renamed = np.array([7, 7, 3, 3, 5, 5])
    assert adjusted_rand_index(truth, renamed) == 1.0
    assert normalized_mutual_info(truth, renamed) == pytest.approx(1.0)


def test_nmi_by_hand() -> None:
    """truth [0,0,1,1], found [0,0,1,2]: H(U) = ln 2, H(V) = 1.5 ln 2, and V determines U, so
    I = H(U) = ln 2: NMI = ln 2 / (1.25 ln 2) = 0.8. Independent partitions: 0."""
    assert normalized_mutual_info(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 2])) == (
        pytest.approx(0.8)
    )
    assert normalized_mutual_info(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])) == (
        pytest.approx(0.0, abs=1e-12)
    )


def test_a_random_assignment_scores_near_zero_ari() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, 4000)
    found = rng.integers(0, 4, 4000)
    assert abs(adjusted_rand_index(truth, found)) < 0.01
    assert normalized_mutual_info(truth, found) < 0.01


def test_one_concept_is_perfect_in_one_cluster_and_zero_when_split() -> None:
    """A step where every client holds one concept: one cluster is the right answer (1), a
    split is not (0), for both scores; the matched share of such a step is no part of these."""
    one = np.zeros(10, dtype=int)
    assert adjusted_rand_index(one, np.full(10, 3)) == 1.0
    assert normalized_mutual_info(one, np.full(10, 3)) == 1.0
    split = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    assert adjusted_rand_index(one, split) == 0.0
    assert normalized_mutual_info(one, split) == 0.0


def test_cluster_agreement_reads_the_argmax_of_omega() -> None:
    omega = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    assert cluster_agreement(omega, np.array([1, 1, 0, 0])) == {
        "concept_ari": 1.0,
        "concept_nmi": pytest.approx(1.0),
    }
    assert cluster_agreement(np.ones((4, 1)), np.array([0, 0, 1, 1])) == {
        "concept_ari": None,
        "concept_nmi": None,
    }


def test_client_spread_is_the_std_and_the_worst_tenth() -> None:
    """20 clients: the worst 10 % is the lowest two; the std divides by N (all the clients)."""
    values = [0.1, 0.2] + [0.9] * 18
    spread = client_spread(values, "local")
    assert spread["local_worst10"] == pytest.approx(0.15)
    assert spread["local_std"] == pytest.approx(float(np.std(values)))
    # fewer than 10 clients: the single worst one
    assert client_spread([0.5, 0.7, 0.9], "x")["x_worst10"] == pytest.approx(0.5)
    # 11 clients: ⌈1.1⌉ = 2 of them
    eleven = [0.0, 1.0] + [0.5] * 9
    assert client_spread(eleven, "x")["x_worst10"] == pytest.approx(0.25)
    assert math.isclose(client_spread([0.3] * 5, "x")["x_std"], 0.0)


def test_eval_json_scores_the_final_clusters_and_the_clients_spread(
    tiny_runs: dict, tmp_path
) -> None:
    """eval.json's ARI, NMI and spread are those of eval_clients.json's ω and accuracies."""
    import json
    import shutil

    from pipeline.config import EvalConfig
    from pipeline.stages import eval_stage

    run = tmp_path / "fedrc"
    shutil.copytree(tiny_runs["fedrc"], run)
    result = eval_stage(EvalConfig(run=str(run)))
    clients = [c for c in json.loads((run / "eval_clients.json").read_text()) if c["participating"]]
    concepts = np.asarray([c["concept"] for c in clients])
    found = np.asarray([c["omega"] for c in clients]).argmax(1)
    assert result["concept_ari"] == pytest.approx(adjusted_rand_index(concepts, found))
    assert result["concept_nmi"] == pytest.approx(normalized_mutual_info(concepts, found))
    accuracies = sorted(c["test_accuracy"] for c in clients)
    assert result["final_local_accuracy_std"] == pytest.approx(np.std(accuracies))
    assert result["final_local_accuracy_worst10"] == pytest.approx(np.mean(accuracies[:2]))
    assert len(clients) == 12  # ⌈1.2⌉ = 2 of them are the worst 10 %
