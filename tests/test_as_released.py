"""The baselines as their authors released them: each divergence from the paper that changes the
results is a setting, off by default, checked here on a hand-made case against the correct rule
(docs/reproducing.md, "The baselines as released")."""

from __future__ import annotations

import io

import numpy as np
import torch
from rich.console import Console
from test_baselines import make, run_round
from test_cflgp import make as make_cflgp
from test_cflgp import run_round as cflgp_round
from test_fedccfa import fake_round
from test_fedccfa import make as make_fedccfa
from test_stocfl import make as make_stocfl
from typer.testing import CliRunner

from fedrc_cli.app import app
from fedrc_cli.catalog import find, settings_table
from pipeline.algorithms import ALGORITHMS, build_algorithm, cflgp
from pipeline.algorithms.pacfl import subspace_bases
from pipeline.run.resolve import make_config, train_config


def label(name: str, **settings) -> str:
    config = make_config(algorithm=name, **settings)
    return ALGORITHMS.get(name).label(config.algorithm_settings)


def test_ifca_zeroes_a_model_nobody_chose_only_as_released() -> None:
    """Both clients choose model 1 (lowest loss); model 0 and 2 have no member this round."""
    models = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    low1 = [torch.tensor([[1.0, 0.0, 1.0]] * n) for n in (2, 6)]
    trained = {0: (2, [1.0, 1.0]), 1: (6, [3.0, 3.0])}  # (2·1 + 6·3) / 8 = 2.5
    kept = run_round(make("ifca", k=3), models, trained, low1)
    torch.testing.assert_close(kept, torch.tensor([[1.0, 1.0], [2.5, 2.5], [3.0, 3.0]]))
    zeroed = run_round(make("ifca", k=3, zero_empty=True), models, trained, low1)
    torch.testing.assert_close(zeroed, torch.tensor([[0.0, 0.0], [2.5, 2.5], [0.0, 0.0]]))


def test_fesem_movers_count_untrained_and_empty_clusters_are_zeroed_as_released() -> None:
    """Clients 0 and 1 start in cluster 0, client 2 in cluster 1 (lowest loss). Client 1's
    trained model (9, 8) lies nearest centre 1: it moves. Correct: cluster 1 = mean of (12, 12)
    and (9, 8) = (10.5, 10); as released the mover adds centre 1 as it received it, (10, 10):
    (11, 11). Client 0 stays: cluster 0 = (1, 1) either way."""
    models = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    on0, on1 = torch.tensor([[0.0, 1.0]] * 4), torch.tensor([[1.0, 0.0]] * 4)
    losses = {0: on0, 1: on0, 2: on1}
    trained = {0: (4, [1.0, 1.0]), 1: (4, [9.0, 8.0]), 2: (4, [12.0, 12.0])}
    correct = run_round(make("fesem"), models, trained, losses)
    torch.testing.assert_close(correct, torch.tensor([[1.0, 1.0], [10.5, 10.0]]))
    movers = make("fesem", untrained_movers=True)
    released = run_round(movers, models, trained, losses)
    torch.testing.assert_close(released, torch.tensor([[1.0, 1.0], [11.0, 11.0]]))
    assert movers.cluster[:3].tolist() == [0, 1, 1]  # the move itself is the same
    # every trained model lands nearest centre 0: cluster 1 keeps its model, or is zeroed
    near0 = {0: (4, [1.0, 1.0]), 1: (4, [2.0, 2.0]), 2: (4, [3.0, 3.0])}
    kept = run_round(make("fesem"), models, near0, losses)
    torch.testing.assert_close(kept[1], models[1])
    zeroed = run_round(make("fesem", zero_empty=True), models, near0, losses)
    torch.testing.assert_close(zeroed, torch.tensor([[2.0, 2.0], [0.0, 0.0]]))


def test_fedsoft_counts_the_worst_fit_and_scores_held_out_clients_with_model_0() -> None:
    """Per-sample losses: samples 0, 1 fit model 0 best and model 1 worst; sample 2 the other
    way round. Correct u = (2/3, 1/3); as released (largest loss) u = (1/3, 2/3)."""
    losses = torch.tensor([[0.1, 2.0], [0.2, 3.0], [5.0, 0.1]])
    labels = torch.zeros(3, dtype=torch.long)
    for settings, u in (({}, [2 / 3, 1 / 3]), ({"largest_loss": True}, [1 / 3, 2 / 3])):
        algo = make("fedsoft", **settings)
        algo.e_step(0, losses, labels)
        torch.testing.assert_close(algo.omega[0], torch.tensor(u, dtype=torch.float64))
    held_out = torch.tensor([[3.0, 0.5]] * 4)  # model 1 fits the held-out client better
    correct = make("fedsoft").assign_held_out(3, held_out, labels[:1].repeat(4))
    released = make("fedsoft", held_out_model0=True).assign_held_out(3, held_out, labels)
    assert correct.tolist() == [0.0, 1.0] and released.tolist() == [1.0, 0.0]


def test_cfl_max_norm_over_the_wrong_axis_as_released() -> None:
    """Four clients in two opposite directions, 16 entries of ±0.5 each: the mean update is 0,
    ‖Δ_i‖ = 2 > ε2 = 1.6, so CFL splits; as released the max is the largest |entry|, 0.5, under
    the port's ε2 = 0.6: no split. Entries of ±0.7 split it there too."""
    models = torch.zeros(3, 16)

    def clusters_after(entry: float, **settings) -> int:
        algo = make("cfl", clients=5, k=3, **settings)
        ups = {i: (10, [entry * (1 if i < 2 else -1)] * 16) for i in range(4)}
        run_round(algo, models, ups)
        return algo.clusters

    assert clusters_after(0.5) == 2
    assert clusters_after(0.5, max_entry=True, cfl_eps2=0.6) == 1
    assert clusters_after(0.7, max_entry=True, cfl_eps2=0.6) == 2


def test_pacfl_keeps_the_svds_signs_as_released() -> None:
    """A class of one sample: its basis vector is ±x/‖x‖, the sign LAPACK's to choose. fedrc
    makes the largest entry positive; as released the SVD's own vector is kept."""
    images = torch.tensor([[3.0, 0.0, 4.0, 0.0], [1.0, 2.0, 0.0, 2.0], [2.0, 1.0, 0.0, 2.0]])
    labels = torch.tensor([0, 1, 1])
    signed = subspace_bases(images.reshape(3, 1, 1, 4), labels, 2, 1)
    raw = subspace_bases(images.reshape(3, 1, 1, 4), labels, 2, 1, signed=False)
    for c, rows in ((0, [0]), (1, [1, 2])):
        u = torch.linalg.svd(images[rows].double().T, full_matrices=False).U[:, :1]
        torch.testing.assert_close(raw[c], u)
        torch.testing.assert_close(signed[c], u * u[u.abs().argmax()].sign())
    torch.testing.assert_close(signed[0, :, 0], torch.tensor([0.6, 0.0, 0.8, 0.0]).double())
    algo = build_algorithm(make_config(algorithm="pacfl", n_basis=1, lapack_signs=True), 2, 2)
    described = algo.describe(0, images.reshape(3, 1, 1, 4), labels, torch.zeros(1, 1))
    torch.testing.assert_close(described, raw.flatten())


def test_cflgp_profiles_the_clients_own_model_in_block_0_as_released() -> None:
    """K = 2, round t = 2 is a clustering round whose criterion is model 1: the paper's rule has
    client 0 (on model 0) train model 1 too and fills block 1; as released no extra training
    runs, and block 0 gets each client's own update, whichever its model."""
    trained = {0: (10, {0: [3.0, 1.0], 1: [4.0, 7.0]}), 3: (10, {1: [5.0, 9.0]})}
    models = torch.tensor([[2.0, 1.0], [5.0, 7.0]])
    for released, blocks in ((False, ([0, 0, -1, 0], [0, 0, 0, 2])), (True, ([1, 0], [0, 2]))):
        algo = make_cflgp(own_model_profile=released)
        algo.cluster[3], algo.round = 1, 2
        algo.omega[3] = torch.tensor([0.0, 1.0], dtype=torch.float64)
        algo.profile = {0: torch.zeros(4), 3: torch.zeros(4)}  # profiled before: not −1
        _, tasks, _ = cflgp_round(algo, models, trained)
        assert [t.model for t in tasks[0]] == ([0] if released else [0, 1])
        zero, three = (algo.profile[i][: 2 if released else 4] for i in (0, 3))
        torch.testing.assert_close(zero, torch.tensor(blocks[0], dtype=torch.float32))
        torch.testing.assert_close(three, torch.tensor(blocks[1], dtype=torch.float32))


def test_cflgp_runs_one_kmeans_start_as_released(monkeypatch) -> None:
    calls = []
    lloyd = cflgp.lloyd
    monkeypatch.setattr(cflgp, "lloyd", lambda p, c: calls.append(1) or lloyd(p, c))
    points = torch.randn(8, 2, generator=torch.Generator().manual_seed(0)).numpy()
    rng = np.random.default_rng(0)
    cflgp.kmeans(points, 2, rng)
    cflgp.kmeans(points, 2, rng, make_cflgp(kmeans_starts=1).settings.kmeans_starts)
    assert len(calls) == 11  # the default's 10 starts, then the release's one


def test_stocfl_merge_keeps_only_the_larger_clusters_model_as_released() -> None:
    """Cluster 0 (3 members) has no model, cluster 3 (1 member) holds row 0. fedrc keeps row 0
    for the union; as released the larger's (none) is kept, row 0 is freed and the union gets a
    fresh copy of θ_g the next time it trains."""
    for released, row in ((False, 0), (True, -1)):
        algo = make_stocfl(clients=4, larger_model_only=released)
        algo.cluster = torch.tensor([0, 0, 0, 3])
        algo.row = torch.tensor([-1, -1, -1, 0])
        algo.unite(3, 0)
        assert algo.cluster.tolist() == [0] * 4 and int(algo.row[0]) == row
        assert algo.held_rows() == ([] if released else [0])


def test_fedccfa_first_holder_enters_with_the_sum_of_prototypes_as_released() -> None:
    """Three clients whose rows agree: one group per label. Label 0's prototypes (1, 1), (3, 3),
    (5, 5): the group mean is (3, 3); as released client 0's own tensor holds the sum (9, 9)
    when the group averages: (9 + 3 + 5)/3 = 17/3. Label 1: client 0 alone has it, so the sum
    over its holders is its own (2, 2) either way. The global prototype is the plain mean."""
    labels = {0: [0, 1], 1: [0, 0], 2: [0, 0]}
    balanced = {c: [1.0, 0.0, 0.0, 1.0, 0.0, 0.0] for c in labels}
    trained = {c: [0.0] * 6 for c in labels}
    protos = {c: [[2 * c + 1.0] * 2, [2.0 * (c == 0)] * 2] for c in labels}
    for released, mean in ((False, 3.0), (True, 17 / 3)):
        algo = make_fedccfa(clients=3, aliased_protos=released)
        fake_round(algo, labels, balanced, trained, protos)
        assert algo.grouping == {0: [[0, 1, 2]], 1: [[0, 1, 2]]}
        torch.testing.assert_close(algo.anchors[:, 0], torch.full((3, 2), mean))
        torch.testing.assert_close(algo.anchors[:, 1], torch.full((3, 2), 2.0))
        torch.testing.assert_close(algo.global_protos[0], torch.tensor([3.0, 3.0]))


def test_the_released_profile_is_the_reference_sgd_with_the_ports_switches() -> None:
    config = train_config({"train": {"algorithm": "fesem", "profile": "released"}})
    assert (config.weight_decay, config.drop_last, config.persistent_momentum) == (5e-4, 1, 1)
    assert config.algorithm_settings.zero_empty and config.algorithm_settings.untrained_movers
    cfl = train_config({"train": {"algorithm": "cfl", "profile": "released"}})
    assert cfl.algorithm_settings.max_entry and cfl.algorithm_settings.cfl_eps2 == 0.6
    own = train_config(
        {"train": {"algorithm": "ifca", "profile": "released"}}, sets=["zero_empty=false"]
    )
    assert not own.algorithm_settings.zero_empty  # --set still wins
    fedrc = train_config({"train": {"algorithm": "fedrc", "profile": "released"}})
    assert not fedrc.algorithm_settings.heldout_label_prior  # the code's, as under reference
    stocfl = train_config({"train": {"algorithm": "stocfl", "profile": "released"}})
    assert not stocfl.algorithm_settings.larger_model_only  # not the FedRC authors' port


def test_labels_name_the_released_variant() -> None:
    assert label("ifca") == "IFCA" and label("ifca", zero_empty=True) == "IFCA (as released)"
    assert label("fedsoft", largest_loss=True) == "FedSoft (as released: largest_loss)"
    both = {"max_entry": True, "cfl_eps2": 0.6}
    assert label("cfl", max_clusters=3, **both) == "CFL(3) (as released)"
    assert label("cfl", cfl_eps2=0.6) == "CFL (as released: cfl_eps2)"
    assert label("cfl-gp", kmeans_starts=1) == "CFL-GP (as released: kmeans_starts)"


def info(name: str) -> str:
    """`fedrc info NAME`'s output, 200 columns wide."""
    screen = Console(width=200, file=io.StringIO())
    screen.print(settings_table(name, *find(name)))
    return screen.file.getvalue()


def test_info_says_what_each_released_setting_changes() -> None:
    out = info("fesem")
    assert "untrained_movers" in out and "as released: a client that moves adds its new" in out
    assert "--profile released (with the reference local SGD), or --set zero_empty=true" in out
    assert "as the authors released it: --set lapack_signs=true" in info("pacfl")
    assert CliRunner().invoke(app, ["info", "fesem"]).exit_code == 0
