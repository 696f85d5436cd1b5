"""One typed dataclass per params.yaml section, validated where it is defined.

A stage's configuration is built in three layers: the dataclass defaults, the stage's section of
params.yaml, then the CLI options that were given. The resolved configuration is written beside
the stage's output (`config.json`), so every artifact says how it was made.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from pipeline import strict_yaml
from pipeline.data.client_mix import MIXES, check_shares
from pipeline.data.concepts import parse_concepts
from pipeline.data.corruptions import CORRUPTIONS, accepted, suite_name
from pipeline.data.drift import PRESETS, check_drift
from pipeline.data.loaders import DATASETS
from pipeline.errors import FedrcError
from pipeline.settings import coerce, field_types
from pipeline.settings import positive as _positive
from pipeline.settings import require as _require

DEVICES = ("auto", "cpu", "cuda")
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds; a negative one is refused by numpy
SEEDS = "an integer in [0, 2**32-1]"
SHIFTS = ("label", "feature", "concept")
# implemented in pipeline.data.label_splits, which reads a PartitionConfig
LABEL_SPLITS = (
    "sequential_dirichlet",
    "dirichlet",
    "n_class",
    "cluster_dirichlet",
    "cluster_n_class",
)
EXECUTORS = ("auto", "batched", "sequential")  # auto: sequential on a CPU, batched on CUDA
PRECISIONS = ("fp32", "bf16")
# Where the authors' code departs from the paper (protocol §1): `profile: reference` turns these on
# (and an algorithm's `Settings.profiles` its own); keys given explicitly still win.
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {},
    "reference": {
        "weight_decay": 5e-4,
        "drop_last": True,
        "persistent_momentum": True,
    },
}


def option(default: Any, help: str, default_factory: Any = None) -> Any:
    """A field with the help text `fedrc <stage> --help` shows for its option."""
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class PartitionConfig:
    """How `fedrc partition` builds the federated benchmark (FedRC appendix H.8, Fed-CAM §5).

    docs/benchmarks.md lists every setting; `pipeline.data.label_splits`,
    `concepts` and `client_mix` define them.
    """

    dataset: str = option(
        "fmnist",
        "fmnist, mnist, cifar10, cifar100, tinyimagenet, synthetic (built in), folder (your "
        "images: --data-root TREE), the drift streams sine, circle, sea, stagger, agrawal, "
        "hyperplane (tabular: no feature shift), or a plugin (`fedrc info`).",
    )
    data_root: str | None = option(
        None,
        "Folder with the dataset's files (IDX files, cifar-10-batches-py/, cifar-100-python/, "
        "tiny-imagenet-200/, an image tree); a torchvision download goes there too.",
    )
    replicate: int = option(1, "Repeat the training pool N times before splitting.")
    clients: int = option(300, "Participating clients.")
    samples_per_client: int | None = option(
        None,
        "Samples per client (train + test); none: the whole pool. Dirichlet splits: the pool is "
        "clients × this, sizes vary.",
    )
    shifts: list[str] = option(
        None,
        "Comma-separated shifts: label, feature, concept.",
        default_factory=lambda: list(SHIFTS),
    )
    label_split: str = option(
        "sequential_dirichlet",
        "sequential_dirichlet (FedRC), dirichlet, n_class, cluster_dirichlet, cluster_n_class "
        "(Fed-CAM).",
    )
    alpha: float = option(1.0, "Dirichlet concentration (cluster_dirichlet: across label groups).")
    alpha_within: float = option(10.0, "cluster_dirichlet: concentration within a label group.")
    classes_per_client: int = option(2, "n_class, cluster_n_class: classes each client holds.")
    label_groups: int = option(5, "cluster_*: groups of clients sharing a label profile.")
    group_classes: int = option(3, "cluster_n_class: classes each label group holds.")
    min_samples: int = option(
        10, "Dirichlet splits: redraw (at most 100 times) until every client has it."
    )
    concepts: list[str] = option(
        None,
        "Comma-separated label maps, one concept each: identity, reverse, shift[:s], "
        "permutation[:seed], pair_flip[:σ], symmetric[:σ].",
        default_factory=lambda: ["identity", "reverse", "shift"],
    )
    client_mix: str = option(
        "paper",
        "Client types: paper (30/20/25/25), reference (authors' scripts), imbalanced (8:1:1 "
        "concepts), custom (--client-shares).",
    )
    client_shares: list[float] | None = option(
        None, "client-mix custom: [clean, corrupted] share per concept, comma-separated, sum 1."
    )
    styles: list[str] | None = option(
        None, "Comma-separated corruptions to draw from (none: the dataset's whole suite)."
    )
    holdout_corrupted: bool = option(False, "Corrupt the non-participating clients too.")
    test_fraction: float = option(0.1, "Share of each client's samples kept for its test split.")
    holdout_samples: int | None = option(
        None,
        "Samples per non-participating client (class-balanced, from the test set); none: the "
        "whole test set.",
    )
    time_steps: int = option(
        1,
        "Time steps T: each client's samples are dealt into T parts, one per step, each with "
        "its concept of that step (1: a static benchmark).",
    )
    drift_share: float = option(
        0.0,
        "Share of participating clients that move to another concept at each step after the first.",
    )
    drift: Any = option(
        None,
        f"A drift schedule: a preset ({', '.join(PRESETS)}) or, in params.yaml, a list of "
        "events {step, clients | share, concept}.",
    )
    seed: int = option(0, "Seed: same seed, same bytes.")
    out: str = option("data/federated", "Output folder.")

    def validate(self) -> None:
        p = "partition"
        spec = DATASETS.get(self.dataset, f"{p}.dataset")
        _require(self.replicate >= 1, f"{p}.replicate", "an integer >= 1", self.replicate)
        _require(self.clients >= 2, f"{p}.clients", "an integer >= 2", self.clients)
        spc = self.samples_per_client
        _require(spc is None or spc >= 2, f"{p}.samples_per_client", ">= 2 or null", spc)
        for s in self.shifts:
            _require(s in SHIFTS, f"{p}.shifts", f"names from {SHIFTS}", s)
        _require(
            len(set(self.shifts)) == len(self.shifts), f"{p}.shifts", "no repeats", self.shifts
        )
        if spec.tabular:  # feature vectors: the image corruptions do not apply
            _require(
                "feature" not in self.shifts,
                f"{p}.shifts",
                f"label and/or concept only ({self.dataset} is tabular: no feature shift), e.g. "
                "label,concept",
                ",".join(self.shifts),
            )
            _require(
                self.styles is None,
                f"{p}.styles",
                f"null ({self.dataset} is tabular: no corruptions)",
                self.styles,
            )
        splits = LABEL_SPLITS
        _require(
            self.label_split in splits, f"{p}.label_split", f"one of {splits}", self.label_split
        )
        _require(_positive(self.alpha), f"{p}.alpha", "a number > 0", self.alpha)
        _require(
            _positive(self.alpha_within), f"{p}.alpha_within", "a number > 0", self.alpha_within
        )
        if spec.num_classes is not None:  # else checked against the loaded data
            self.check_classes(spec.num_classes)
        g = self.label_groups
        if self.label_split.startswith("cluster_"):
            _require(1 <= g <= self.clients, f"{p}.label_groups", "an integer in [1, clients]", g)
        _require(self.min_samples >= 2, f"{p}.min_samples", "an integer >= 2", self.min_samples)
        concepts = parse_concepts(self.concepts)
        mixes = MIXES
        _require(self.client_mix in mixes, f"{p}.client_mix", f"one of {mixes}", self.client_mix)
        if self.client_mix == "custom":
            check_shares(self.client_shares, len(concepts))
        else:
            _require(
                self.client_shares is None,
                f"{p}.client_shares",
                "null unless client_mix is custom",
                self.client_shares,
            )
        if self.styles is not None:
            _require(len(self.styles) > 0, f"{p}.styles", "a non-empty list or null", self.styles)
            self._validate_styles(self.styles, spec.channels)
        tf = self.test_fraction
        _require(0 < tf < 1, f"{p}.test_fraction", "a number in (0, 1)", tf)
        hs = self.holdout_samples
        _require(hs is None or hs >= 10, f"{p}.holdout_samples", ">= 10 or null", hs)
        _require(0 <= self.seed <= SEED_MAX, f"{p}.seed", SEEDS, self.seed)
        self._validate_drift(concepts)

    @property
    def steps(self) -> int:
        """T: `time_steps`, or the drift preset's number of steps."""
        if isinstance(self.drift, str) and self.drift in PRESETS:
            return PRESETS[self.drift].time_steps
        return self.time_steps

    @property
    def drifts(self) -> bool:
        return self.drift is not None or self.drift_share > 0

    def _validate_drift(self, concepts: list[Any]) -> None:
        p, t = "partition", self.time_steps
        _require(isinstance(t, int) and t >= 1, f"{p}.time_steps", "an integer >= 1", t)
        ds = self.drift_share
        _require(0 <= ds <= 1, f"{p}.drift_share", "a number in [0, 1]", ds)
        if self.drifts:
            _require(
                "concept" in self.shifts, f"{p}.shifts", "concept among them for drift", self.shifts
            )
        names = [c.name for c in concepts]
        check_drift(self.drift, ds, t, self.clients, names)

    def check_classes(self, num_classes: int) -> None:
        """The label-split settings that count classes, against the dataset's number."""
        p, k, a = "partition", self.classes_per_client, self.group_classes
        _require(
            1 <= k <= num_classes,
            f"{p}.classes_per_client",
            f"an integer in [1, {num_classes}] ({self.dataset} has {num_classes} classes)",
            k,
        )
        top = num_classes if self.label_split == "cluster_n_class" else a  # used there only
        _require(
            k <= a <= top,
            f"{p}.group_classes",
            f"an integer in [classes_per_client = {k}, {num_classes}]",
            a,
        )

    def _validate_styles(self, styles: list[str], channels: int | None) -> None:
        """Names from the dataset's suite when it tells the channel count, else from either
        suite; the build checks them again against the images it loaded."""
        if channels is None:
            names, where = CORRUPTIONS, "either suite"
        else:
            names, where = accepted(channels), f"the {suite_name(channels)} suite"
        for s in styles:
            _require(s in names, "partition.styles", f"names from {where} ({', '.join(names)})", s)


# Options that do not change the numbers: a resumed run may change them (`resolve.resumed`), and
# a checkpoint's identity leaves them out (`TrainConfig.identity`).
RESUMABLE = ("rounds", "data", "out", "device", "executor", "chunk_clients", "checkpoint_every")


@dataclass(frozen=True)
class TrainConfig:
    """How `fedrc train` runs federated training (FedRC paper, Algorithm 1 and appendix H).

    What every algorithm shares; an algorithm's or a model's own options are its `Settings`
    (`settings`, keyed by the algorithm's and the model's name; `pipeline.resolve` fills it).
    The fields come in sections (`GROUPS`, the panels of `fedrc train --help`), in that order;
    to a user they stay one flat set of keys: params.yaml's `train:`, the options, config.json.
    """

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Run": ("data", "algorithm", "clusters", "model", "profile", "seed", "out"),
        "Rounds": ("rounds", "rounds_per_step", "participation", "server_lr"),
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
        "Evaluation and checkpoints": ("eval_every", "checkpoint_every"),
        "Execution": ("device", "executor", "chunk_clients", "precision"),
    }

    # Run
    data: str = option("data/federated", "Folder written by `fedrc partition`.")
    algorithm: str = option("fedrc", "Built-in (`fedrc info`), a plugin, or module:Name.")
    clusters: int = option(3, "K, the number of models.")
    model: str = option("cnn", "cnn, mobilenet_v2, resnet18, a plugin, or module:Name.")
    profile: str = option("paper", "paper, or reference: the authors' code's settings.")
    seed: int = option(0, "Seed for models, sampling and batches.")
    out: str = option("runs/fedrc", "Run folder.")

    # Rounds
    rounds: int = option(200, "Communication rounds.")
    rounds_per_step: int | None = option(
        None,
        "Drifting benchmarks: rounds at each time step (none: rounds / T; the last step takes "
        "the rest).",
    )
    participation: float = option(1.0, "Share of participating clients sampled each round.")
    server_lr: float = option(1.0, "Server learning rate η_g: θ ← θ + η_g (average − θ).")

    # Local SGD
    local_epochs: int = option(1, "Local epochs per round.")
    batch_size: int = option(128, "Local mini-batch size.")
    lr: float = option(0.1, "Local SGD learning rate.")
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

    # Evaluation and checkpoints
    eval_every: int = option(1, "Evaluate every N rounds (and at the last round).")
    checkpoint_every: int | None = option(
        None,
        "Write checkpoint.pt every N rounds (and at the last); none: every round while a "
        "checkpoint is under 512 MB; 0: never (the run can be neither resumed nor extended).",
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

    # The algorithm's and the model's own settings (`pipeline.resolve`)
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
        sb = self.skip_below
        _require(0 <= sb < 1, f"{t}.skip_below", "a number in [0, 1)", sb)
        _require(0 <= self.seed <= SEED_MAX, f"{t}.seed", SEEDS, self.seed)

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

    run: str = option("runs/fedrc", "Run folder written by `fedrc train`.")
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

    run: str = option("runs/fedrc", "Run folder written by `fedrc train`.")
    dpi: int = option(120, "Resolution of the PNG files.")

    def validate(self) -> None:
        _require(20 <= self.dpi <= 600, "plot.dpi", "an integer in [20, 600]", self.dpi)


Config = TypeVar("Config", PartitionConfig, TrainConfig, EvalConfig, PlotConfig)
SECTIONS: dict[type, str] = {
    PartitionConfig: "partition",
    TrainConfig: "train",
    EvalConfig: "eval",
    PlotConfig: "plot",
}


def read_params(path: Path | None) -> dict[str, Any]:
    """The parsed params file; an absent default file means 'all defaults'."""
    if path is None:
        default = Path("params.yaml")
        if not default.exists():
            return {}
        path = default
    if not path.is_file():
        raise FedrcError(f"--params: file not found: {path}")
    try:
        data = strict_yaml.load(path.read_text()) or {}
    except strict_yaml.DuplicateKey as e:
        raise FedrcError(f"{path}: {e}; YAML would keep only the last, so remove one") from None
    except yaml.YAMLError as e:
        raise FedrcError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise FedrcError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    sections = list(SECTIONS.values())
    for key in data:  # other top-level keys are allowed (dvc.yaml reads `algorithms`), typos not
        near = difflib.get_close_matches(str(key), sections, n=1, cutoff=0.75)
        if key not in sections and near:
            raise FedrcError(f"{path}: unknown section {key!r} (did you mean {near[0]!r}?)")
    return data


def section(params: dict[str, Any], name: str) -> dict[str, Any]:
    raw = params.get(name) or {}
    if not isinstance(raw, dict):
        raise FedrcError(f"{name}: expected a mapping, got {raw!r}")
    return raw


def checked_values(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` checked against `cls`'s field types; an unknown key names the known ones."""
    types_ = field_types(cls)
    for key in values:
        if key not in types_:
            known = ", ".join(sorted(types_))
            raise FedrcError(f"{where}.{key}: unknown key (known: {known})")
    return {key: coerce(f"{where}.{key}", value, types_[key]) for key, value in values.items()}


def build_config(
    cls: type[Config], params: dict[str, Any], overrides: dict[str, Any] | None = None
) -> Config:
    """Defaults, then params.yaml's section, then the CLI overrides that are not None.
    (`fedrc train`'s configuration, which has per-algorithm settings: `pipeline.resolve`.)"""
    name = SECTIONS[cls]
    values = checked_values(cls, section(params, name), name)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    config = cls(**values)
    refuse_non_finite(config, name)
    config.validate()
    return config


def refuse_non_finite(config: Any, name: str) -> None:
    """inf and nan pass most range checks: refuse them for every float field."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise FedrcError(f"{name}.{item.name}: expected a finite number, got {value!r}")


def config_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
