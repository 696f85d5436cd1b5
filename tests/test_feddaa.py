"""FedDAA (docs/protocol.md §17): the data prototype, the silhouette and the cluster count, the
real-drift check and the rows each cluster takes, on hand-checked cases (the silhouette against
scikit-learn where it is installed); the round loop's prototypes at a step's end and the next
step's start; and on a drifting benchmark what it does that its neighbours do not: it names the
clients whose P(y|x) changed, and only those change cluster."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import torch_threads
from test_drift import DRIFTING, TRAIN

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.cluster_count import count_clusters, silhouette
from pipeline.algorithms.feddaa import centre_rows, nearest, prototype, real_drift
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.engine import LocalResult, LocalTask
from pipeline.run.clients import training_rows, with_retained
from pipeline.run.files import METRICS, MODEL, load_state, read_metrics
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage


def make(clients: int = 6, k: int = 3, classes: int = 2, **kw):
    algo = build_algorithm(make_config(algorithm="feddaa", clusters=k, **kw), clients, classes)
    algo.participants(list(range(clients)))
    return algo


# --- the prototype ----------------------------------------------------------------------------
def test_prototype_is_the_class_means_of_the_logits() -> None:
    logits = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 5.0], [9.0, 9.0]])
    labels = torch.tensor([0, 0, 1, 1])
    got = prototype(logits, labels, 3)
    assert got.tolist() == [[2.0, 1.0], [4.5, 7.0], [0.0, 0.0]]  # class 2: no sample


def test_prototype_stays_under_label_drift_and_moves_under_real_drift() -> None:
    """The same images: fewer of class 0 (P(y) changes) leave the prototype as it was; the
    labels swapped (P(y|x) changes) swap its rows."""
    gen = torch.Generator().manual_seed(0)
    centre = torch.tensor([3.0, -3.0])
    noise = torch.randn(80, 2, generator=gen) * 0.01
    logits = torch.cat([noise[:40] + centre, noise[40:] - centre])
    labels = torch.cat([torch.zeros(40), torch.ones(40)]).long()
    before = prototype(logits, labels, 2)
    fewer = prototype(logits[30:], labels[30:], 2)  # 10 of class 0, 40 of class 1
    swapped = prototype(logits, 1 - labels, 2)
    assert (fewer - before).abs().max() < 0.01
    torch.testing.assert_close(swapped, before.flip(0))


def test_describe_is_pure_and_reads_row_0() -> None:
    """The prototype of model row 0's logits under the cnn on 16×16 images: deterministic, the
    global generator untouched."""
    from pipeline.models import build_model

    algo = make(clients=3, k=2, classes=10)
    torch.manual_seed(0)
    net = build_model((16, 16, 1), 10, "cnn").eval()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    images = torch.randint(0, 256, (20, 1, 16, 16), dtype=torch.uint8)
    labels = torch.arange(20) % 10
    models = torch.stack([flat, torch.zeros_like(flat)])
    state = torch.get_rng_state()
    got = algo.describe(0, images, labels, models)
    assert torch.equal(torch.get_rng_state(), state)
    with torch.no_grad():
        logits = net(images.float() / 127.5 - 1)
    torch.testing.assert_close(got, prototype(logits, labels, 10).flatten(), rtol=1e-5, atol=1e-5)


# --- the cluster count ------------------------------------------------------------------------
def test_silhouette_by_hand() -> None:
    """Points 0 and 1 together, 10 alone: s = (10 − 1)/10 and (9 − 1)/9 for the pair, 0 for the
    single point."""
    points = np.array([[0.0], [1.0], [10.0]])
    got = silhouette(points, np.array([0, 0, 1]))
    assert got == pytest.approx((0.9 + 8 / 9 + 0.0) / 3, rel=1e-12)


def test_silhouette_is_scikit_learns() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(10):
        points, labels = rng.normal(size=(15, 4)), rng.integers(0, 4, 15)
        labels[:2] = [0, 1]  # at least two clusters
        expected = metrics.silhouette_score(points, labels)
        assert silhouette(points, labels) == pytest.approx(expected, rel=1e-10)


def blobs(centres: list[list[float]], each: int = 5, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=(each, 2)) * 0.1 + c for c in centres])


@pytest.mark.parametrize("count", [2, 3, 4])
def test_the_silhouette_finds_the_number_of_blobs(count: int) -> None:
    centres = [[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]][:count]
    points = blobs(centres)
    labels, found = count_clusters(points, range(2, 10), np.random.default_rng(1), 1)
    assert len(found) == count
    truth = np.repeat(np.arange(count), 5)
    assert all((labels[i] == labels[j]) == (truth[i] == truth[j])
               for i in range(len(truth)) for j in range(len(truth)))  # fmt: skip
    np.testing.assert_allclose(found[labels], points, atol=0.5)


def test_the_count_is_capped_by_the_candidates_and_one_cluster_without_any() -> None:
    points = blobs([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    _, found = count_clusters(points, range(2, 3), np.random.default_rng(1), 1)
    assert len(found) == 2
    labels, found = count_clusters(points, range(2, 2), np.random.default_rng(1), 1)
    assert labels.tolist() == [0] * 15
    np.testing.assert_allclose(found, points.mean(0, keepdims=True))


# --- real drift and the rows ------------------------------------------------------------------
def test_real_drift_is_a_change_of_nearest_centre() -> None:
    centres = np.array([[0.0, 0.0], [4.0, 4.0]])
    before = np.array([[0.1, 0.0], [0.0, 0.2], [4.0, 3.9], [1.9, 1.9]])
    now = np.array([[0.3, 0.0], [3.8, 4.0], [0.2, 0.1], [2.1, 2.1]])
    assert nearest(now, centres).tolist() == [0, 1, 0, 1]
    assert real_drift(before, now, centres).tolist() == [False, True, True, True]


def test_rows_of_a_first_clustering() -> None:
    """Everyone in row 0: the larger centre keeps it, the other takes row 1, a copy of row 0."""
    groups = np.array([1, 0, 1, 1, 0])
    row, source = centre_rows(groups, np.zeros(5, dtype=bool), np.zeros(5, dtype=np.int64), 3)
    assert (row, source) == ([1, 0], [0, 0])


def test_rows_follow_the_members_without_real_drift() -> None:
    """Centre 0 holds clients of row 2 and one that drifted from row 1; centre 1 clients of row 1
    and two that drifted from row 2 (more than its row-1 members): each centre keeps the row of
    its members without real drift. Centre 2, all drifted (from row 2), takes the free row 0,
    which starts from row 2's model."""
    groups = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    held = np.array([2, 2, 1, 1, 2, 2, 2, 2, 2])
    drifted = np.array([False, False, True, False, True, True, True, True, True])
    row, source = centre_rows(groups, drifted, held, 3)
    assert row == [2, 1, 0] and source == [2, 1, 2]


def test_a_split_cluster_gives_its_row_to_the_larger_part() -> None:
    groups = np.array([0, 0, 1, 1, 1])
    row, source = centre_rows(groups, np.zeros(5, dtype=bool), np.zeros(5, dtype=np.int64), 2)
    assert (row, source) == ([1, 0], [0, 0])


# --- the round loop ---------------------------------------------------------------------------
A, B = [0.0, 0.0, 4.0, 4.0], [4.0, 4.0, 0.0, 0.0]  # two concepts' prototypes (C = 2)


def proto(base: list[float], shift: float) -> torch.Tensor:
    return torch.tensor(base, dtype=torch.float64) + shift


def play(algo, models, stats: dict[int, torch.Tensor], trained: dict[int, float]):
    """A round where every client is sampled and `stats` are the prototypes sent."""
    algo.begin_round(models)
    algo.plan_round(sorted(trained))
    assert algo.wants_statistics(sorted(trained)) == (sorted(stats) if stats else [])
    for c, s in sorted(stats.items()):
        algo.observe(c, s)
    for c in sorted(trained):
        gamma = algo.e_step(c, torch.zeros(10, algo.num_models), torch.zeros(10, dtype=torch.long))
        (task,) = algo.local_tasks(c, gamma, models, None)
        algo.fold(c, task, LocalResult(task.start + trained[c], 0.0, None))
    new = algo.aggregate(models)
    algo.end_round()
    return new


def test_a_step_end_a_clustering_and_a_client_that_drifted_for_real() -> None:
    """Two rounds a step. Step 0: everyone in row 0 (FedAvg); its last round sends P^0. Step 1:
    clients 0–3 hold concept A, 4–5 concept B; the clustering puts them in rows 0 and 1 (a copy
    of row 0). Step 2: client 1's prototype barely moves (label drift), client 4's moves to A
    (real drift): only client 4 is flagged, client 1 stays, client 4 joins row 0."""
    algo = make(clients=6, k=3, rounds=6, rounds_per_step=2)
    everyone = dict.fromkeys(range(6), 1.0)
    models = torch.zeros(3, 1)
    models = play(algo, models, {}, everyone)
    assert models.tolist() == [[1.0], [0.0], [0.0]]
    step0 = {c: proto(A, 0.0) for c in range(6)}
    models = play(algo, models, step0, everyone)  # the step's last round: P^0
    assert algo.has_last.all() and algo.cluster.tolist() == [0] * 6

    algo.begin_step(1)
    step1 = {c: proto(A if c < 4 else B, 0.01 * c) for c in range(6)}
    trained = {c: 1.0 if c < 4 else 3.0 for c in range(6)}
    models = play(algo, models, step1, trained)
    assert algo.cluster.tolist() == [0, 0, 0, 0, 1, 1] and algo.in_use.tolist() == [1, 1, 0]
    assert algo.drifted.tolist() == [False, False, False, False, True, True]
    assert algo.retain.tolist() == [True, True, True, True, False, False]
    assert models.tolist() == [[3.0], [5.0], [0.0]]  # row 1 started from row 0's [2.0]
    assert algo.omega[5].tolist() == [0.0, 1.0, 0.0]
    models = play(algo, models, step1, everyone)  # the step's last round: P^1
    torch.testing.assert_close(algo.last[4], step1[4])

    step2 = {**step1, 1: proto(A, 0.2), 4: proto(A, 0.04)}
    algo.retain[:] = True  # the previous step's flags end with it
    algo.begin_step(2)
    assert not algo.retain.any()
    play(algo, models, step2, everyone)
    assert algo.drifted.tolist() == [False, False, False, False, True, False]
    assert algo.retain.tolist() == [True, True, True, True, False, True]
    assert algo.cluster.tolist() == [0, 0, 0, 0, 0, 1]


def test_held_out_takes_the_lowest_loss_cluster_in_use() -> None:
    algo = make(k=3)
    algo.in_use[:] = torch.tensor([True, True, False])
    losses = torch.tensor([[2.0, 1.0, 0.1]])  # row 2 is not a cluster
    assert algo.assign_held_out(0, losses, torch.tensor([0])).tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("key", "value"), [("max_clusters", 1), ("kmeans_starts", 0), ("cluster_round", 1)]
)
def test_bad_settings_are_one_line_naming_the_key(key: str, value) -> None:
    with pytest.raises(FedrcError, match=rf"^train\.feddaa\.{key}: expected [^\n]*$"):
        make(**{key: value})


def test_flower_refuses_feddaa_in_one_line() -> None:
    """The prototypes are client statistics, which Flower nodes do not compute."""
    from pipeline.flower.appconfig import check_config

    with pytest.raises(FedrcError, match=r"^train\.algorithm: feddaa asks clients for [^\n]*$"):
        check_config(make_config(algorithm="feddaa"))


# --- behaviour on a drifting benchmark --------------------------------------------------------
@pytest.fixture(scope="module")
def drifting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Concepts identity and reverse (the same images, other labels: P(y|x) changes), a quarter
    of the clients flipping at steps 1 and 2."""
    out = tmp_path_factory.mktemp("feddaa") / "data"
    config = PartitionConfig(**DRIFTING, out=str(out))
    config.validate()
    partition_stage(config)
    return out


def test_a_retaining_client_trains_on_its_previous_steps_rows_too(drifting: Path) -> None:
    """The round loop's side of CDA: at step 2 a retaining client's local trainings take its
    step-2 training rows, then its step-1 ones, each of those with sample weight 1, and the
    task's weight grows by their count; a client that does not retain takes step 2's alone."""
    data = load_federated(drifting).at_step(2)
    algo = make(clients=len(data.clients), k=2)
    algo.retain[0] = True
    now, before = data.train_slices[0], data.previous_train(0)
    assert before != now and before.stop > before.start
    images, labels, added = training_rows(data, algo, 0)
    assert added == before.stop - before.start == data.previous_train_size(0)
    assert torch.equal(images, torch.cat([data.images[now], data.images[before]]))
    assert torch.equal(labels, torch.cat([data.labels[now], data.labels[before]]))
    task = with_retained(LocalTask(0, torch.zeros(1), torch.full((3,), 0.5), weight=3.0), 2)
    assert task.weights.tolist() == [0.5, 0.5, 0.5, 1.0, 1.0] and task.weight == 5.0
    images, _, added = training_rows(data, algo, 1)
    assert added == 0 and torch.equal(images, data.images[data.train_slices[1]])
    assert data.at_step(0).previous_train(0) == slice(0, 0)
    assert data.at_step(0).previous_train_size(0) == 0


def test_only_the_clients_whose_concept_changed_are_flagged_and_move(
    drifting: Path, tmp_path: Path
) -> None:
    """5 rounds a step. At step 2 FedDAA flags exactly the clients whose concept changed (no
    other method names them): they move and leave their old data, the others keep their
    cluster and train on their data of steps 1 and 2. Its clusters are that step's concepts.
    Membership only: one thread is enough."""
    with torch_threads(1):
        run = train_stage(
            make_config(data=str(drifting), algorithm="feddaa", out=str(tmp_path), **TRAIN)
        )
    state = load_state(run / MODEL)["algorithm"]
    schedule = np.asarray(load_federated(drifting).benchmark.schedule)
    taking = schedule.shape[1]
    moved = schedule[2] != schedule[1]
    assert moved.any() and not moved.all()
    assert state["drifted"][:taking].tolist() == moved.tolist()
    assert state["retain"][:taking].tolist() == (~moved).tolist()
    cluster = state["cluster"][:taking].tolist()
    assert all((cluster[i] == cluster[j]) == (schedule[2][i] == schedule[2][j])
               for i in range(taking) for j in range(taking))  # fmt: skip


def test_torchrun_equals_one_process_over_steps(drifting: Path, tmp_path: Path) -> None:
    """The prototypes of every participating client gathered from both ranks, the clustering
    at each new step and the retained rows, half the clients a round: the same run (the static
    case is in test_distributed's CASES)."""
    from test_distributed import BASE, assert_same_run, single, torchrun

    values = {**BASE, "algorithm": "feddaa", "rounds": 6, "local_epochs": 1, "eval_every": 2}
    expected = single(drifting, tmp_path / "single", values)
    torchrun(tmp_path, drifting, tmp_path / "two", values)
    assert_same_run(expected, tmp_path / "two", exact=False)
    state = load_state(expected / MODEL)["algorithm"]
    assert state["retain"].any() and int(state["in_use"].sum()) == 2


def test_batched_executor_matches_sequential_with_retained_rows(
    drifting: Path, tmp_path: Path
) -> None:
    """The retained rows reach the batched executor as they reach the sequential one: train
    losses within 1e-3 (on this benchmark FedAvg's two executors drift 3e-4 apart by round 4;
    without the retained rows the losses differ by 0.2 to 0.9)."""
    from conftest import assert_metrics_close

    runs = {}
    for executor in ("sequential", "batched"):
        config = make_config(
            data=str(drifting), algorithm="feddaa", rounds=4, local_epochs=1, batch_size=16,
            lr=0.05, clusters=2, device="cpu", executor=executor, out=str(tmp_path / executor),
        )  # fmt: skip
        rows = read_metrics(train_stage(config) / METRICS)
        runs[executor] = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
        assert load_state(tmp_path / executor / MODEL)["algorithm"]["retain"].any()
    assert_metrics_close(runs["sequential"], runs["batched"], loss_tolerance=1e-3)
