"""Update rules on tiny hand-checked cases (Prepare / Execute / Assert)."""

import math

import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.common.errors import FedrcError
from pipeline.engine import LocalResult, LocalTask
from pipeline.run.resolve import make_config


def make(name: str, clients: int = 3, k: int = 2, classes: int = 3, **kw):
    config = make_config(algorithm=name, clusters=k, **kw)
    return build_algorithm(config, clients, classes)


def test_fedem_e_step_matches_hand_computation() -> None:
    algo = make("fedem")
    losses = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
    gamma = algo.e_step(0, losses, torch.tensor([0, 1]))
    # ω = (½, ½): γ_j ∝ exp(−f_j): row 0 → (e⁻¹, e⁻²)/Σ, row 1 → (e⁻³, e⁻¹)/Σ
    g0 = math.exp(-1) / (math.exp(-1) + math.exp(-2))
    g1 = math.exp(-3) / (math.exp(-3) + math.exp(-1))
    torch.testing.assert_close(gamma, torch.tensor([[g0, 1 - g0], [g1, 1 - g1]]))
    torch.testing.assert_close(
        algo.omega[0], torch.tensor([(g0 + g1) / 2, 1 - (g0 + g1) / 2], dtype=torch.float64)
    )
    # the next E-step starts from the new ω: with equal losses, γ = ω
    omega = algo.omega[0].clone()
    gamma2 = algo.e_step(0, torch.zeros(1, 2), torch.tensor([0]))
    torch.testing.assert_close(gamma2[0].double(), omega)


def test_e_step_is_stable_for_huge_losses() -> None:
    algo = make("fedem")
    gamma = algo.e_step(0, torch.tensor([[1000.0, 1001.0]]), torch.tensor([0]))
    assert torch.isfinite(gamma).all()
    assert gamma[0, 0] == pytest.approx(1 / (1 + math.exp(-1)))


def test_fedrc_first_round_is_fedem_then_label_prior_with_lag() -> None:
    rc, em = make("fedrc"), make("fedem")
    losses = torch.tensor([[1.0, 1.5], [0.5, 0.2], [2.0, 0.1]])
    labels = torch.tensor([0, 0, 2])
    gamma = rc.e_step(0, losses, labels)
    torch.testing.assert_close(gamma, em.e_step(0, losses, labels))  # C uniform: no effect
    # label table S_0[k, y] = Σ_{j: y_j = y} γ_jk (raw sums)
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for j, y in enumerate(labels.tolist()):
        expected[:, y] += gamma[j].double()
    torch.testing.assert_close(rc.tables[0], expected)
    # C_{y,k} changes only at end_round (one-round lag): floor, then normalise over y
    assert torch.equal(rc.prior, torch.full((2, 3), 1 / 3, dtype=torch.float64))
    rc.end_round()
    floored = expected.clamp(min=1e-8)
    torch.testing.assert_close(rc.prior, floored / floored.sum(1, keepdim=True))


def test_fedrc_e_step_divides_by_label_prior() -> None:
    rc = make("fedrc")
    rc.prior = torch.tensor([[0.8, 0.1, 0.1], [0.2, 0.4, 0.4]], dtype=torch.float64)
    gamma = rc.e_step(1, torch.tensor([[1.0, 1.0]]), torch.tensor([0]))
    # equal losses and ω: γ ∝ 1 / C_{y,k} = (1/0.8, 1/0.2) → (0.2, 0.8)
    torch.testing.assert_close(gamma, torch.tensor([[0.2, 0.8]]))


def test_fedrc_held_out_switch() -> None:
    rc = make("fedrc", heldout_label_prior=False)
    rc.prior = torch.tensor([[0.8, 0.1, 0.1], [0.2, 0.4, 0.4]], dtype=torch.float64)
    rc.held_out_step(2, torch.tensor([[1.0, 1.0]]), torch.tensor([0]))
    torch.testing.assert_close(rc.omega[2], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert rc.tables[2].sum() == 0  # held-out clients send no label tables


def result(params: list[float]) -> LocalResult:
    return LocalResult(torch.tensor(params), 0.0, None)


def test_aggregation_is_sample_weighted_and_keeps_untrained_models() -> None:
    algo = make("fedem")
    models = torch.tensor([[1.0, 1.0], [5.0, 5.0]])
    algo.begin_round(models)
    algo.fold(0, LocalTask(0, models[0], torch.ones(10), weight=10), result([2.0, 0.0]))
    algo.fold(1, LocalTask(0, models[0], torch.ones(30), weight=30), result([4.0, 3.0]))
    new = algo.aggregate(models)  # nobody trained model 1
    torch.testing.assert_close(new[0], torch.tensor([3.5, 2.25]))  # (10·a + 30·b) / 40
    torch.testing.assert_close(new[1], models[1])


def test_fedavg_single_model_weight_one() -> None:
    algo = make("fedavg", k=3)
    assert algo.num_models == 1
    assert algo.e_step(0, torch.rand(4, 1), torch.zeros(4, dtype=torch.long)).eq(1).all()


def test_fedrc_adam_e_step_hand_computed() -> None:
    """γ^{t−1} = (½, ½), plain E-step γ̃ = (0.8, 0.2): g = (−0.3, 0.3), ν = 0.1 g, a = 0.01 g²,
    step = (ν/0.1) / sqrt(a/0.01) = sign(g) → γ = (½, ½) + (1, −1) → clip → (1, 0)."""
    rc = make("fedrc", estep="adam")
    labels = torch.tensor([0])
    first = rc.e_step(0, torch.zeros(1, 2), labels)  # from γ^0 = 1/K, g = 0: no move
    torch.testing.assert_close(first, torch.tensor([[0.5, 0.5]]))
    losses = torch.tensor([[0.0, math.log(4.0)]])  # with ω = (½, ½): γ̃ = (0.8, 0.2)
    gamma = rc.e_step(0, losses, labels)
    torch.testing.assert_close(gamma, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(rc.omega[0], torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_fedrc_adam_first_e_step_starts_from_uniform_with_zero_moments() -> None:
    """Paper Alg. 1: a client's first Adam E-step starts at γ^0 = 1/K, ν = a = 0. K = 3, plain
    γ̃ = (0.6, 0.3, 0.1): g = 1/3 − γ̃ = (−0.267, 0.033, 0.233); the bias-corrected step is
    sign(g) → γ = 1/3 + (1, −1, −1) → clip → (4/3, 0, 0) → (1, 0, 0). (The plain E-step that the
    first visit used to return would be (0.6, 0.3, 0.1).)"""
    rc = make("fedrc", k=3, estep="adam")
    plain = torch.tensor([[0.6, 0.3, 0.1]])
    losses = -plain.log()  # with ω = 1/K and a uniform label prior: γ̃ ∝ exp(−f) = plain
    gamma = rc.e_step(0, losses, torch.tensor([0]))
    torch.testing.assert_close(gamma, torch.tensor([[1.0, 0.0, 0.0]]))
    g = torch.full((1, 3), 1 / 3) - plain
    torch.testing.assert_close(rc.adam[0]["m"], 0.1 * g)  # (1 − β1) g from ν = 0
    torch.testing.assert_close(rc.adam[0]["v"], 0.01 * g * g)  # (1 − β2) g² from a = 0


def test_fedem_adam_e_step_is_fedrcs_and_hand_computed() -> None:
    """FedEM with `estep: adam`, the Adam E-step FedRC uses. Plain γ̃ = (0.8, 0.2) on a first
    visit from γ^0 = (½, ½) with zero moments: g = (−0.3, 0.3), ν = 0.1 g, a = 0.01 g²,
    step = (ν/0.1) / sqrt(a/0.01) = sign(g) → γ = (½, ½) − (−1, 1) → clip → (1, 0). The default
    `em` keeps γ̃ and no memory."""
    em, adam = make("fedem"), make("fedem", estep="adam")
    losses = torch.tensor([[0.0, math.log(4.0)]])  # with ω = (½, ½): γ̃ = (0.8, 0.2)
    labels = torch.tensor([0])
    torch.testing.assert_close(em.e_step(0, losses, labels), torch.tensor([[0.8, 0.2]]))
    assert em.adam == {}
    gamma = adam.e_step(0, losses, labels)
    torch.testing.assert_close(gamma, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(adam.omega[0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    g = torch.tensor([[-0.3, 0.3]])
    torch.testing.assert_close(adam.adam[0]["m"], 0.1 * g)
    torch.testing.assert_close(adam.adam[0]["v"], 0.01 * g * g)
    rc = make("fedrc", estep="adam")  # a uniform label prior: the same step, the same numbers
    torch.testing.assert_close(rc.e_step(0, losses, labels), gamma)
    resumed = make("fedem", estep="adam")  # the memory is in the checkpointed state
    resumed.load_state_dict(adam.state_dict())
    torch.testing.assert_close(resumed.adam[0]["gamma"], gamma)
    with pytest.raises(FedrcError, match=r"fedem\.estep: expected one of"):
        make("fedem", estep="sgd")


def test_adaptive_k_removes_models_below_delta() -> None:
    rc = make("fedrc", clients=2, k=3, prune_threshold=0.05)
    rc.e_step(0, torch.tensor([[0.0, 0.0, 20.0]] * 3), torch.zeros(3, dtype=torch.long))
    rc.e_step(1, torch.tensor([[0.0, 20.0, 20.0]] * 1), torch.zeros(1, dtype=torch.long))
    rc.end_round()  # mean γ of model 2 ≈ 0 < δ: removed; models 0 and 1 stay
    assert rc.active.tolist() == [True, True, False]
    assert rc.omega[:, 2].eq(0).all()
    torch.testing.assert_close(rc.omega.sum(1), torch.ones(2, dtype=torch.float64))
    tasks = rc.local_tasks(0, torch.ones(3, 3) / 3, torch.zeros(3, 2), torch.zeros(3, 3, 3))
    assert [t.model for t in tasks] == [0, 1]
    gamma = rc.e_step(0, torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    assert gamma[:, 2].eq(0).all()  # log ω = −∞: a removed model gets no responsibility


def test_interchangeable_models_merge_into_the_heavier_one() -> None:
    """Client 0's two samples fit models 0 and 1 alike (losses 0 and 0.1), client 1's sample
    fits only model 2. Model 1 loses 0.1 nat on model 0's samples and gains 0.1 on its own:
    excess max(0.1, −0.1) = 0.1 < 0.5, and model 1 holds less γ, so model 1 goes. Model 2 is
    9 nats worse on their samples and stays."""
    rc = make("fedrc", clients=2, k=3, classes=1, merge_gap=0.5)
    labels = torch.zeros(2, dtype=torch.long)
    gamma = rc.e_step(0, torch.tensor([[0.0, 0.1, 9.0]] * 2), labels)
    rc.e_step(1, torch.tensor([[9.0, 9.0, 0.0]]), labels[:1])
    g0, g1 = gamma[0, 0].item(), gamma[0, 1].item()
    assert g0 > g1 > 0.4  # both models hold client 0's samples
    cross = torch.tensor([[0.0, 0.1, 9.0]], dtype=torch.float64) * 2  # Σ_j γ_jk f_jl, γ_jk ≈ ½
    torch.testing.assert_close(
        rc.cross[0][:2], cross.expand(2, 3) * gamma[0, :2, None], atol=1e-3, rtol=0
    )
    rc.end_round()
    assert rc.active.tolist() == [True, False, True]
    torch.testing.assert_close(
        rc.omega[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), atol=1e-3, rtol=0
    )


def test_no_model_is_removed_before_prune_after() -> None:
    rc = make("fedrc", clients=1, k=3, prune_threshold=0.05, prune_after=2)
    for expected in ([True, True, True], [True, True, False]):
        rc.e_step(0, torch.tensor([[0.0, 0.0, 20.0]] * 2), torch.zeros(2, dtype=torch.long))
        rc.end_round()  # model 2's mean γ ≈ 0 < δ from round 1, removed at round 2
        assert rc.active.tolist() == expected


def test_trhc_trains_only_the_argmax_model_with_unit_weights() -> None:
    rc = make("fedrc", hard_train=True)
    gamma = rc.e_step(0, torch.tensor([[2.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1]))
    (task,) = rc.local_tasks(0, gamma, torch.zeros(2, 2), torch.zeros(2, 2, 3))
    assert task.model == 1 and task.weights.eq(1).all()


def test_label_table_noise_is_seeded_gaussian() -> None:
    clean, noisy = make("fedrc"), make("fedrc", table_noise=25.0)
    again = make("fedrc", table_noise=25.0)
    for algo in (clean, noisy, again):
        algo.e_step(0, torch.zeros(4, 2), torch.tensor([0, 1, 1, 2]))
    diff = noisy.tables[0] - clean.tables[0]
    assert diff.abs().min() > 0 and diff.std() > 5  # ξ = 25 swamps the counts
    torch.testing.assert_close(noisy.tables, again.tables)


def test_shared_body_averages_bodies_by_gamma_mass_and_keeps_heads_apart() -> None:
    rc = make("fedrc", shared_body=True)
    rc.head = (2, 3)  # flat model: [body, body, head]
    models = torch.zeros(2, 3)
    rc.begin_round(models)
    gamma = torch.tensor([[0.75, 0.25]] * 4)  # γ-mass 3 for model 0, 1 for model 1
    tasks = rc.local_tasks(0, gamma, models, torch.zeros(2, 4, 3))
    rc.fold(0, tasks[0], LocalResult(torch.tensor([4.0, 0.0, 1.0]), 0.0, None))
    rc.fold(0, tasks[1], LocalResult(torch.tensor([0.0, 8.0, 2.0]), 0.0, None))
    new = rc.aggregate(models)
    body = torch.tensor([(3 * 4.0 + 0.0) / 4, (0.0 + 1 * 8.0) / 4])
    torch.testing.assert_close(
        new,
        torch.stack(
            [torch.cat([body, torch.tensor([1.0])]), torch.cat([body, torch.tensor([2.0])])]
        ),
    )


def test_head_range_is_the_final_layer() -> None:
    from pipeline.models import build_model
    from pipeline.models.layout import head_range

    model = build_model((28, 28, 1), 10)
    total = sum(p.numel() for p in model.parameters())
    assert head_range(model) == (total - 2048 * 10 - 10, total)
