"""The `train:`, `eval:` and `plot:` sections of params.yaml, one typed dataclass each,
validated where it is defined (`partition:` is the data's: `pipeline.data.partition_config`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.common.errors import FedrcError
from pipeline.common.settings import SEED_MAX, SEEDS, option
from pipeline.common.settings import require as _require

DEVICES = ("auto", "cpu", "cuda")
EXECUTORS = ("auto", "batched", "sequential")  # auto: sequential on a CPU, batched on CUDA
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("sgd", "adam", "adamw")  # the local optimizer (torch.optim's rules)
SCHEDULES = ("constant", "step", "cosine")  # the local learning rate over rounds
SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")  # FedOpt (Reddi et al., ICLR 2021)
# Where the authors' code departs from the paper (protocol §1): `profile: reference` turns these on
# (and an algorithm's `Settings.profiles` its own); keys given explicitly still win. `released`
# is the same local SGD, plus each baseline's divergences of the FedRC authors' released code
# from its paper (their `released` profile: docs/reproducing.md, "The baselines as released").
REFERENCE_SGD = {"weight_decay": 5e-4, "drop_last": True, "persistent_momentum": True}
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {},
    "reference": REFERENCE_SGD,
    "released": REFERENCE_SGD,
}


# Options that do not change the numbers: a resumed run may change them (`resolve.resumed`), and
# a checkpoint's identity leaves them out (`TrainConfig.identity`).
RESUMABLE = (
    "rounds",
    "data",
    "out",
    "device",
    "executor",
    "chunk_clients",
    "compile",
    "checkpoint_every",
    "log",
)
TRACKERS = ("tensorboard", "wandb", "mlflow")  # `--log`: pipeline.run.trackers
FIGURE_FORMATS = ("png", "pdf", "svg")  # `fedrc plot --format`, `fedrc report --format`


@dataclass(frozen=True)
class TrainConfig:
    """How `fedrc train` runs federated training (FedRC paper, Algorithm 1 and appendix H).

    What every algorithm shares; an algorithm's or a model's own options are its `Settings`
    (`settings`, keyed by the algorithm's and the model's name; `pipeline.run.resolve` fills it).
    The fields come in sections (`GROUPS`, the panels of `fedrc train --help`), in that order;
    to a user they stay one flat set of keys: params.yaml's `train:`, the options, config.json.
    """

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Run": ("data", "algorithm", "clusters", "model", "profile", "seed", "out"),
        "Rounds": ("rounds", "rounds_per_step", "participation"),
        "Server optimizer": (
            "server_lr",
            "server_opt",
            "server_beta1",
            "server_beta2",
            "server_tau",
        ),
        "Local SGD": (
            "local_epochs",
            "batch_size",
            "lr",
            "momentum",
            "weight_decay",
            "drop_last",
            "persistent_momentum",
            "skip_below",
        ),
        "Local optimizer and schedule": (
            "optimizer",
            "local_beta1",
            "local_beta2",
            "local_eps",
            "lr_schedule",
            "lr_step_rounds",
            "lr_gamma",
            "lr_min",
            "lr_period",
        ),
        "Evaluation and checkpoints": ("eval_every", "checkpoint_every", "log"),
        "Execution": ("device", "executor", "chunk_clients", "precision", "compile"),
    }

    # Run
    data: str = option("data/federated", "Folder written by `fedrc partition`.", path=True)
    algorithm: str = option("fedrc", "Built-in (`fedrc info`), a plugin, or module:Name.")
    clusters: int = option(3, "K, the number of models.")
    model: str = option("cnn", "cnn, mobilenet_v2, resnet18, a plugin, or module:Name.")
    profile: str = option(
        "paper",
        "paper; reference: the authors' code's settings; released: also the baselines' "
        "divergences in that code (IFCA's zeroed models, …).",
    )
    seed: int = option(0, "Seed for models, sampling and batches.")
    out: str = option("runs/fedrc", "Run folder.", path=True)

    # Rounds
    rounds: int = option(200, "Communication rounds.")
    rounds_per_step: int | None = option(
        None,
        "Drifting benchmarks: rounds at each time step (none: rounds / T; the last step takes "
        "the rest).",
    )
    participation: float = option(1.0, "Share of participating clients sampled each round.")

    # Server optimizer
    server_lr: float = option(
        1.0,
        "Server learning rate η_g: θ ← θ + η_g (average − θ); with adam, yogi or adagrad, "
        "the η of FedOpt's step (the paper tunes it, e.g. 0.01).",
    )
    server_opt: str = option(
        "sgd",
        "sgd (the step above), or FedOpt's adam, yogi, adagrad on the pseudo-gradient "
        "average − θ of every averaged model (Reddi et al., ICLR 2021, Algorithm 2).",
    )
    server_beta1: float = option(0.9, "FedOpt: β1, the decay of the server's momentum m.")
    server_beta2: float = option(
        0.99, "FedOpt: β2, the decay of the second moment v (not adagrad)."
    )
    server_tau: float = option(1e-3, "FedOpt: τ, the adaptivity in η m / (√v + τ); v starts at τ².")

    # Local SGD
    local_epochs: int = option(1, "Local epochs per round.")
    batch_size: int = option(128, "Local mini-batch size.")
    lr: float = option(0.1, "Local learning rate (a schedule's at round 1).")
    momentum: float = option(0.9, "SGD momentum.")
    weight_decay: float = option(0.0, "SGD weight decay.")
    drop_last: bool = option(False, "Drop each epoch's last incomplete batch.")
    persistent_momentum: bool = option(
        False, "Keep each (client, model)'s SGD momentum across rounds."
    )
    skip_below: float = option(
        0.0,
        "Skip the local training of a (client, model) pair whose ω is below δ; its model is "
        "folded in unchanged (0: train every pair).",
    )

    # Local optimizer and schedule
    optimizer: str = option(
        "sgd",
        "sgd (momentum, weight_decay), adam (weight_decay as L2) or adamw (decoupled "
        "weight_decay): torch.optim's rules, state fresh at each local training.",
    )
    local_beta1: float = option(0.9, "adam, adamw: β1.")
    local_beta2: float = option(0.999, "adam, adamw: β2.")
    local_eps: float = option(1e-8, "adam, adamw: ε.")
    lr_schedule: str = option(
        "constant",
        "The local lr over rounds: constant; step (× lr_gamma every lr_step_rounds); cosine "
        "(from lr to lr_min over lr_period rounds).",
    )
    lr_step_rounds: int = option(50, "step: rounds between two decays.")
    lr_gamma: float = option(0.1, "step: the factor of each decay.")
    lr_min: float = option(0.0, "cosine: the lr it decays to, from round lr_period + 1.")
    lr_period: int | None = option(
        None, "cosine: rounds from lr to lr_min (none: train.rounds, fixed when the run starts)."
    )

    # Evaluation and checkpoints
    eval_every: int = option(1, "Evaluate every N rounds (and at the last round).")
    checkpoint_every: int | None = option(
        None,
        "Write checkpoint.pt every N rounds (and at the last); none: every round while a "
        "checkpoint is under 512 MB; 0: never (the run can be neither resumed nor extended).",
    )
    log: list[str] = option(
        None,
        "Also send each round's numbers and the run's configuration to these trackers, "
        "comma-separated: tensorboard, wandb, mlflow (each an optional extra).",
        default_factory=list,
    )

    # Execution
    device: str = option("auto", "auto (cuda when available), cpu or cuda.")
    executor: str = option("auto", "auto (batched on CUDA), batched or sequential.")
    chunk_clients: int | None = option(
        None, "Batched: local trainings at once (none: from free GPU memory)."
    )
    precision: str = option(
        "fp32",
        "fp32, or bf16: forward passes (training, E-step, evaluation) under bfloat16 autocast "
        "on the CPU or CUDA; weights, optimizer state and aggregation stay fp32.",
    )
    compile: bool = option(
        False,
        "Batched: the local step under torch.compile, compiled once per batch shape (CUDA "
        "graphs on CUDA); the same numbers up to float rounding.",
    )

    # The algorithm's and the model's own settings (`pipeline.run.resolve`)
    settings: dict[str, Any] = field(default_factory=dict, compare=True, repr=True)

    @property
    def algorithm_settings(self) -> Any:
        return self.settings.get(self.algorithm)

    @property
    def model_settings(self) -> Any:
        return self.settings.get(self.model)

    def validate(self) -> None:
        t = "train"
        _require(self.clusters >= 1, f"{t}.clusters", "an integer >= 1", self.clusters)
        _require(self.rounds >= 1, f"{t}.rounds", "an integer >= 1", self.rounds)
        rps = self.rounds_per_step
        _require(rps is None or rps >= 1, f"{t}.rounds_per_step", "an integer >= 1 or null", rps)
        _require(self.local_epochs >= 1, f"{t}.local_epochs", "an integer >= 1", self.local_epochs)
        _require(self.batch_size >= 1, f"{t}.batch_size", "an integer >= 1", self.batch_size)
        _require(math.isfinite(self.lr) and self.lr > 0, f"{t}.lr", "a number > 0", self.lr)
        _require(0 <= self.momentum < 1, f"{t}.momentum", "a number in [0, 1)", self.momentum)
        _require(self.weight_decay >= 0, f"{t}.weight_decay", "a number >= 0", self.weight_decay)
        _require(
            0 < self.participation <= 1,
            f"{t}.participation",
            "a number in (0, 1]",
            self.participation,
        )
        for name in self.log:
            _require(name in TRACKERS, f"{t}.log", f"names from {TRACKERS}", name)
        _require(len(set(self.log)) == len(self.log), f"{t}.log", "no repeats", self.log)
        _require(self.eval_every >= 1, f"{t}.eval_every", "an integer >= 1", self.eval_every)
        ce = self.checkpoint_every
        _require(
            ce is None or ce >= 0, f"{t}.checkpoint_every", "an integer >= 0 (0: never) or null", ce
        )
        _require(self.device in DEVICES, f"{t}.device", f"one of {DEVICES}", self.device)
        ex, cc = self.executor, self.chunk_clients
        _require(ex in EXECUTORS, f"{t}.executor", f"one of {EXECUTORS}", ex)
        _require(cc is None or cc >= 1, f"{t}.chunk_clients", "an integer >= 1 or null", cc)
        pr = self.precision
        _require(pr in PRECISIONS, f"{t}.precision", f"one of {PRECISIONS}", pr)
        _require(
            self.profile in PROFILES, f"{t}.profile", f"one of {tuple(PROFILES)}", self.profile
        )
        _require(0 < self.server_lr <= 10, f"{t}.server_lr", "a number in (0, 10]", self.server_lr)
        self.validate_optimizers()
        sb = self.skip_below
        _require(0 <= sb < 1, f"{t}.skip_below", "a number in [0, 1)", sb)
        _require(0 <= self.seed <= SEED_MAX, f"{t}.seed", SEEDS, self.seed)

    def validate_optimizers(self) -> None:
        """The server and local optimizers' and the schedule's options."""
        t = "train"
        so, op, ls = self.server_opt, self.optimizer, self.lr_schedule
        _require(so in SERVER_OPTIMIZERS, f"{t}.server_opt", f"one of {SERVER_OPTIMIZERS}", so)
        for key in ("server_beta1", "server_beta2", "local_beta1", "local_beta2"):
            value = getattr(self, key)
            _require(0 <= value < 1, f"{t}.{key}", "a number in [0, 1)", value)
        _require(self.server_tau > 0, f"{t}.server_tau", "a number > 0", self.server_tau)
        _require(op in OPTIMIZERS, f"{t}.optimizer", f"one of {OPTIMIZERS}", op)
        _require(self.local_eps > 0, f"{t}.local_eps", "a number > 0", self.local_eps)
        if op != "sgd" and self.persistent_momentum:
            raise FedrcError(
                f"{t}.persistent_momentum: keeps SGD's momentum only; {op}'s moments start "
                "fresh at each local training (set persistent_momentum: false)"
            )
        _require(ls in SCHEDULES, f"{t}.lr_schedule", f"one of {SCHEDULES}", ls)
        if self.compile and op != "sgd":
            raise FedrcError(
                f"{t}.compile: compiles SGD's local step only; {op}'s update divides by √v, "
                "where compiled rounding of near-zero gradients moves weights by up to lr "
                "(set compile: false)"
            )
        rs = self.lr_step_rounds
        _require(rs >= 1, f"{t}.lr_step_rounds", "an integer >= 1", rs)
        _require(0 < self.lr_gamma <= 1, f"{t}.lr_gamma", "a number in (0, 1]", self.lr_gamma)
        lm = self.lr_min
        _require(0 <= lm <= self.lr, f"{t}.lr_min", f"a number in [0, lr = {self.lr}]", lm)
        lp = self.lr_period
        _require(lp is None or lp >= 1, f"{t}.lr_period", "an integer >= 1 or null", lp)

    def fixed(self) -> TrainConfig:
        """The configuration as a run records it: a cosine schedule's period given (the
        run's rounds when not set), so that a run resumed with more --rounds keeps its lr."""
        if self.lr_schedule != "cosine" or self.lr_period is not None:
            return self
        return dataclasses.replace(self, lr_period=self.rounds)

    def over_steps(self, time_steps: int) -> TrainConfig:
        """The configuration for a benchmark of `time_steps` steps: `rounds_per_step` fixed
        (rounds / T when not given; refused when a step would get no round). A run given
        `rounds_per_step` may stop before the last step, to be continued with --resume."""
        if time_steps == 1 or self.rounds_per_step is not None:
            return self
        if self.rounds < time_steps:
            raise FedrcError(
                f"train.rounds: {self.rounds} for {time_steps} time steps; give at least "
                "one round a step"
            )
        return dataclasses.replace(self, rounds_per_step=self.rounds // time_steps)

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed, flat: every field that changes the
        numbers, and each setting as `<component>.<key>`."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in (*RESUMABLE, "settings"):
            d.pop(key)
        for owner, values in self.settings.items():
            for key, value in dataclasses.asdict(values).items():
                d[f"{owner}.{key}"] = value
        return d


@dataclass(frozen=True)
class EvalConfig:
    """How `fedrc eval` scores a run."""

    run: str = option("runs/fedrc", "Run folder written by `fedrc train`.", path=True)
    hard: bool = option(
        False, "Predict with the model of largest ω (hard) or the ω-weighted ensemble (soft)."
    )
    finetune: bool = option(
        False,
        "FedRC-FT: one γ-weighted epoch on each client before the last-round scores (the global "
        "models stay unchanged).",
    )
    finetune_lr: float | None = option(
        None,
        "FedRC-FT's SGD learning rate (default: the run's lr). One step at a large training lr "
        "can overshoot on one client's data; docs/protocol.md.",
    )
    unlabeled: bool = option(
        True,
        "Also score the held-out clients assigned without their labels (the method's own "
        "label-free rule, else the lowest prediction entropy): final_unlabeled_global_accuracy.",
    )

    def validate(self) -> None:
        lr = self.finetune_lr
        if lr is None:
            return
        if not self.finetune:
            raise FedrcError("eval.finetune_lr: fine-tunes nothing without eval.finetune")
        _require(math.isfinite(lr) and 0 < lr <= 10, "eval.finetune_lr", "a number in (0, 10]", lr)


@dataclass(frozen=True)
class PlotConfig:
    """What `fedrc plot` draws."""

    run: str = option("runs/fedrc", "Run folder written by `fedrc train`.", path=True)
    dpi: int = option(120, "Resolution of the PNG files.")
    format: list[str] = option(
        None,
        "Comma-separated file formats of each figure: png, pdf, svg (PDF and SVG for print).",
        default_factory=lambda: ["png"],
    )
    font_size: float = option(10.0, "Font size of the figures, in points.")

    def validate(self) -> None:
        _require(20 <= self.dpi <= 600, "plot.dpi", "an integer in [20, 600]", self.dpi)
        formats = self.format
        ok = bool(formats) and all(f in FIGURE_FORMATS for f in formats)
        _require(ok, "plot.format", f"names from {FIGURE_FORMATS}", formats)
        size = self.font_size
        _require(4 <= size <= 30, "plot.font_size", "a number in [4, 30]", size)
