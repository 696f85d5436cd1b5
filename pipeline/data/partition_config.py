"""The `partition:` section of params.yaml: how `fedrc partition` builds a benchmark. It lives
with the data because it checks its names against the data's own tables (datasets, corruptions,
concepts, client mixes, drift presets); `pipeline.config` re-exports it with the other sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.settings import SEED_MAX, SEEDS, option
from pipeline.common.settings import positive as _positive
from pipeline.common.settings import require as _require
from pipeline.data.client_mix import MIXES, check_shares
from pipeline.data.concepts import check_distinct, parse_concepts
from pipeline.data.corruptions import CORRUPTIONS, accepted, suite_name
from pipeline.data.drift import PRESETS, check_drift
from pipeline.data.loaders import PREFIX, HubColumns, check_data_root, dataset_spec
from pipeline.data.loaders.recorded import RECORDED
from pipeline.data.partitioners import check_partitioner

SHIFTS = ("label", "feature", "concept")
RECORDED_STREAMS = tuple(RECORDED)  # their clients are time segments or column values
# implemented in pipeline.data.label_splits, which reads a PartitionConfig
LABEL_SPLITS = (
    "sequential_dirichlet",
    "dirichlet",
    "n_class",
    "cluster_dirichlet",
    "cluster_n_class",
)


@dataclass(frozen=True)
class PartitionConfig:
    """How `fedrc partition` builds the federated benchmark (FedRC appendix H.8, Fed-CAM §5).

    docs/benchmarks.md lists every setting; `pipeline.data.label_splits`,
    `concepts` and `client_mix` define them.
    """

    dataset: str = option(
        "fmnist",
        "fmnist, mnist, cifar10, cifar100, tinyimagenet, synthetic (built in), folder (your "
        "images: --data-root TREE), hf:NAME (a Hugging Face dataset), the drift streams sine, "
        "circle, sea, stagger, agrawal, hyperplane and the recorded elec2, airlines, covertype "
        "(tabular: no feature shift), or a plugin (`fedrc info`).",
    )
    data_root: str | None = option(
        None,
        "Folder with the dataset's files (IDX files, cifar-10-batches-py/, cifar-100-python/, "
        "tiny-imagenet-200/, an image tree, a stream's CSV / ARFF file, an hf: dataset's local "
        "copy); a download goes there too.",
        path=True,
    )
    split: str | None = option(None, "hf: the split of training samples (none: train).")
    test_split: str | None = option(
        None,
        "hf: the split of test samples (none: test if there is one, else every fifth training "
        "sample; with partition_by, unseen ids instead).",
    )
    image_column: str | None = option(
        None, "hf: the images (none: the first Image feature, else image or img)."
    )
    label_column: str | None = option(
        None, "hf: the class labels (none: the first ClassLabel feature, else label)."
    )
    partition_by: str | None = option(
        None,
        "Natural clients: one per value of this column (FEMNIST's writer_id, Airlines' "
        "Airline); --clients of them take part, unseen ones are held out.",
    )
    holdout_ids: int = option(
        1, "partition_by: unseen ids in each held-out client (one held-out client per concept)."
    )
    partitioner: str | None = option(
        None,
        "A Flower Datasets partitioner for the label split, in place of label_split: dirichlet, "
        "pathological, shard, iid, linear, square, exponential, … (flwr-datasets' names), or "
        "module:Name.",
    )
    partitioner_options: Any = option(
        None,
        "The partitioner's own arguments, KEY=VALUE comma-separated (in params.yaml a mapping), "
        "e.g. alpha=0.3,min_partition_size=5; num_partitions, partition_by and seed default to "
        "--clients, label and --seed.",
    )
    replicate: int = option(1, "Repeat the training pool N times before splitting.")
    clients: int = option(300, "Participating clients.")
    samples_per_client: int | None = option(
        None,
        "Samples per client (train + test); none: the whole pool. Dirichlet splits: the pool is "
        "clients × this, sizes vary.",
    )
    shifts: list[str] | None = option(
        None,
        "Comma-separated shifts: label, feature, concept (none: those the dataset takes: all "
        "three for images, no feature shift for a tabular stream, no label split with "
        "partition_by; a recorded stream: none, its own drift).",
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
    out: str = option("data/federated", "Output folder.", path=True)

    def __post_init__(self) -> None:
        if self.shifts is None:  # the shifts the dataset takes; a recorded stream: its own drift
            left_out = {*self.refused_shifts(), *self.recorded * ["concept"]}
            object.__setattr__(self, "shifts", [s for s in SHIFTS if s not in left_out])

    @property
    def recorded(self) -> bool:
        return self.dataset in RECORDED_STREAMS

    def refused_shifts(self) -> dict[str, str]:
        """The shifts this dataset and partition cannot take, each with why."""
        spec = dataset_spec(self.dataset, "partition.dataset")
        refused = {}
        if spec.tabular:
            refused["feature"] = f"{self.dataset} is tabular: no feature shift"
        if self.partition_by is not None:
            refused["label"] = "partition_by: the clients' own labels are the label shift"
        elif self.recorded:
            refused["label"] = (
                f"{self.dataset} is a recorded stream: its clients are time segments (or "
                "partition_by values), their labels as recorded"
            )
        return refused

    @property
    def hub(self) -> HubColumns:
        """What to read of an hf: dataset."""
        return HubColumns(
            self.split, self.test_split, self.image_column, self.label_column, self.partition_by
        )

    def validate(self) -> None:
        p = "partition"
        spec = dataset_spec(self.dataset, f"{p}.dataset")
        check_data_root(spec, self.data_root)
        _require(self.replicate >= 1, f"{p}.replicate", "an integer >= 1", self.replicate)
        _require(self.clients >= 2, f"{p}.clients", "an integer >= 2", self.clients)
        spc = self.samples_per_client
        _require(spc is None or spc >= 2, f"{p}.samples_per_client", ">= 2 or null", spc)
        for s in self.shifts:
            _require(s in SHIFTS, f"{p}.shifts", f"names from {SHIFTS}", s)
        _require(
            len(set(self.shifts)) == len(self.shifts), f"{p}.shifts", "no repeats", self.shifts
        )
        for shift, why in self.refused_shifts().items():
            allowed = [s for s in SHIFTS if s not in self.refused_shifts()]
            _require(
                shift not in self.shifts,
                f"{p}.shifts",
                f"names from {', '.join(allowed)} ({why}), e.g. {','.join(allowed) or 'none'}",
                ",".join(self.shifts),
            )
        self._validate_sources()
        if spec.tabular:  # feature vectors: the image corruptions do not apply
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
        g = self.label_groups
        if self.label_split.startswith("cluster_"):
            _require(1 <= g <= self.clients, f"{p}.label_groups", "an integer in [1, clients]", g)
        _require(self.min_samples >= 2, f"{p}.min_samples", "an integer >= 2", self.min_samples)
        concepts = parse_concepts(self.concepts)
        if spec.num_classes is not None:  # else checked against the loaded data
            self.check_classes(spec.num_classes)
            if "concept" in self.shifts:
                check_distinct(concepts, spec.num_classes)
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

    def _validate_sources(self) -> None:
        """The hf: columns, natural ids and Flower partitioners, each where it applies."""
        p = "partition"
        if not self.dataset.startswith(PREFIX):
            for key in ("split", "test_split", "image_column", "label_column"):
                _require(
                    getattr(self, key) is None,
                    f"{p}.{key}",
                    f"null (it names a Hugging Face dataset's columns; dataset is {self.dataset})",
                    getattr(self, key),
                )
        if self.partition_by is not None or self.partitioner is not None:
            what = "partition_by" if self.partition_by is not None else "partitioner"
            _require(
                self.samples_per_client is None,
                f"{p}.samples_per_client",
                f"null with {what} (it decides each client's samples)",
                self.samples_per_client,
            )
        _require(self.holdout_ids >= 1, f"{p}.holdout_ids", "an integer >= 1", self.holdout_ids)
        if self.partition_by is not None:
            _require(
                self.partitioner is None,
                f"{p}.partitioner",
                "null with partition_by (natural ids are the clients)",
                self.partitioner,
            )
            _require(
                self.holdout_samples is None,
                f"{p}.holdout_samples",
                "null with partition_by (a held-out client holds its ids' samples)",
                self.holdout_samples,
            )
        if self.partitioner is not None:
            check_partitioner(self.partitioner, self.partitioner_options)
        elif self.partitioner_options is not None:
            raise FedrcError(f"{p}.partitioner_options: given without partition.partitioner")

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
