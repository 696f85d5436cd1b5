"""Each baseline's update rule on a tiny hand-checked case (protocol §2–3)."""

import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.common.errors import FedrcError
from pipeline.engine import LocalResult
from pipeline.run.resolve import make_config, train_config


def make(name: str, clients: int = 4, k: int = 2, classes: int = 3, **kw):
    config = make_config(algorithm=name, clusters=k, **kw)
    return build_algorithm(config, clients, classes)


def result(*params: float) -> LocalResult:
    return LocalResult(torch.tensor(params, dtype=torch.float64), 0.0, None)


def run_round(algo, models, trained: dict[int, tuple[int, list[float]]], losses=None):
    """Clients assign with `losses[i]`, then their (only) task returns `trained[i]`'s params."""
    algo.begin_round(models)
    for client, (n, params) in trained.items():
        client_losses = losses[client] if losses else torch.zeros(n, algo.num_models)
        gamma = algo.e_step(client, client_losses, torch.zeros(n, dtype=torch.long))
        for task in algo.local_tasks(client, gamma, models, torch.zeros(algo.num_rows, n, 3)):
            algo.fold(client, task, result(*params))
    new = algo.aggregate(models)
    algo.end_round()
    return new


def test_fedprox_pulls_towards_the_received_model_and_needs_mu_above_zero() -> None:
    algo = make("fedprox", mu=0.5)
    models = torch.tensor([[1.0, 2.0]])
    (task,) = algo.local_tasks(0, torch.ones(5, 1), models, torch.zeros(1, 5, 3))
    assert torch.equal(task.anchor, models[0]) and task.mu == 0.5 and task.weight == 5
    with pytest.raises(FedrcError, match=r"train\.fedprox\.mu"):
        make("fedprox", mu=0.0)
    assert make("fedprox").settings.mu == 0.01  # from the FedProx paper's grid


def test_ifca_joins_lowest_mean_loss_and_keeps_empty_clusters() -> None:
    algo = make("ifca")
    losses = torch.tensor([[0.1, 3.0], [2.0, 0.5]])  # means 1.05 and 1.75 → model 0
    gamma = algo.e_step(0, losses, torch.zeros(2, dtype=torch.long))
    assert torch.equal(gamma, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    (task,) = algo.local_tasks(0, gamma, torch.zeros(2, 2), torch.zeros(2, 2, 3))
    assert task.model == 0
    models = torch.tensor([[0.0, 0.0], [9.0, 9.0]])
    low0 = [torch.tensor([[0.0, 1.0]] * 10), torch.tensor([[0.0, 1.0]] * 30)]
    new = run_round(algo, models, {0: (10, [1.0, 0.0]), 1: (30, [3.0, 4.0])}, low0)
    torch.testing.assert_close(new[0], torch.tensor([2.5, 3.0]))  # (10·a + 30·b) / 40
    torch.testing.assert_close(new[1], models[1])  # nobody chose model 1: kept, not zeroed


def test_fesem_reassigns_to_nearest_centre_and_keeps_the_update() -> None:
    algo = make("fesem")
    models = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    losses = {0: torch.tensor([[0.0, 1.0]] * 4), 1: torch.tensor([[0.0, 1.0]] * 4)}
    # both start in cluster 0 (lowest loss); client 1's trained model lands near centre 1
    new = run_round(algo, models, {0: (4, [1.0, 1.0]), 1: (4, [9.0, 8.0])}, losses)
    assert algo.cluster[:2].tolist() == [0, 1]
    torch.testing.assert_close(new, torch.tensor([[1.0, 1.0], [9.0, 8.0]]))
    torch.testing.assert_close(algo.omega[1], torch.tensor([0.0, 1.0], dtype=torch.float64))


def test_cfl_splits_a_stationary_but_disagreeing_cluster() -> None:
    algo = make("cfl", clients=5, k=3)
    assert algo.clusters == 1 and algo.num_models == 3
    models = torch.zeros(3, 2)
    # mean update (0, 0.05): ‖·‖ < ε1 = 0.4; max ‖Δ‖ = 2 > ε2 = 1.6; two opposite directions
    updates = {0: [2.0, 0.0], 1: [1.9, 0.2], 2: [-2.0, 0.0], 3: [-1.9, 0.0]}
    new = run_round(algo, models, {i: (10, u) for i, u in updates.items()})
    assert algo.clusters == 2
    groups = {tuple(sorted(i for i in range(4) if algo.cluster[i] == c)) for c in (0, 1)}
    assert groups == {(0, 1), (2, 3)}
    side = int(algo.cluster[0])
    torch.testing.assert_close(new[side], torch.tensor([1.95, 0.1]))
    torch.testing.assert_close(new[1 - side], torch.tensor([-1.95, 0.0]))
    assert algo.pending == {4: [0, 1]}  # not sampled: joins the better half when it comes back
    losses = torch.tensor([[5.0, 0.1, 9.0]])
    algo.e_step(4, losses, torch.zeros(1, dtype=torch.long))
    assert int(algo.cluster[4]) == 1 and 4 not in algo.pending


def test_cfl_does_not_split_while_the_mean_update_is_large() -> None:
    algo = make("cfl", clients=4, k=3)
    run_round(algo, torch.zeros(3, 2), {i: (10, [2.0, 0.0]) for i in range(4)})
    assert algo.clusters == 1


def test_cfl_respects_max_clusters() -> None:
    algo = make("cfl", clients=4, k=3, max_clusters=1)
    updates = {0: [2.0, 0.0], 1: [2.0, 0.1], 2: [-2.0, 0.0], 3: [-2.0, 0.1]}
    run_round(algo, torch.zeros(1, 2), {i: (10, u) for i, u in updates.items()})
    assert algo.clusters == 1


def test_fedsoft_importance_weights_and_aggregation() -> None:
    algo = make("fedsoft", mu=0.1)
    # 3 of 4 samples fit model 0 best, 1 fits model 1 → u = (0.75, 0.25)
    losses = torch.tensor([[0.1, 1.0], [0.2, 1.0], [0.3, 1.0], [2.0, 1.0]])
    algo.e_step(0, losses, torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(algo.omega[0], torch.tensor([0.75, 0.25], dtype=torch.float64))
    # a model that fits nothing best still gets the floor 1e-4
    algo.e_step(1, torch.tensor([[0.1, 1.0]]), torch.zeros(1, dtype=torch.long))
    assert algo.omega[1, 1] == pytest.approx(1e-4 / (1 + 1e-4))
    models = torch.tensor([[4.0, 0.0], [0.0, 8.0]])
    (task,) = algo.local_tasks(0, torch.zeros(4, 2), models, torch.zeros(2, 4, 3))
    torch.testing.assert_close(task.anchor, torch.tensor([3.0, 2.0]))  # Σ_k u_k θ_k
    assert task.mu == 0.1
    new = run_round(
        algo,
        models,
        {0: (4, [1.0, 1.0]), 1: (1, [3.0, 3.0])},
        {0: losses, 1: torch.tensor([[0.1, 1.0]])},
    )
    u = torch.tensor([[0.75, 0.25], [1 / (1 + 1e-4), 1e-4 / (1 + 1e-4)]], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0], [3.0, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(new.double(), (u.T @ w) / u.sum(0)[:, None], rtol=1e-6, atol=1e-6)
    assert torch.equal(algo.personal_model(1), torch.tensor([3.0, 3.0], dtype=torch.float64))


def test_ifca_cam_sums_logits_and_updates_clusters_with_the_global_n() -> None:
    algo = make("ifca-cam", clients=3, warmup_rounds=0)
    assert algo.num_rows == 3  # K cluster models + the global one
    raw = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]], [[0.5, 0.5]]])
    torch.testing.assert_close(algo.combine_logits(raw), raw[:2] + raw[2])
    models = torch.tensor([[0.0], [10.0], [100.0]])
    losses = {0: torch.tensor([[0.0, 1.0]] * 10), 1: torch.tensor([[0.0, 1.0]] * 30)}
    losses[2] = torch.tensor([[1.0, 0.0]] * 60)
    algo.begin_round(models)
    tasks = {}
    for client, n in ((0, 10), (1, 30), (2, 60)):
        gamma = algo.e_step(client, losses[client], torch.zeros(n, dtype=torch.long))
        client_raw = torch.randn(3, n, 2)
        tasks[client] = algo.local_tasks(client, gamma, models, client_raw)
        cluster_task, global_task = tasks[client]
        k = int(algo.cluster[client])
        assert torch.equal(cluster_task.offset, client_raw[2])  # Θ_g frozen
        assert torch.equal(global_task.offset, client_raw[k])  # Θ_{c(i)} frozen
        algo.fold(client, cluster_task, result(float(client + 1)))
        algo.fold(client, global_task, result(50.0 + client))
    new = algo.aggregate(models)
    # cluster 0 = clients 0, 1: (1 − 40/100)·0 + (10·1 + 30·2)/100; cluster 1 = client 2
    torch.testing.assert_close(new[0], torch.tensor([0.7]))
    torch.testing.assert_close(new[1], torch.tensor([(1 - 0.6) * 10 + 0.6 * 3]))
    torch.testing.assert_close(new[2], torch.tensor([(10 * 50 + 30 * 51 + 60 * 52) / 100]))


def test_cam_warm_up_trains_only_the_global_model() -> None:
    algo = make("ifca-cam", warmup_rounds=1)
    raw = torch.randn(3, 4, 3)
    assert torch.equal(algo.combine_logits(raw)[1], raw[2])
    gamma = algo.e_step(0, torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    (task,) = algo.local_tasks(0, gamma, torch.zeros(3, 2), raw)
    assert task.model == 2 and task.offset is None
    algo.end_round()
    assert not algo.warming_up and len(algo.local_tasks(0, gamma, torch.zeros(3, 2), raw)) == 2


def test_fesem_cam_k_means_on_cluster_models() -> None:
    algo = make("fesem-cam", clients=4, mu=0.1, warmup_rounds=0)
    models = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    algo.begin_round(models)
    points = {0: [-5.0, 0.0], 1: [-4.0, 0.0], 2: [5.0, 5.0], 3: [6.0, 5.0]}
    for client, p in points.items():
        gamma = algo.e_step(client, torch.zeros(10, 2), torch.zeros(10, dtype=torch.long))
        cluster_task, global_task = algo.local_tasks(client, gamma, models, torch.zeros(3, 10, 3))
        assert cluster_task.mu == 0.1 and torch.equal(cluster_task.anchor, models[0])
        algo.fold(client, cluster_task, result(*p))
        algo.fold(client, global_task, result(1.0, 1.0))
    new = algo.aggregate(models)
    torch.testing.assert_close(new[0], torch.tensor([-4.5, 0.0]))
    torch.testing.assert_close(new[1], torch.tensor([5.5, 5.0]))
    assert algo.cluster.tolist() == [0, 0, 1, 1]


def test_reference_profile_sets_the_code_switches_unless_given() -> None:
    config = train_config({"train": {"profile": "reference", "drop_last": False}})
    fedrc = config.algorithm_settings
    assert config.weight_decay == 5e-4 and config.persistent_momentum
    assert not fedrc.heldout_label_prior and (fedrc.adam_beta1, fedrc.adam_beta2) == (0.5, 0.5)
    assert config.drop_last is False  # an explicit key wins over the profile
    assert train_config({}).weight_decay == 0.0


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--algorithm", "fedprox", "--set", "mu=0"], "train.fedprox.mu"),
        (["--algorithm", "fedsoft", "--set", "mu=-1"], "train.fedsoft.mu"),
        (["--algorithm", "fedrc", "--set", "estep=newton"], "train.fedrc.estep"),
        (["--algorithm", "cfl", "--set", "max_clusters=0"], "train.cfl.max_clusters"),
        (["--model", "vgg"], "train.model"),
        (["--set", "prune_threshold=1.5"], "train.fedrc.prune_threshold"),
        (["--set", "estep=1"], "--set fedrc.estep"),
        (["--set", "speed=1"], "--set speed"),
        (["--profile", "authors"], "train.profile"),
    ],
)
def test_cli_rejects_bad_algorithm_options(args: list[str], culprit: str, tmp_path) -> None:
    from typer.testing import CliRunner

    from fedrc_cli.app import app

    out = tmp_path / "run"
    got = CliRunner().invoke(app, ["train", "--out", str(out), *args])
    assert got.exit_code == 2 and culprit in got.output
    assert len(got.output.strip().splitlines()) == 1 and not out.exists()
