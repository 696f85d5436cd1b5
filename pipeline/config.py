"""One typed dataclass per params.yaml section, validated where it is defined.

A stage's configuration is built in three layers: the dataclass defaults, the stage's section of
params.yaml, then the CLI options that were given. The resolved configuration is written beside
the stage's output (`config.json`), so every artifact says how it was made.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.data.client_mix import MIXES, check_shares
from pipeline.data.concepts import parse_concepts
from pipeline.data.corruptions import CORRUPTIONS, DATASET_CHANNELS, accepted, suite_name
from pipeline.data.loaders import NUM_CLASSES
from pipeline.errors import FedrcError

ALGORITHMS = (
    "fedavg",
    "fedprox",
    "ifca",
    "cfl",
    "fesem",
    "fedem",
    "fedsoft",
    "fedrc",
    "ifca-cam",
    "fesem-cam",
)
SINGLE_MODEL = ("fedavg", "fedprox")
PROXIMAL = ("fedprox", "fedsoft", "fesem-cam")  # algorithms that need mu > 0
DEVICES = ("auto", "cpu", "cuda")
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
MODELS = ("cnn", "mobilenet_v2", "resnet18")
NORMS = ("batch", "group")
ESTEPS = ("em", "adam")
# Where the authors' code departs from the paper (NOTES §1): `profile: reference` turns these on;
# keys given explicitly in params.yaml or on the command line still win.
PROFILES: dict[str, dict[str, Any]] = {
    "paper": {},
    "reference": {
        "weight_decay": 5e-4,
        "drop_last": True,
        "persistent_momentum": True,
        "heldout_label_prior": False,
        "adam_beta1": 0.5,
        "adam_beta2": 0.5,
    },
}


def _require(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise FedrcError(f"{key}: expected {expected}, got {value!r}")


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


@dataclass(frozen=True)
class PartitionConfig:
    """How `fedrc partition` builds the federated benchmark (FedRC appendix H.8, Fed-CAM §5).

    The README's "Building benchmarks" lists every setting; `pipeline.data.label_splits`,
    `concepts` and `client_mix` define them.
    """

    dataset: str = "fmnist"
    data_root: str | None = None
    replicate: int = 1  # the training pool repeated this many times before splitting
    clients: int = 300
    samples_per_client: int | None = None  # None: the training pool split evenly over clients
    shifts: list[str] = field(default_factory=lambda: list(SHIFTS))
    label_split: str = "sequential_dirichlet"
    alpha: float = 1.0  # Dirichlet concentration (cluster_dirichlet: across label groups)
    alpha_within: float = 10.0  # cluster_dirichlet: concentration within a label group
    classes_per_client: int = 2  # n_class, cluster_n_class
    label_groups: int = 5  # cluster_dirichlet, cluster_n_class
    group_classes: int = 3  # cluster_n_class: classes per label group
    min_samples: int = 10  # dirichlet, cluster_dirichlet: redraw until every client has these
    concepts: list[str] = field(default_factory=lambda: ["identity", "reverse", "shift"])
    client_mix: str = "paper"
    client_shares: list[float] | None = None  # client_mix custom: [clean, corrupted] per concept
    styles: list[str] | None = None  # None: the dataset's whole suite (grey or colour)
    holdout_corrupted: bool = False  # corrupt the non-participating clients too
    test_fraction: float = 0.1
    holdout_samples: int | None = None  # per non-participating client; None: whole test set
    seed: int = 0
    out: str = "data/federated"

    def validate(self) -> None:
        p = "partition"
        names = tuple(NUM_CLASSES)
        _require(self.dataset in names, f"{p}.dataset", f"one of {names}", self.dataset)
        _require(self.replicate >= 1, f"{p}.replicate", "an integer >= 1", self.replicate)
        _require(self.clients >= 2, f"{p}.clients", "an integer >= 2", self.clients)
        spc = self.samples_per_client
        _require(spc is None or spc >= 2, f"{p}.samples_per_client", ">= 2 or null", spc)
        for s in self.shifts:
            _require(s in SHIFTS, f"{p}.shifts", f"names from {SHIFTS}", s)
        _require(
            len(set(self.shifts)) == len(self.shifts), f"{p}.shifts", "no repeats", self.shifts
        )
        splits = LABEL_SPLITS
        _require(
            self.label_split in splits, f"{p}.label_split", f"one of {splits}", self.label_split
        )
        _require(_positive(self.alpha), f"{p}.alpha", "a number > 0", self.alpha)
        _require(
            _positive(self.alpha_within), f"{p}.alpha_within", "a number > 0", self.alpha_within
        )
        num_classes = NUM_CLASSES[self.dataset]
        k, a = self.classes_per_client, self.group_classes
        _require(
            1 <= k <= num_classes,
            f"{p}.classes_per_client",
            f"an integer in [1, {num_classes}] ({self.dataset} has {num_classes} classes)",
            k,
        )
        _require(
            k <= a <= num_classes,
            f"{p}.group_classes",
            f"an integer in [classes_per_client = {k}, {num_classes}]",
            a,
        )
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
            self._validate_styles(self.styles)
        tf = self.test_fraction
        _require(0 < tf < 1, f"{p}.test_fraction", "a number in (0, 1)", tf)
        hs = self.holdout_samples
        _require(hs is None or hs >= 10, f"{p}.holdout_samples", ">= 10 or null", hs)

    def _validate_styles(self, styles: list[str]) -> None:
        """Names from the dataset's suite when its name tells the channel count, else from
        either suite; the build checks them again against the images it loaded."""
        channels = DATASET_CHANNELS.get(self.dataset)
        if channels is None:
            names, where = CORRUPTIONS, "either suite"
        else:
            names, where = accepted(channels), f"the {suite_name(channels)} suite"
        for s in styles:
            _require(s in names, "partition.styles", f"names from {where} ({', '.join(names)})", s)


# options added after checkpoints existed: left out of `identity()` at their defaults
LATER_OPTIONS = {"precision": "fp32", "prune_after": 0, "merge_gap": None}


@dataclass(frozen=True)
class TrainConfig:
    """How `fedrc train` runs federated training (FedRC paper, Algorithm 1 and appendix H)."""

    data: str = "data/federated"
    algorithm: str = "fedrc"
    clusters: int = 3
    model: str = "cnn"  # cnn (the paper's FMNIST CNN), mobilenet_v2, resnet18
    pretrained: bool = False  # torchvision's ImageNet weights for mobilenet_v2 / resnet18
    norm: str = "batch"  # batch or group: GroupNorm in place of BatchNorm
    profile: str = "paper"  # or reference: the authors' code where it departs from the paper
    rounds: int = 200
    local_epochs: int = 1
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    drop_last: bool = False
    participation: float = 1.0
    server_lr: float = 1.0  # η_g: θ ← θ + η_g (average − θ)
    persistent_momentum: bool = False  # keep each (client, model)'s SGD momentum across rounds
    mu: float = 0.0  # proximal coefficient: FedProx μ, FedSoft λ, FeSEM-CAM λ
    max_clusters: int | None = None  # CFL: cap on the number of clusters (None: `clusters`)
    cfl_eps1: float = 0.4  # CFL: split when ‖mean update‖ < ε1 ...
    cfl_eps2: float = 1.6  # ... and max ‖update‖ > ε2
    warmup_rounds: int = 0  # Fed-CAM: rounds of FedAvg on the global model before clustering
    label_floor: float = 1e-8  # FedRC: floor on the summed label tables before normalising
    heldout_label_prior: bool = True  # FedRC: apply C_{y,k} in held-out E-steps (paper eq. 3)
    estep: str = "em"  # FedRC: em, or adam (FedConceptEM app. D.1)
    adam_lr: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_eps: float = 1e-8
    prune_threshold: float | None = None  # FedRC adaptive K: remove models with mean γ < δ
    prune_after: int = 0  # FedRC adaptive K: remove no model before this round (γ must settle)
    merge_gap: float | None = None  # FedRC adaptive K: remove one of two interchangeable models
    hard_train: bool = False  # FedRC TrHC: train only the arg-max ω model
    table_noise: float = 0.0  # FedRC: std ξ of Gaussian noise on the uploaded label tables
    shared_body: bool = False  # FedRC: one feature extractor shared by the K models, K heads
    eval_every: int = 1
    # write checkpoint.pt every N rounds (and at the last round); None: every round while a
    # checkpoint is small, less often when it is large (`training.checkpoint_interval`)
    checkpoint_every: int | None = None
    seed: int = 0
    device: str = "auto"
    executor: str = "auto"  # auto (sequential on a CPU, batched on CUDA), batched, sequential
    chunk_clients: int | None = None  # batched: local trainings at once (None: from GPU memory)
    precision: str = "fp32"  # batched on CUDA: fp32, or bf16 autocast
    out: str = "runs/fedrc"

    def validate(self) -> None:
        t = "train"
        _require(
            self.algorithm in ALGORITHMS, f"{t}.algorithm", f"one of {ALGORITHMS}", self.algorithm
        )
        _require(self.clusters >= 1, f"{t}.clusters", "an integer >= 1", self.clusters)
        _require(self.rounds >= 1, f"{t}.rounds", "an integer >= 1", self.rounds)
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
        _require(
            0 < self.label_floor < 1, f"{t}.label_floor", "a number in (0, 1)", self.label_floor
        )
        _require(self.eval_every >= 1, f"{t}.eval_every", "an integer >= 1", self.eval_every)
        ce = self.checkpoint_every
        _require(ce is None or ce >= 1, f"{t}.checkpoint_every", "an integer >= 1 or null", ce)
        _require(self.device in DEVICES, f"{t}.device", f"one of {DEVICES}", self.device)
        ex, cc = self.executor, self.chunk_clients
        _require(ex in EXECUTORS, f"{t}.executor", f"one of {EXECUTORS}", ex)
        _require(cc is None or cc >= 1, f"{t}.chunk_clients", "an integer >= 1 or null", cc)
        pr = self.precision
        _require(pr in PRECISIONS, f"{t}.precision", f"one of {PRECISIONS}", pr)
        _require(self.model in MODELS, f"{t}.model", f"one of {MODELS}", self.model)
        _require(self.norm in NORMS, f"{t}.norm", f"one of {NORMS}", self.norm)
        _require(
            self.profile in PROFILES, f"{t}.profile", f"one of {tuple(PROFILES)}", self.profile
        )
        _require(self.estep in ESTEPS, f"{t}.estep", f"one of {ESTEPS}", self.estep)
        _require(0 < self.server_lr <= 10, f"{t}.server_lr", "a number in (0, 10]", self.server_lr)
        _require(self.mu >= 0, f"{t}.mu", "a number >= 0", self.mu)
        if self.algorithm in PROXIMAL:
            _require(self.mu > 0, f"{t}.mu", f"a number > 0 for {self.algorithm}", self.mu)
        mc = self.max_clusters
        _require(mc is None or mc >= 1, f"{t}.max_clusters", "an integer >= 1 or null", mc)
        _require(self.cfl_eps1 > 0, f"{t}.cfl_eps1", "a number > 0", self.cfl_eps1)
        _require(self.cfl_eps2 > 0, f"{t}.cfl_eps2", "a number > 0", self.cfl_eps2)
        _require(
            self.warmup_rounds >= 0, f"{t}.warmup_rounds", "an integer >= 0", self.warmup_rounds
        )
        _require(self.adam_lr > 0, f"{t}.adam_lr", "a number > 0", self.adam_lr)
        _require(0 <= self.adam_beta1 < 1, f"{t}.adam_beta1", "a number in [0, 1)", self.adam_beta1)
        _require(0 <= self.adam_beta2 < 1, f"{t}.adam_beta2", "a number in [0, 1)", self.adam_beta2)
        _require(self.adam_eps > 0, f"{t}.adam_eps", "a number > 0", self.adam_eps)
        pt = self.prune_threshold
        _require(pt is None or 0 < pt < 1, f"{t}.prune_threshold", "a number in (0, 1) or null", pt)
        pa, mg = self.prune_after, self.merge_gap
        _require(pa >= 0, f"{t}.prune_after", "an integer >= 0", pa)
        _require(mg is None or mg > 0, f"{t}.merge_gap", "a number > 0 (nats) or null", mg)
        _require(self.table_noise >= 0, f"{t}.table_noise", "a number >= 0", self.table_noise)

    @property
    def num_models(self) -> int:
        """K, the number of predictors (CFL: the cap on its clusters)."""
        if self.algorithm in SINGLE_MODEL:
            return 1
        if self.algorithm == "cfl" and self.max_clusters is not None:
            return self.max_clusters
        return self.clusters

    def identity(self) -> dict[str, Any]:
        """The fields a checkpoint must match to be resumed: all that changes the numbers."""
        d = dataclasses.asdict(self)
        for k in (
            "rounds",
            "device",
            "out",
            "data",
            "executor",
            "chunk_clients",
            "checkpoint_every",
        ):
            d.pop(k)
        for key, default in LATER_OPTIONS.items():  # checkpoints from before them still resume
            if d[key] == default:
                d.pop(key)
        return d


@dataclass(frozen=True)
class EvalConfig:
    """How `fedrc eval` scores a run."""

    run: str = "runs/fedrc"
    hard: bool = False  # predict with the arg-max model instead of the ω-weighted ensemble
    finetune: bool = False  # FedRC-FT: one γ-weighted epoch on each client before scoring

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class PlotConfig:
    """What `fedrc plot` draws."""

    run: str = "runs/fedrc"
    dpi: int = 120

    def validate(self) -> None:
        _require(20 <= self.dpi <= 600, "plot.dpi", "an integer in [20, 600]", self.dpi)


Config = TypeVar("Config", PartitionConfig, TrainConfig, EvalConfig, PlotConfig)
SECTIONS: dict[type, str] = {
    PartitionConfig: "partition",
    TrainConfig: "train",
    EvalConfig: "eval",
    PlotConfig: "plot",
}


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check a YAML value against a dataclass field's type; ints are accepted where floats are."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner)
    if origin is list:
        _require(isinstance(value, list), key, "a list", value)
        return [_coerce(key, v, args[0]) for v in value]
    if annotation is bool:
        _require(isinstance(value, bool), key, "true or false", value)
    elif annotation is int:
        _require(isinstance(value, int) and not isinstance(value, bool), key, "an integer", value)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(ok, key, "a number", value)
        return float(value)
    elif annotation is str:
        _require(isinstance(value, str), key, "a string", value)
    return value


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
        data = yaml.safe_load(path.read_text()) or {}
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


def _per_algorithm(
    params: dict[str, Any], algorithm: str, names: set[str], hints: dict[str, Any]
) -> dict[str, Any]:
    """`per_algorithm: {cfl: {lr: 0.1, max_clusters: 3}, ...}`: train keys for one algorithm.

    DVC cannot index a table by a matrix item, so a pipeline that runs many algorithms from one
    params file keeps their learning rates (and μ, max_clusters) here and fedrc picks the row.
    """
    table = params.get("per_algorithm") or {}
    if not isinstance(table, dict):
        raise FedrcError(f"per_algorithm: expected a mapping of algorithms, got {table!r}")
    for name in table:
        _require(name in ALGORITHMS, "per_algorithm", f"algorithms from {ALGORITHMS}", name)
    row = table.get(algorithm) or {}
    if not isinstance(row, dict):
        raise FedrcError(f"per_algorithm.{algorithm}: expected a mapping, got {row!r}")
    values = {}
    for key, value in row.items():
        where = f"per_algorithm.{algorithm}.{key}"
        if key not in names or key == "algorithm":
            raise FedrcError(f"{where}: unknown key (known: train keys except algorithm)")
        values[key] = _coerce(where, value, hints[key])
    return values


def build_config(
    cls: type[Config], params: dict[str, Any], overrides: dict[str, Any] | None = None
) -> Config:
    """Defaults, then params.yaml's section (train: then the algorithm's `per_algorithm` row),
    then the CLI overrides that are not None."""
    section = SECTIONS[cls]
    raw = params.get(section) or {}
    if not isinstance(raw, dict):
        raise FedrcError(f"{section}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            raise FedrcError(f"{section}.{key}: unknown key (known: {', '.join(sorted(names))})")
        values[key] = _coerce(f"{section}.{key}", value, hints[key])
    if cls is TrainConfig:  # the algorithm's row of `per_algorithm` goes over the section
        algorithm = (overrides or {}).get("algorithm") or values.get("algorithm", "fedrc")
        values.update(_per_algorithm(params, algorithm, names, hints))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    profile = values.get("profile")
    if cls is TrainConfig and profile is not None:
        _require(profile in PROFILES, "train.profile", f"one of {tuple(PROFILES)}", profile)
        values = {**PROFILES[profile], **values}
    config = cls(**values)
    for item in dataclasses.fields(cls):  # inf and nan pass most range checks: refuse them here
        value = getattr(config, item.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise FedrcError(f"{section}.{item.name}: expected a finite number, got {value!r}")
    config.validate()
    return config


def config_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
