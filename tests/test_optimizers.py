"""The server optimizers (FedAdam, FedYogi, FedAdagrad: Reddi et al., ICLR 2021), the local
learning-rate schedules, Adaptive-FedAvg's rate and Flash's server step: each rule on hand-made
numbers, then what it does in a run that its neighbours do not."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from pipeline.algorithms import BUILT_IN, build_algorithm
from pipeline.algorithms.server_opt import ServerOptimizer
from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.data.shards import load_federated
from pipeline.run.files import METRICS, MODEL, load_state, read_metrics
from pipeline.run.resolve import make_config, resumed
from pipeline.run.schedule import scheduled_lr
from pipeline.run.setup import initial_models, make_executor
from pipeline.stages import run_config, train_stage

ALGORITHMS = tuple(BUILT_IN)
TINY = dict(rounds=3, local_epochs=2, batch_size=16, lr=0.05, clusters=2, device="cpu")


def run(data: Path, out: Path, **values) -> Path:
    return train_stage(make_config(data=str(data), out=str(out), **{**TINY, **values}))


# --- the server optimizers, by hand --------------------------------------------------------
@pytest.mark.parametrize(
    "kind, second",  # v after Δ = 2 from v = τ² = 1, β2 = 0.5
    [("adam", 0.5 * 1 + 0.5 * 4), ("yogi", 1 + 0.5 * 4), ("adagrad", 1 + 4)],
)
def test_fedopt_step_by_hand(kind: str, second: float) -> None:
    """One coordinate, θ = 0, Δ = 2, β1 = β2 = 0.5, τ = 1 (v starts at τ² = 1), η = 0.1:
    m = 0.5 · 2 = 1 (Algorithm 2, line 10); v by lines 11–13; θ = 0.1 · 1 / (√v + 1)."""
    config = make_config(server_opt=kind, server_lr=0.1, server_beta1=0.5, server_beta2=0.5,
                         server_tau=1.0)  # fmt: skip
    opt = ServerOptimizer(config)
    models = torch.zeros(1, 1, dtype=torch.float64)
    rows = torch.tensor([True])
    new, state = opt.step(models, torch.full((1, 1), 2.0, dtype=torch.float64), rows, None)
    assert float(state["m"]) == 1.0 and float(state["v"]) == second
    assert float(new) == pytest.approx(0.1 / (math.sqrt(second) + 1))
    # a second round at the stepped model, Δ = −1: m = 0.5 − 0.5 = 0, the model stays
    models = new.clone().reshape(1, 1)
    again, state = opt.step(models, -torch.ones(1, 1, dtype=torch.float64), rows, state)
    assert float(state["m"]) == 0.0 and float(again) == float(new)


def test_sgd_is_the_server_learning_rate_and_keeps_no_state() -> None:
    opt = ServerOptimizer(make_config(server_lr=0.5))
    models, delta = torch.ones(2, 3), torch.full((1, 3), 4.0)  # one Δ per stepped row
    new, state = opt.step(models, delta, torch.tensor([True, False]), None)
    assert torch.equal(new, torch.full((1, 3), 3.0)) and state is None


def test_a_row_changed_outside_the_step_starts_over() -> None:
    """Row 1 is overwritten between two steps (a method copied a model into it): its moments
    start again from m = 0, v = τ², while row 0 keeps its own."""
    opt = ServerOptimizer(make_config(server_opt="adam", server_lr=0.1))
    models, rows = torch.zeros(2, 2), torch.tensor([True, True])
    models, state = opt.step(models, torch.ones(2, 2), rows, None)
    kept = state["m"][0].clone()
    models = models.clone()
    models[1] = 5.0  # e.g. FedDrift's copy of a model into a free row
    _, state = opt.step(models, torch.ones(2, 2), rows, state)
    assert torch.allclose(state["m"][0], 0.9 * kept + 0.1)
    assert torch.allclose(state["m"][1], torch.full((2,), 0.1))  # 0.9 · 0 + 0.1 · 1


def test_fedadam_moves_every_coordinate_by_about_eta(tiny_data: Path, tmp_path: Path) -> None:
    """What FedAdam does that FedAvg does not: after one round every coordinate that moved
    moves by η (1 − β1) |Δ| / (√((1 − β2) Δ² + β2 τ²) + τ) ≤ η (1 − β1) / √(1 − β2) = η,
    whatever the size of its Δ; FedAvg moves it by Δ itself."""
    sgd = run(tiny_data, tmp_path / "sgd", algorithm="fedavg", rounds=1)
    adam = run(tiny_data, tmp_path / "adam", algorithm="fedavg", rounds=1, server_opt="adam",
               server_lr=0.01)  # fmt: skip
    start = initial(tiny_data)
    delta = load_state(sgd / MODEL)["models"][0] - start  # FedAvg's average − θ
    step = load_state(adam / MODEL)["models"][0] - start
    tau = 1e-3
    expected = 0.01 * 0.1 * delta / ((0.01 * delta**2 + 0.99 * tau**2).sqrt() + tau)
    torch.testing.assert_close(step, expected, atol=1e-6, rtol=1e-4)
    moved = delta.abs() > 1e-2  # ≥ 10 τ: from 0.4 η (|Δ| = 10 τ) to η (|Δ| ≫ τ)
    sizes, steps = delta[moved].abs(), step[moved].abs()
    assert float(steps.min()) > 0.004 and float(steps.max()) <= 0.01
    spread = float(sizes.max() / sizes.min())  # FedAvg's steps differ by this factor
    assert spread > 2 * float(steps.max() / steps.min())


def initial(data: Path) -> torch.Tensor:
    """The run's initial global model (seed 0)."""
    config, federated = make_config(data=str(data), algorithm="fedavg"), load_federated(data)
    return initial_models(make_executor(config, federated, torch.device("cpu")), federated,
                          config, 1)[0]  # fmt: skip


@pytest.mark.parametrize("algorithm", ["fedavg", "ifca", "cfl"])
def test_server_moments_survive_a_resume(algorithm: str, tiny_data: Path, tmp_path: Path) -> None:
    """Per model row, in the checkpoint: 2 rounds then a resume to 3 equal 3 rounds."""
    values = dict(algorithm=algorithm, server_opt="yogi", server_lr=0.01, participation=0.5)
    if algorithm == "cfl":
        values.update(cfl_eps1=10.0, cfl_eps2=0.01)  # splits: a new row's moments start over
    full = run(tiny_data, tmp_path / "full", **values)
    half = run(tiny_data, tmp_path / "half", **{**values, "rounds": 2})
    train_stage(make_config(data=str(tiny_data), out=str(half), **{**TINY, **values}), resume=True)
    rows = [read_metrics(r / METRICS) for r in (full, half)]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
    assert rows[0] == rows[1]
    state = load_state(full / MODEL)["algorithm"]["server_opt"]
    models = load_state(full / MODEL)["models"]
    assert state["m"].shape == state["v"].shape == models.shape
    assert torch.equal(state["last"], models)


GOLDEN_SETTINGS = {  # as tests/test_golden.py: settings that reach each method's every rule
    "cfl": {"cfl_eps1": 10.0, "cfl_eps2": 0.01},
    "ifca-cam": {"warmup_rounds": 1},
    "fesem-cam": {"warmup_rounds": 1},
    "flux": {"cluster_round": 2},
    "fedccfa": {"align_after": 1},
}


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "flash"])
def test_every_averaging_method_takes_a_server_optimizer(
    algorithm: str, tiny_data: Path, tmp_path: Path
) -> None:
    """FedYogi on every built-in (Flash has its own server step): two rounds run to finite
    numbers, with a moment per coordinate of every model row in model.pt."""
    values = dict(algorithm=algorithm, rounds=2, local_epochs=1, server_opt="yogi",
                  server_lr=0.01, **GOLDEN_SETTINGS.get(algorithm, {}))  # fmt: skip
    out = run(tiny_data, tmp_path, **values)
    state = load_state(out / MODEL)
    moments = state["algorithm"]["server_opt"]
    assert moments["m"].shape == moments["v"].shape == state["models"].shape
    assert bool(torch.isfinite(state["models"]).all())
    assert all(math.isfinite(r["train_loss"]) for r in read_metrics(out / METRICS))


def test_an_adaptive_server_at_eta_one_warns(tiny_data: Path, tmp_path: Path) -> None:
    with pytest.warns(FedrcWarning, match="server_lr"):
        run(tiny_data, tmp_path, algorithm="fedavg", rounds=1, server_opt="adam")


# --- the local learning rate over rounds ---------------------------------------------------
def torch_rates(kind: str, rounds: int, **kw) -> list[float]:
    """torch's scheduler stepped once a round: the lr of rounds 1..rounds."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    if kind == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=kw["step"], gamma=kw["gamma"])
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=kw["T"], eta_min=kw["low"])
    rates = []
    for _ in range(rounds):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_schedules_are_torchs() -> None:
    step = make_config(lr=0.1, lr_schedule="step", lr_step_rounds=3, lr_gamma=0.5)
    got = [scheduled_lr(step, r) for r in range(1, 11)]
    assert got == pytest.approx(torch_rates("step", 10, step=3, gamma=0.5), rel=1e-12)
    cosine = make_config(lr=0.1, lr_schedule="cosine", lr_min=0.01, rounds=8)
    assert cosine.lr_period == 8  # fixed from the rounds when the run starts
    got = [scheduled_lr(cosine, r) for r in range(1, 9)]
    assert got == pytest.approx(torch_rates("cosine", 8, T=8, low=0.01), rel=1e-9)
    assert scheduled_lr(cosine, 20) == pytest.approx(0.01)  # after the period: lr_min
    assert scheduled_lr(make_config(lr=0.1), 7) == 0.1


def test_a_cosine_run_resumed_with_more_rounds_keeps_its_period(
    tiny_data: Path, tmp_path: Path
) -> None:
    """The period is the first run's rounds, recorded in config.json: a run extended to more
    rounds keeps the rates it had planned and goes on at lr_min."""
    out = run(tiny_data, tmp_path, algorithm="fedavg", rounds=2, lr_schedule="cosine",
              lr_min=0.005)  # fmt: skip
    config = resumed(run_config(out, "--out"), {"rounds": 4}, [], str(out))
    assert (config.rounds, config.lr_period) == (4, 2)
    train_stage(config, resume=True)
    rows = read_metrics(out / METRICS)
    assert [r["lr"] for r in rows] == pytest.approx([0.05, 0.0275, 0.005, 0.005])


def test_schedule_and_optimizer_options_are_checked() -> None:
    for bad, match in (
        (dict(optimizer="rmsprop"), "train.optimizer"),
        (dict(server_opt="adamw"), "train.server_opt"),
        (dict(lr_schedule="linear"), "train.lr_schedule"),
        (dict(lr_min=0.5, lr=0.1), "train.lr_min"),
        (dict(server_beta2=1.0), "train.server_beta2"),
        (dict(optimizer="adam", persistent_momentum=True), "persistent_momentum"),
    ):
        with pytest.raises(FedrcError, match=match):
            make_config(**bad)
    with pytest.raises(FedrcError, match=r"^train\.optimizer: fedccfa trains in stages"):
        build_algorithm(make_config(algorithm="fedccfa", optimizer="adam"), 4, 10, (0, 44))


# --- Adaptive-FedAvg ------------------------------------------------------------------------
def test_adaptive_fedavg_rate_by_hand() -> None:
    """β1 = β2 = β3 = 0.5, θ_1 = (1, 3), θ_2 = (2, 2):
    t = 1: μ̂_0 = 0, σ² = 0.5 · mean(1, 9) = 2.5, σ̂² = 5, ratio 1 → ρ̂ = 1: η_2 = η;
    t = 2: μ̂_1 = (1, 3), spread mean(1, 1) = 1, σ² = 1.75, σ̂² = 7/3, ratio 7/15,
    ρ = 0.25 + 7/30, ρ̂ = ρ / 0.75 = 29/45: η_3 = η · 29/90."""
    config = make_config(algorithm="adaptive-fedavg", beta1=0.5, beta2=0.5, beta3=0.5)
    algorithm = build_algorithm(config, 4, 10)
    assert algorithm.local_lr(0.1) == 0.1
    algorithm.track(torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert algorithm.gain == pytest.approx(1.0) and algorithm.local_lr(0.1) == pytest.approx(0.1)
    algorithm.track(torch.tensor([2.0, 2.0], dtype=torch.float64))
    assert algorithm.variance == pytest.approx(1.75)
    assert algorithm.gain == pytest.approx(29 / 45)
    assert algorithm.local_lr(0.1) == pytest.approx(0.1 * 29 / 90)


def test_adaptive_fedavg_raises_its_rate_after_a_drift() -> None:
    """What it does that FedAvg does not: a model that settles makes the rate decay as η / t;
    a jump of the model (a drift) raises the variance ratio, and with it the rate."""
    algorithm = build_algorithm(make_config(algorithm="adaptive-fedavg"), 4, 10)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(100, generator=gen, dtype=torch.float64)
    rates = []
    for t in range(1, 13):
        step = 0.5**t if t != 9 else 5.0  # settling, then one jump at round 9
        theta = theta + step * torch.randn(100, generator=gen, dtype=torch.float64)
        algorithm.track(theta)
        rates.append(algorithm.local_lr(0.1))
    assert all(b < a for a, b in itertools.pairwise(rates[1:8]))  # decaying while it settles
    assert rates[8] > 3 * rates[7]  # the jump: the rate climbs back


def test_adaptive_fedavg_logs_its_rate(tiny_data: Path, tmp_path: Path) -> None:
    rows = read_metrics(run(tiny_data, tmp_path, algorithm="adaptive-fedavg") / METRICS)
    assert rows[0]["lr"] == rows[1]["lr"] == 0.05 and rows[2]["lr"] < 0.05
    assert all(r["lr_gain"] > 0 for r in rows)


# --- Flash ---------------------------------------------------------------------------------
def test_flash_server_step_by_hand() -> None:
    """One coordinate, θ = 0, Δ = 1, β1 = β2 = 0.5, τ = 0.5 (v starts at 0.25), η = 1:
    m = 0.5, v = 0.625, β3 = 0.25 / (|1 − 0.625| + 0.25) = 0.4, d = 0.6 · 0.375 = 0.225,
    θ = 0.5 / (√0.625 − 0.225 + 0.5)."""
    config = make_config(algorithm="flash", eta=1.0, beta1=0.5, beta2=0.5, tau=0.5)
    flash = build_algorithm(config, 4, 10)
    models = torch.zeros(1, 1, dtype=torch.float64)
    new = flash.server_step(models, torch.ones(1, 1, dtype=torch.float64), torch.tensor([True]))
    assert float(flash.moments["d"]) == pytest.approx(0.225)
    assert float(new) == pytest.approx(0.5 / (math.sqrt(0.625) - 0.225 + 0.5))


def flash_after(jump: float) -> tuple[float, float]:
    """Flash's step and FedAdam's (the same m and v, no d) after 20 rounds of Δ = 0.01 and
    one round of Δ = `jump`, at the defaults (η = 0.01, τ = 1e-3)."""
    flash = build_algorithm(make_config(algorithm="flash"), 4, 10)
    models, rows = torch.zeros(1, 1), torch.tensor([True])
    for _ in range(20):
        flash.server_step(models, torch.full((1, 1), 0.01), rows)  # settled updates
    step = float(flash.server_step(models, torch.full((1, 1), jump), rows))
    m, v = (float(flash.moments[k]) for k in ("m", "v"))
    return step, 0.01 * m / (math.sqrt(v) + 1e-3)


def test_flash_steps_further_after_a_drift() -> None:
    """What Flash adds to FedAdam: a pseudo-gradient that jumps above its running second
    moment makes d > 0 and the step larger than FedAdam's at the same m and v (Δ from 0.01
    to 0.05: 0.0249 against 0.0169; to 0.1: 0.088 against 0.015)."""
    for jump in (0.05, 0.1):
        flash, adam = flash_after(jump)
        assert flash > 1.4 * adam > 0


def test_flash_step_turns_back_past_its_pole() -> None:
    """The rule as FL4Health and FedCCFA write it: when d outgrows √v + τ (a jump from 0.01 to
    0.5) the denominator is negative and the step points against the update
    (docs/authors-check.md)."""
    flash, adam = flash_after(0.5)
    assert flash < 0 < adam


def test_flash_clients_stop_early(tiny_data: Path, tmp_path: Path) -> None:
    """A γ no loss gain reaches: every client stops after its second epoch, so 4 epochs at that
    γ are 2 epochs (the same batches, the same models); γ = 0 trains all 4."""
    values = dict(algorithm="flash", rounds=1)
    stop = run(tiny_data, tmp_path / "stop", **values, local_epochs=4, gamma=1e6)
    two = run(tiny_data, tmp_path / "two", **values, local_epochs=2)
    four = run(tiny_data, tmp_path / "four", **values, local_epochs=4, gamma=0.0)
    models = [load_state(r / MODEL)["models"] for r in (stop, two, four)]
    assert torch.equal(models[0], models[1]) and not torch.equal(models[0], models[2])


def test_flash_refuses_another_server_optimizer() -> None:
    with pytest.raises(FedrcError, match="flash has its own server step"):
        build_algorithm(make_config(algorithm="flash", server_opt="adam"), 4, 10)
