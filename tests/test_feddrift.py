"""FedDrift (protocol §10): the drift detector, the new model's copy, the merge rule, the pool's
capacity, and what it does on a drifting benchmark."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.engine import LocalResult
from pipeline.evaluation.drift_scores import omega_at
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage

N = 2  # samples per client in the hand-made cases


def make(name: str = "feddrift", clients: int = 4, k: int = 3, **kw):
    return build_algorithm(make_config(algorithm=name, clusters=k, **kw), clients, 3)


def step(
    algo,
    t: int | None,
    models: torch.Tensor,
    clients: dict[int, tuple[list[float], list[float]]],
):
    """One round, the first of step t (None: a later round of the step): client i's per-sample
    losses are `losses` under every row (the same for its N samples) and its one task returns
    `params`. → (new models, tasks)."""
    if t is not None:
        algo.begin_step(t)
    algo.begin_round(models)
    tasks = {}
    for client, (losses, params) in clients.items():
        gamma = algo.e_step(client, torch.tensor([losses] * N), torch.zeros(N, dtype=torch.long))
        (task,) = algo.local_tasks(client, gamma, models, torch.zeros(algo.num_rows, N, 3))
        algo.fold(client, task, LocalResult(torch.tensor(params, dtype=torch.float64), 0.0, None))
        tasks[client] = task
    new = algo.aggregate(models)
    algo.end_round()
    return new, tasks


def test_detector_opens_a_copy_of_the_best_model_for_a_client_whose_loss_rose() -> None:
    """δ = 0.2. Step 0: everyone on row 0, prev = 1.0. Step 1: client 0's best loss 0.5 (a fall)
    and client 1's 1.1 (a rise of 0.1 ≤ δ) stay; client 2's 1.5 rose by 0.5 > δ: it opens row 1,
    which starts as a copy of row 0, θ = (10, 10); with η_g = 0.5 and a trained (12, 12) the
    new row is 10 + 0.5 (12 − 10) = 11, not an update of row 1's old (−1, −1)."""
    algo = make(server_lr=0.5)
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, {0: same, 1: same, 2: same})
    assert algo.cluster[:3].tolist() == [0, 0, 0] and algo.prev[:3].tolist() == [1.0, 1.0, 1.0]
    assert algo.round_info() == {"active_models": 1}
    models = torch.tensor([[10.0, 10.0], [-1.0, -1.0], [-2.0, -2.0]])
    new, tasks = step(
        algo, 1, models,
        {0: ([0.5, 0.1, 0.1], [8.0, 8.0]), 1: ([1.1, 0.1, 0.1], [8.0, 8.0]),
         2: ([1.5, 0.1, 0.1], [12.0, 12.0])},
    )  # fmt: skip
    # rows 1 and 2 were not in use: their low losses do not count
    assert algo.cluster[:3].tolist() == [0, 0, 1]
    assert tasks[2].model == 1 and torch.equal(tasks[2].start, models[0])
    torch.testing.assert_close(new, torch.tensor([[9.0, 9.0], [11.0, 11.0], [-2.0, -2.0]]))
    assert algo.prev[:3].tolist() == pytest.approx([0.5, 1.1, 1.5])  # the best model's loss
    torch.testing.assert_close(algo.omega[2], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    assert int(algo.release[2]) == 2 and bool(algo.isolated()[1])  # W = 1: until step 2
    assert algo.round_info() == {"active_models": 2}
    algo.begin_step(2)
    assert int(algo.release[2]) == -1 and not algo.isolated().any()


def test_merge_folds_rows_closer_than_delta_prime_by_their_chunk_counts() -> None:
    """Step 1: clients 2 and 3 drift to rows 1 and 2. Step 2, cluster losses L_a(θ_b):
    cluster 0 (clients 0, 1) (0.5, 0.6, 3.0), cluster 1 (client 2) (0.45, 0.3, 3.0), cluster 2
    (client 3) (3.0, 3.0, 0.2): D(0,1) = max(0.6 − 0.5, 0.45 − 0.3, 0) = 0.15 ≤ δ′ = 0.2, D(0,2)
    = D(1,2) = 2.8. Chunks: row 0 4 + 2 + 2 = 8, row 1 1 + 1 = 2: p = 0.8, so row 0 becomes
    0.8 (2, 2) + 0.2 (7, 7) = (3, 3), its average (1 + 3)/2 with row 1's trained (7, 7). The
    merge waits for the round in which the last client (3) checks in."""
    algo = make()
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(4), same))
    stay = ([0.5, 9.0, 9.0], [0.0, 0.0])
    step(
        algo, 1, models,
        {0: stay, 1: stay, 2: ([1.5, 9.0, 9.0], [0.0, 0.0]), 3: ([2.0, 9.0, 9.0], [0.0, 0.0])},
    )  # fmt: skip
    assert algo.cluster.tolist() == [0, 0, 1, 2] and algo.chunks.tolist() == [6.0, 1.0, 1.0]
    models, _ = step(
        algo, 2, models,
        {0: ([0.4, 0.5, 3.0], [1.0, 1.0]), 1: ([0.6, 0.7, 3.0], [3.0, 3.0]),
         2: ([0.45, 0.3, 3.0], [7.0, 7.0])},
    )  # fmt: skip
    assert algo.round_info() == {"active_models": 3}  # client 3 has not checked in yet
    new, _ = step(algo, None, models, {3: ([3.0, 3.0, 0.2], [5.0, -5.0])})
    torch.testing.assert_close(new[[0, 2]], torch.tensor([[3.0, 3.0], [5.0, -5.0]]))
    assert algo.cluster.tolist() == [0, 0, 0, 2]
    torch.testing.assert_close(algo.omega[2], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert algo.in_use.tolist() == [True, False, True] and algo.chunks.tolist() == [10.0, 0, 2]
    assert algo.round_info() == {"active_models": 2}
    # a smaller δ′ keeps them apart
    algo = make(delta_merge=0.1)
    step(algo, 0, models, dict.fromkeys(range(4), same))
    step(algo, 1, models, {0: stay, 1: stay, 2: ([1.5, 9.0, 9.0], [0.0, 0.0]), 3: stay})
    near = ([0.5, 0.6, 3.0], [0.0, 0.0])  # D(0, 1) = 0.15 > 0.1
    step(algo, 2, models, {0: near, 1: near, 2: ([0.45, 0.3, 3.0], [0.0, 0.0]), 3: near})
    assert not algo.merge_due  # it was tried
    assert algo.round_info() == {"active_models": 2} and int(algo.cluster[2]) == 1


@pytest.mark.parametrize(
    ("distance", "losses", "merged"),
    [
        # L_0(θ_0) 0.5, L_0(θ_1) 0.6, L_1(θ_0) 0.45, L_1(θ_1) 0.3. data: max(0.6 − 0.5,
        # 0.45 − 0.3) = 0.15 ≤ δ′ = 0.2; model: max(0.45 − 0.5, 0.6 − 0.3) = 0.3 > δ′
        ("data", ((0.5, 0.6), (0.45, 0.3)), True),
        ("model", ((0.5, 0.6), (0.45, 0.3)), False),
        # L_0(θ_0) 0.2, L_0(θ_1) 0.5, L_1(θ_0) 0.38, L_1(θ_1) 0.35. data: max(0.3, 0.03) = 0.3;
        # model (the authors' 'A'): max(0.38 − 0.2, 0.5 − 0.35) = 0.18
        ("data", ((0.2, 0.5), (0.38, 0.35)), False),
        ("model", ((0.2, 0.5), (0.38, 0.35)), True),
    ],
)
def test_the_merge_distance_is_on_the_clusters_data_or_on_the_models(
    distance: str, losses: tuple, merged: bool
) -> None:
    """Client 2 drifts to row 1 at step 1; at step 2 clients 0, 1 (cluster 0) and 2 (cluster 1)
    score rows 0 and 1 with the losses L_a(θ_b) above (row 2 unused); each client's best row is
    its own, so only the merge can join them."""
    algo = make(distance=distance)
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(3), same))
    stay = ([0.5, 9.0, 9.0], [0.0, 0.0])
    step(algo, 1, models, {0: stay, 1: stay, 2: ([1.5, 9.0, 9.0], [0.0, 0.0])})
    assert algo.cluster[:3].tolist() == [0, 0, 1]
    (a, b), (c, d) = losses
    cluster0 = ([a, b, 9.0], [0.0, 0.0])
    step(algo, 2, models, {0: cluster0, 1: cluster0, 2: ([c, d, 9.0], [0.0, 0.0])})
    assert algo.cluster[:3].tolist() == ([0, 0, 0] if merged else [0, 0, 1])
    assert algo.round_info() == {"active_models": 1 if merged else 2}


def test_clients_that_left_a_model_still_score_it_for_the_merge() -> None:
    """Two clients drift together to rows 1 and 2; at the next step both pick row 2 as best.
    Row 1 has no member left, but client 1's data (its concept unchanged since its drift)
    stands for row 1's cluster: L_1 = (3, 0.2, 0.1), L_2 = the same (clients 1 and 2), so
    D(1, 2) = max(0.1 − 0.2, 0.2 − 0.1, 0) = 0.1 ≤ δ′. Row 2 folds into the lower row 1 with
    p = n_1 / (n_1 + n_2) = 1 / (1 + 3): 0.25 (0, 0) + 0.75 (3, 3), row 2's average."""
    algo = make(clients=3)
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(3), same))
    drift = ([2.0, 9.0, 9.0], [0.0, 0.0])
    step(algo, 1, models, {0: ([0.5, 9.0, 9.0], [0.0, 0.0]), 1: drift, 2: drift})
    assert algo.cluster.tolist() == [0, 1, 2]
    new, _ = step(
        algo, 2, models,
        {0: ([0.5, 3.0, 3.0], [1.0, 1.0]), 1: ([3.0, 0.2, 0.1], [2.0, 2.0]),
         2: ([3.0, 0.2, 0.1], [4.0, 4.0])},
    )  # fmt: skip
    assert algo.cluster.tolist() == [0, 1, 1] and algo.in_use.tolist() == [True, True, False]
    torch.testing.assert_close(new[1], torch.tensor([2.25, 2.25]))


def test_a_client_back_on_a_recurring_concept_stops_scoring_its_old_model() -> None:
    """Client 2 drifts to row 1 at step 1. At step 2 client 1 takes row 1's concept: its loss
    falls (0.5 → 0.2 under row 1, so the detector sees no drift) but row 0's is 3.0, more than
    δ above: its data now says nothing of row 0's cluster. Cluster 0 is scored on client 0's N
    samples alone (L_0 = (0.5, 3.0)), cluster 1 on clients 1 and 2's 2N, and the two stay
    apart. (Scored as before its move, cluster 0 would mix both concepts.)"""
    algo = make(clients=3)
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(3), same))
    stay = ([0.5, 9.0, 9.0], [0.0, 0.0])
    step(algo, 1, models, {0: stay, 1: stay, 2: ([2.0, 9.0, 9.0], [0.0, 0.0])})
    assert algo.cluster.tolist() == [0, 0, 1]
    recurring = ([3.0, 0.2, 9.0], [0.0, 0.0])
    step(algo, 2, models, {0: ([0.5, 3.0, 9.0], [0.0, 0.0]), 1: recurring, 2: recurring})
    assert algo.cluster.tolist() == [0, 1, 1] and int(algo.release[1]) == -1  # not a drift
    rows = [[True, False, False], [False, True, False], [False, True, False]]
    assert algo.lineage.tolist() == rows
    assert algo.mass[:2].tolist() == [N, 2 * N]
    torch.testing.assert_close(algo.table[0, :2] / N, torch.tensor([0.5, 3.0], dtype=torch.float64))
    assert algo.round_info() == {"active_models": 2}


def test_a_full_pool_keeps_the_client_on_its_best_model_and_evicts_the_least_recently_used():
    """K = 2, window 2. Step 1: client 1 drifts to row 1; client 2 drifts too but every row is
    held, so it stays on row 0 (prev := its best loss). Step 2: client 1 is isolated (no check).
    Step 3: client 1 goes back to row 0 (its best); step 4: client 0 drifts and row 1, held by
    nobody, is evicted and restarts as a copy of row 0 with no chunks."""
    algo = make(clients=3, k=2, window=2)
    models = torch.zeros(2, 2)
    same = ([1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(3), same))
    drift = ([2.0, 0.0], [0.0, 0.0])
    step(algo, 1, models, {0: ([0.5, 0.0], [0.0, 0.0]), 1: drift, 2: drift})
    assert algo.cluster.tolist() == [0, 1, 0] and float(algo.prev[2]) == 2.0
    step(algo, 2, models, {1: ([0.1, 5.0], [0.0, 0.0])})  # isolated: stays, prev kept
    assert int(algo.cluster[1]) == 1 and float(algo.prev[1]) == 2.0
    step(algo, 3, models, {1: ([0.4, 0.9], [0.0, 0.0])})  # D(0, 1) = 0.5: no merge
    assert int(algo.cluster[1]) == 0 and algo.in_use.tolist() == [True, True]
    models = torch.tensor([[5.0, 5.0], [-1.0, -1.0]])
    new, tasks = step(algo, 4, models, {0: ([3.0, 3.0], [6.0, 6.0])})
    assert int(algo.cluster[0]) == 1 and torch.equal(tasks[0].start, models[0])
    assert algo.chunks.tolist()[1] == 1.0 and algo.last_used.tolist() == [3, 4]
    torch.testing.assert_close(new[1], torch.tensor([6.0, 6.0]))


def test_eager_shares_one_new_model_per_step_and_never_merges() -> None:
    algo = make("feddrift-eager", clients=4, k=3)
    models = torch.zeros(3, 2)
    same = ([1.0, 1.0, 1.0], [0.0, 0.0])
    step(algo, 0, models, dict.fromkeys(range(4), same))
    drift = ([2.0, 0.0, 0.0], [0.0, 0.0])
    step(algo, 1, models, {0: ([0.5, 0, 0], [0.0, 0.0]), 1: drift, 2: drift, 3: drift})
    assert algo.cluster.tolist() == [0, 1, 1, 1]
    same = ([0.5, 0.5, 9.0], [0.0, 0.0])  # rows 0 and 1 now fit everyone equally
    step(algo, 2, models, dict.fromkeys(range(4), same))
    assert algo.round_info() == {"active_models": 2}  # FedDrift would merge them here


def test_held_out_clients_take_the_best_model_in_use() -> None:
    algo = make()
    step(algo, 0, torch.zeros(3, 2), {0: ([1.0, 1.0, 1.0], [0.0, 0.0])})
    omega = algo.assign_held_out(3, torch.tensor([[0.9, 0.1, 0.1]]), torch.zeros(1).long())
    assert omega.tolist() == [1.0, 0.0, 0.0]  # rows 1 and 2 are not in use
    # without labels: the most confident model in use; row 1 is more confident but free
    logits = torch.tensor([[[2.0, 0.0, 0.0]], [[9.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]])
    omega = algo.assign_unlabeled(3, logits, torch.zeros(1, 1, 2, 2))
    assert omega.tolist() == [1.0, 0.0, 0.0]


def test_per_client_init_gives_each_client_its_own_model_while_rows_last() -> None:
    algo = make(clients=4, k=3, init="per-client")
    losses = ([1.0, 0.5, 0.9], [0.0, 0.0])
    step(algo, 0, torch.zeros(3, 2), dict.fromkeys(range(4), losses))
    assert algo.cluster.tolist() == [0, 1, 2, 1]  # the fourth joins its best


def test_state_round_trips() -> None:
    algo = make()
    step(algo, 0, torch.zeros(3, 2), {0: ([1.0, 1.0, 1.0], [0.0, 0.0])})
    step(algo, 1, torch.zeros(3, 2), {0: ([2.0, 1.0, 1.0], [0.0, 0.0])})
    other = make()
    other.load_state_dict(algo.state_dict())
    for key, value in algo.state_dict().items():
        got = torch.as_tensor(getattr(other, key))
        torch.testing.assert_close(got, torch.as_tensor(value), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("delta", 0.0),
        ("delta_merge", -0.1),
        ("window", 0),
        ("init", "random"),
        ("distance", "loss"),
    ],
)
def test_bad_settings_are_one_line(key: str, value: object) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.feddrift\.{key}: expected"):
        make(**{key: value})


# --- on a drifting benchmark -----------------------------------------------------------------
SWITCHED = [0, 3, 5, 8]  # these take a label swap at step 2 and keep it at step 3


@pytest.fixture(scope="module")
def swap_drift(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swap") / "data"
    config = PartitionConfig(
        dataset="synthetic", clients=12, samples_per_client=80, holdout_samples=200,
        shifts=["concept"], concepts=["identity", "swap:0-1"], client_mix="custom",
        client_shares=[1.0, 0.0, 0.0, 0.0], time_steps=4,
        drift=[{"step": 2, "clients": SWITCHED, "concept": "swap:0-1"}], out=str(out),
    )  # fmt: skip
    config.validate()
    partition_stage(config)
    return out


def rows_at_step_ends(data: Path, out: Path, algorithm: str) -> tuple[list, list]:
    """Train 3 rounds a step; each participating client's row at the end of every step, and
    the number of models in use at each round."""
    run = train_stage(
        make_config(
            data=str(data), algorithm=algorithm, out=str(out), rounds=12, local_epochs=2,
            batch_size=16, lr=0.05, clusters=5, device="cpu", eval_every=3,
        )
    )  # fmt: skip
    schedule = np.asarray(load_federated(data).manifest.schedule)
    assert [int((schedule[t] != schedule[0]).sum()) for t in range(4)] == [0, 0, 4, 4]
    assignments = rf.read_assignments(run / rf.ASSIGNMENTS)
    rows = [omega_at(assignments, r)[0][:12].argmax(1) for r in (3, 6, 9, 12)]
    active = [r["active_models"] for r in rf.read_metrics(run / rf.METRICS)]
    return rows, active


def test_switched_clients_get_new_models_that_merge_into_one(
    swap_drift: Path, tmp_path: Path
) -> None:
    """Steps 0–1: one model. Step 2: the four switched clients' loss on their new data jumps
    (a swapped pair of classes), each gets a new model, copied from the old one; the others
    stay. Step 3: the four new models fit each other's clients, and merge into one."""
    rows, active = rows_at_step_ends(swap_drift, tmp_path, "feddrift")
    switched = np.isin(np.arange(12), SWITCHED)
    assert (rows[0] == 0).all() and (rows[1] == 0).all()
    assert (rows[2][~switched] == 0).all() and len(set(rows[2][switched].tolist()) - {0}) == 4
    assert (rows[3][~switched] == 0).all()
    assert len(set(rows[3][switched].tolist())) == 1 and rows[3][0] != 0
    assert active == [1] * 6 + [5] * 3 + [2] * 3


def test_eager_puts_the_switched_clients_on_one_new_model(swap_drift: Path, tmp_path: Path):
    rows, active = rows_at_step_ends(swap_drift, tmp_path, "feddrift-eager")
    switched = np.isin(np.arange(12), SWITCHED)
    for t in (2, 3):
        assert (rows[t][~switched] == 0).all() and set(rows[t][switched].tolist()) == {1}
    assert active == [1] * 6 + [2] * 6


@pytest.mark.slow  # 30 s; FedDrift under torchrun is also in test_distributed's CASES
def test_torchrun_equals_one_process(swap_drift: Path, tmp_path: Path) -> None:
    """Detection, the new rows' copies and the merge happen alike on every rank (half the
    clients a round, so some check in at a later round of a step)."""
    from test_distributed import BASE, assert_same_run, single, torchrun

    # 4 rounds a step: the switched clients' new models merge at the last round, once every
    # client of the step has checked in (with 3 a step, the merge would come after the run)
    values = {**BASE, "algorithm": "feddrift", "rounds": 16, "clusters": 5, "eval_every": 4}
    expected = single(swap_drift, tmp_path / "single", values)
    torchrun(tmp_path, swap_drift, tmp_path / "two", values)
    assert_same_run(expected, tmp_path / "two", exact=False)
    active = [r["active_models"] for r in rf.read_metrics(expected / rf.METRICS)]
    assert max(active) > active[-1] > 1  # new models opened, and some merged


def test_resume_mid_step_equals_the_uninterrupted_run(swap_drift: Path, tmp_path: Path) -> None:
    """Stopped after the first round of step 3, with half the clients a round (the merge still
    waits for the others), and resumed: the same run."""
    values = dict(
        data=str(swap_drift), algorithm="feddrift", rounds=12, rounds_per_step=3, local_epochs=1,
        batch_size=16, lr=0.05, clusters=5, participation=0.5, eval_every=1, device="cpu",
    )  # fmt: skip
    whole = train_stage(make_config(**values, out=str(tmp_path / "a")))
    half = tmp_path / "b"
    train_stage(make_config(**{**values, "rounds": 10}, out=str(half)))
    state = torch.load(half / rf.CHECKPOINT, weights_only=True)["algorithm"]
    assert state["merge_due"] and state["round_in_step"] == 1
    train_stage(make_config(**values, out=str(half)), resume=True)
    rows = [rf.read_metrics(run / rf.METRICS) for run in (whole, half)]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
    assert rows[0] == rows[1]
    models = [torch.load(run / rf.MODEL, weights_only=True) for run in (whole, half)]
    assert torch.equal(models[0]["models"], models[1]["models"])
