"""Each built-in algorithm's own settings: frozen dataclasses of typed fields with the paper's
defaults and a one-line description each (`setting`), checked by `validate`.

They are here, apart from the algorithms' code, so that `fedrc info NAME` lists them without
importing torch; each algorithm's module imports its class from here, and its card
(`pipeline.algorithms.BUILT_IN`) names it. A plugin defines its settings beside its algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.common.settings import Settings, positive, require, setting

ESTEPS = ("em", "adam")
LINKAGES = ("average", "complete", "single")  # the authors' 'average', 'maximum', 'minimum'
ANGLES = ("elementwise", "principal")
INITS = ("single", "per-client")
DISTANCES = ("data", "model")
PENALTIES = ("CL", "L2")  # FedCCFA's alignment losses, spelt as in its authors' config
WEIGHTS = ("uniform", "label")  # FedCCFA's group averages


# A divergence of an author's released code from its paper that changes the results is a
# setting here, off by default, whose description starts "as released"; `released` (a ClassVar)
# holds the values that reproduce that code (docs/reproducing.md, "The baselines as released").
# `train.profile: released` is the FedRC authors' code (LINs-lab/FedRC, whose ports of the Table 1
# baselines these are): the reference profile's local SGD plus IFCA's, FeSEM's, FedSoft's and
# CFL's `released` values.
RELEASED = "released"


def released_suffix(settings: Settings) -> str:
    """What a run's label adds when some `released` values are set (" (as released)" when all
    are, else their names); "" for none."""
    released = getattr(type(settings), "released", {})
    defaults = type(settings)()
    on = [k for k, v in released.items() if getattr(settings, k) == v != getattr(defaults, k)]
    if not on:
        return ""
    return " (as released)" if len(on) == len(released) else f" (as released: {', '.join(on)})"


@dataclass(frozen=True)
class ZeroEmptySettings(Settings):
    """The released aggregation of IFCA and FeSEM: `average_learners` over no member fills the
    model with zeros, and a zeroed ReLU network gets a gradient for nothing but its output bias
    (a client's kept momentum can still move the rest)."""

    zero_empty: bool = setting(
        False, "as released: a model that no sampled client chose is set to all zeros"
    )
    released: ClassVar[dict[str, Any]] = {"zero_empty": True}
    profiles: ClassVar[dict[str, dict[str, Any]]] = {RELEASED: released}


@dataclass(frozen=True)
class FeSEMSettings(ZeroEmptySettings):
    untrained_movers: bool = setting(
        False,
        "as released: a client that moves adds its new cluster's model as received, untrained",
    )
    released: ClassVar[dict[str, Any]] = {"zero_empty": True, "untrained_movers": True}
    profiles: ClassVar[dict[str, dict[str, Any]]] = {RELEASED: released}


@dataclass(frozen=True)
class ProximalSettings(Settings):
    """The coefficient of a proximal term (λ/2)‖w − anchor‖² in the local loss."""

    mu: float = setting(0.01, "μ, the weight of the proximal term (μ/2)‖w − anchor‖²")

    def validate(self) -> None:
        require(positive(self.mu), "mu", "a number > 0", self.mu)


@dataclass(frozen=True)
class FedSoftSettings(ProximalSettings):
    mu: float = setting(0.1, "λ, the pull of the personal model towards Σ_k u_ik θ_k")
    largest_loss: bool = setting(
        False, "as released: u_ik counts the samples that model k fits worst, not best"
    )
    held_out_model0: bool = setting(
        False, "as released: every held-out client predicts with cluster model 0"
    )
    released: ClassVar[dict[str, Any]] = {"largest_loss": True, "held_out_model0": True}
    profiles: ClassVar[dict[str, dict[str, Any]]] = {RELEASED: released}


@dataclass(frozen=True)
class CFLSettings(Settings):
    """Sattler et al.'s split thresholds (ε1 = 0.4, ε2 = 1.6) and the cap of "CFL(3)"."""

    max_clusters: int | None = setting(None, "cap on the number of clusters (null: --clusters)")
    cfl_eps1: float = setting(0.4, "ε1: a cluster splits when ‖mean update‖ < ε1 ...")
    cfl_eps2: float = setting(1.6, "ε2: ... and max ‖update‖ > ε2")
    max_entry: bool = setting(
        False, "as released: max ‖update‖ is the largest |entry| of any update (wrong axis)"
    )
    released: ClassVar[dict[str, Any]] = {"max_entry": True, "cfl_eps2": 0.6}  # tol_2 0.6
    profiles: ClassVar[dict[str, dict[str, Any]]] = {RELEASED: released}

    def validate(self) -> None:
        mc = self.max_clusters
        require(mc is None or mc >= 1, "max_clusters", "an integer >= 1 or null", mc)
        require(positive(self.cfl_eps1), "cfl_eps1", "a number > 0", self.cfl_eps1)
        require(positive(self.cfl_eps2), "cfl_eps2", "a number > 0", self.cfl_eps2)


@dataclass(frozen=True)
class EStepSettings(Settings):
    """How the E-step moves γ; Adam's defaults are FedConceptEM app. D.1's."""

    estep: str = setting("em", "em (the plain E-step) or adam (FedConceptEM app. D.1)")
    adam_lr: float = setting(1.0, "α, the Adam E-step's step size")
    adam_beta1: float = setting(0.9, "β1, the decay of the first moment ν")
    adam_beta2: float = setting(0.99, "β2, the decay of the second moment a")
    adam_eps: float = setting(1e-8, "ε in the Adam E-step's denominator")

    def validate(self) -> None:
        super().validate()
        require(self.estep in ESTEPS, "estep", f"one of {ESTEPS}", self.estep)
        require(self.adam_lr > 0, "adam_lr", "a number > 0", self.adam_lr)
        require(0 <= self.adam_beta1 < 1, "adam_beta1", "a number in [0, 1)", self.adam_beta1)
        require(0 <= self.adam_beta2 < 1, "adam_beta2", "a number in [0, 1)", self.adam_beta2)
        require(self.adam_eps > 0, "adam_eps", "a number > 0", self.adam_eps)


@dataclass(frozen=True)
class AdaptiveKSettings(Settings):
    prune_threshold: float | None = setting(None, "δ: remove a model whose mean γ is below it")
    prune_after: int = setting(0, "remove no model before this round (γ must settle)")
    merge_gap: float | None = setting(None, "ε nats: remove one of two interchangeable models")

    def validate(self) -> None:
        super().validate()
        pt, pa, mg = self.prune_threshold, self.prune_after, self.merge_gap
        require(pt is None or 0 < pt < 1, "prune_threshold", "a number in (0, 1) or null", pt)
        require(pa >= 0, "prune_after", "an integer >= 0", pa)
        require(mg is None or mg > 0, "merge_gap", "a number > 0 (nats) or null", mg)


@dataclass(frozen=True)
class HardTrainSettings(Settings):
    hard_train: bool = setting(False, "TrHC: train only the arg-max ω model, every sample")


@dataclass(frozen=True)
class TableNoiseSettings(Settings):
    table_noise: float = setting(0.0, "ξ, the std of Gaussian noise on the label tables")

    def validate(self) -> None:
        super().validate()
        require(self.table_noise >= 0, "table_noise", "a number >= 0", self.table_noise)


@dataclass(frozen=True)
class SharedBodySettings(Settings):
    shared_body: bool = setting(False, "one feature extractor shared by the K models, K heads")


@dataclass(frozen=True)
class FedRCSettings(
    SharedBodySettings, TableNoiseSettings, HardTrainSettings, AdaptiveKSettings, EStepSettings
):
    """FedRC's options; defaults are the paper's (Adam's from FedConceptEM app. D.1)."""

    label_floor: float = setting(1e-8, "floor on the summed label tables before normalising")
    heldout_label_prior: bool = setting(True, "apply C_{y,k} in held-out E-steps (paper eq. 3)")

    profiles: ClassVar[dict[str, dict[str, Any]]] = {
        profile: {"heldout_label_prior": False, "adam_beta1": 0.5, "adam_beta2": 0.5}
        for profile in ("reference", RELEASED)
    }

    def validate(self) -> None:
        super().validate()
        require(0 < self.label_floor < 1, "label_floor", "a number in (0, 1)", self.label_floor)


@dataclass(frozen=True)
class CAMSettings(Settings):
    warmup_rounds: int = setting(30, "FedAvg rounds of the global model before clustering")

    def validate(self) -> None:
        w = self.warmup_rounds
        require(w >= 0, "warmup_rounds", "an integer >= 0", w)


@dataclass(frozen=True)
class FeSEMCAMSettings(CAMSettings):
    mu: float = setting(0.01, "λ, the pull of the cluster copy towards its centre")

    def validate(self) -> None:
        super().validate()
        require(positive(self.mu), "mu", "a number > 0", self.mu)


@dataclass(frozen=True)
class PACFLSettings(Settings):
    """The authors' defaults: n_basis 5 (their scripts: 3), average linkage, elementwise angle.
    β is tuned per dataset (theirs: 3.5 by default, 4.9 for CIFAR-10, 9.88 CIFAR-100, 42 MIX-4);
    20° is fedrc's, for its FMNIST benchmark (docs/protocol.md §8)."""

    n_basis: int = setting(5, "p, left singular vectors per class")
    cluster_alpha: float = setting(
        20.0, "β: merge while the closest clusters are ≤ β degrees apart"
    )
    linkage: str = setting("average", "hierarchical clustering: average, complete or single")
    angle: str = setting(
        "elementwise", "subspace angle: elementwise (the authors' code) or principal"
    )
    lapack_signs: bool = setting(
        False, "as released: each basis vector's sign as the SVD returns it (depends on LAPACK)"
    )
    released: ClassVar[dict[str, Any]] = {"lapack_signs": True}

    def validate(self) -> None:
        require(self.n_basis >= 1, "n_basis", "an integer >= 1", self.n_basis)
        beta = self.cluster_alpha
        require(0 <= beta <= 180, "cluster_alpha", "an angle in degrees in [0, 180]", beta)
        require(self.linkage in LINKAGES, "linkage", f"one of {LINKAGES}", self.linkage)
        require(self.angle in ANGLES, "angle", f"one of {ANGLES}", self.angle)


@dataclass(frozen=True)
class CFLGPSettings(Settings):
    """The authors' defaults (main.py): P = 2, T = 10, and 1% of the coordinates when reduced."""

    clustering_period: int = setting(2, "P: cluster in rounds t with t mod P = 0 ...")
    clustering_termination_threshold: int = setting(
        10, "T: ... and t < T; then the clusters are frozen"
    )
    cycle_criterion: bool = setting(
        True, "criterion model ⌊t/P⌋ mod K (the paper); false: always model 0"
    )
    profile_fraction: float = setting(0.01, "share of the coordinates kept in G (1.0: all)")
    own_model_profile: bool = setting(
        False, "as released: G's block 0 holds the update of the client's own model, every time"
    )
    kmeans_starts: int = setting(10, "k-means++ starts (the least inertia wins); released: 1")
    released: ClassVar[dict[str, Any]] = {"own_model_profile": True, "kmeans_starts": 1}

    def validate(self) -> None:
        p, t = self.clustering_period, self.clustering_termination_threshold
        require(p >= 1, "clustering_period", "an integer >= 1", p)
        require(t >= 1, "clustering_termination_threshold", "an integer >= 1", t)
        f = self.profile_fraction
        require(0 < f <= 1, "profile_fraction", "a number in (0, 1]", f)
        starts = self.kmeans_starts
        require(starts >= 1, "kmeans_starts", "an integer >= 1", starts)


@dataclass(frozen=True)
class StoCFLSettings(Settings):
    """The authors' argparse defaults; their README runs use τ = 0.2 (clustering only, 4
    groups) and τ = 0.65 with μ = 0.05 (rotated CIFAR-10)."""

    tau: float = setting(0.3, "τ: unite two sampled clusters while cos(d_a, d_b) ≥ τ")
    mu: float = setting(
        0.05, "μ, the pull (μ/2)‖w − θ_g‖² of a cluster model towards the global one"
    )
    larger_model_only: bool = setting(
        False, "as released: a merge keeps the larger cluster's model, or none (then θ_g's copy)"
    )
    released: ClassVar[dict[str, Any]] = {"larger_model_only": True}

    def validate(self) -> None:
        require(-1 <= self.tau <= 1, "tau", "a number in [-1, 1] (a cosine)", self.tau)
        require(self.mu >= 0, "mu", "a number >= 0", self.mu)


@dataclass(frozen=True)
class FedDriftEagerSettings(Settings):
    """δ of the drift detector, in nats of mean cross-entropy (the authors' 0.06 is in accuracy:
    6 % of the samples turning from right to confidently wrong, ≈ 3 nats each, add ≈ 0.2)."""

    delta: float = setting(
        0.2, "δ: a client drifts when its best loss on new data rises by more than δ"
    )

    def validate(self) -> None:
        require(positive(self.delta), "delta", "a number > 0 (nats)", self.delta)


@dataclass(frozen=True)
class FedDriftSettings(FedDriftEagerSettings):
    """The authors' FedDrift setting: W = 1, δ′ = δ; one model at t = 0 ('single', their README's
    example) or one per client ('per-client', the paper's: a row each while rows last, so
    --clusters ≥ the participating clients gives every client its own)."""

    delta_merge: float | None = setting(None, "δ′: merge clusters with D ≤ δ′ (null: δ)")
    # data: the rise of the loss on each cluster's data (the authors' 'B'); model: each model's
    # rise from its own cluster's data to the other's (their 'A', their README's FedDrift)
    distance: str = setting(
        "data", "merge distance: data (the authors' B, on each cluster's data) or model (their A)"
    )
    window: int = setting(1, "W: a client that drifted is isolated on its new model for W steps")
    init: str = setting("single", "the models at t = 0: single, or per-client")

    def validate(self) -> None:
        super().validate()
        dm = self.delta_merge
        require(dm is None or dm >= 0, "delta_merge", "a number >= 0 (nats) or null", dm)
        require(self.window >= 1, "window", "an integer >= 1", self.window)
        require(self.init in INITS, "init", f"one of {INITS}", self.init)
        require(self.distance in DISTANCES, "distance", f"one of {DISTANCES}", self.distance)


@dataclass(frozen=True)
class FLUXSettings(Settings):
    """The authors' defaults (public/config.py): th_round 0.06, eps_scaling 1.0."""

    th_round: float = setting(0.06, "cluster once a warm-up accuracy gain is below this ...")
    eps_scaling: float = setting(1.0, "DBSCAN's eps = knee of the 1-NN distances × this")
    cluster_round: int | None = setting(None, "... or at this round (null: the accuracy trigger)")

    def validate(self) -> None:
        th = self.th_round
        require(th >= 0, "th_round", "a number >= 0", th)
        es = self.eps_scaling
        require(positive(es), "eps_scaling", "a number > 0", es)
        cr = self.cluster_round
        require(cr is None or cr >= 2, "cluster_round", "an integer >= 2 or null", cr)


@dataclass(frozen=True)
class FedCCFASettings(Settings):
    """The authors' defaults (their repository's configs/FedCCFA.yaml); `lr` and `local_epochs`
    do not apply."""

    balanced_epochs: int = setting(
        5, "(b) epochs of the balanced classifier; 0 clusters those of (c) instead"
    )
    balanced_lr: float = setting(0.1, "(b) learning rate of the balanced classifier")
    balanced_per_class: int = setting(5, "(b) at most this many samples of each class")
    clf_epochs: int = setting(1, "(c) epochs of the personal classifier")
    clf_lr: float = setting(0.1, "(c) learning rate of the personal classifier")
    rep_epochs: int = setting(5, "(c) epochs of the feature extractor, classifier fixed")
    rep_lr: float = setting(0.01, "(c) learning rate of the feature extractor")
    gamma: float = setting(20.0, "γ: alignment weight λ_i = H(P_i(Y)) / γ; 0: λ_i = lam")
    lam: float = setting(0.0, "λ_i for every client when gamma is 0")
    penalize: str = setting("CL", "alignment loss: CL (contrastive), or L2 (‖h − A_y‖² / D)")
    temperature: float = setting(0.1, "τ of the contrastive alignment loss")
    align_after: int = setting(20, "rounds trained without the alignment term")
    eps: float = setting(0.1, "DBSCAN's radius on the MADD distances")
    min_samples: int = setting(1, "DBSCAN's min_samples: the smallest group of classifiers")
    clustered_protos: bool = setting(
        True, "anchors: the prototypes of the client's groups; false: one per class, over all"
    )
    oracle: bool = setting(
        False, "group each label's rows by the benchmark's true concepts, not MADD + DBSCAN"
    )
    weights: str = setting(
        "uniform", "a group's mean of rows and prototypes: uniform, or label (by label counts)"
    )
    aliased_protos: bool = setting(
        False,
        "as released (weights uniform): a label's first sampled holder has the sum of all "
        "holders' prototypes as its own",
    )
    released: ClassVar[dict[str, Any]] = {"aliased_protos": True}

    def validate(self) -> None:
        for key in ("balanced_epochs", "clf_epochs", "align_after"):
            require(getattr(self, key) >= 0, key, "an integer >= 0", getattr(self, key))
        for key in ("rep_epochs", "balanced_per_class", "min_samples"):
            require(getattr(self, key) >= 1, key, "an integer >= 1", getattr(self, key))
        for key in ("balanced_lr", "clf_lr", "rep_lr", "temperature", "eps"):
            require(getattr(self, key) > 0, key, "a number > 0", getattr(self, key))
        require(self.gamma >= 0, "gamma", "a number >= 0", self.gamma)
        require(self.lam >= 0, "lam", "a number >= 0", self.lam)
        require(self.penalize in PENALTIES, "penalize", f"one of {PENALTIES}", self.penalize)
        require(self.weights in WEIGHTS, "weights", f"one of {WEIGHTS}", self.weights)


# --- the personalized baselines of FLUX's comparison: APFL and pFedMe -------------------------


@dataclass(frozen=True)
class APFLSettings(Settings):
    """The authors' defaults (MLOPTPSU/FedTorch, its README's run): α = 0.5, not adapted."""

    alpha: float = setting(0.5, "α_i at a client's first round: its personal model's share")
    adaptive: bool = setting(False, "learn α_i by gradient steps (the paper's adaptive α)")

    def validate(self) -> None:
        require(0 <= self.alpha <= 1, "alpha", "a number in [0, 1]", self.alpha)


@dataclass(frozen=True)
class PFedMeSettings(Settings):
    """The authors' defaults (CharlieDinh/pFedMe, main.py; `personal_decay` is the μ their
    optimizer hard-codes). train.lr, momentum and weight_decay do not apply: pFedMe's steps are
    its own; β is train.server_lr."""

    lam: float = setting(15.0, "λ, the pull (λ/2)‖θ − w‖² between personal and local model")
    inner_steps: int = setting(5, "K, the steps on θ per batch (the inner problem)")
    personal_lr: float = setting(0.09, "η_p, the step size of θ's inner steps")
    local_lr: float = setting(0.005, "η, the step w ← w − ηλ(w − θ) of the local model")
    personal_decay: float = setting(0.001, "μ, an L2 pull of θ towards 0 in its inner steps")

    def validate(self) -> None:
        require(positive(self.lam), "lam", "a number > 0", self.lam)
        require(self.inner_steps >= 1, "inner_steps", "an integer >= 1", self.inner_steps)
        require(positive(self.personal_lr), "personal_lr", "a number > 0", self.personal_lr)
        require(positive(self.local_lr), "local_lr", "a number > 0", self.local_lr)
        decay = self.personal_decay
        require(decay >= 0, "personal_decay", "a number >= 0", decay)


# --- FedGWC ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FedGWCSettings(Settings):
    """The authors' defaults (davedleo/FedGWC, config.py)."""

    gamma: float = setting(0.1, "γ of the affinity exp(−γ ‖W_i − W_j‖²) between two clients")
    eps: float = setting(1e-5, "ε: a cluster clusters when its interactions change less than ε")
    loss_sampling_size: int = setting(
        10, "the Gaussian's population: losses drawn from N(μ_s, σ²_s) beside the sampled ones"
    )

    def validate(self) -> None:
        require(positive(self.gamma), "gamma", "a number > 0", self.gamma)
        require(positive(self.eps), "eps", "a number > 0", self.eps)
        size = self.loss_sampling_size
        require(size >= 0, "loss_sampling_size", "an integer >= 0", size)


# --- FedDAA ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FedDAASettings(Settings):
    """The authors' defaults (LeegerPENG/FedDAA, FedDAA_*.py: k from 2 to 9, scikit-learn 1.5's
    `KMeans(random_state=0)`, one k-means++ start)."""

    max_clusters: int = setting(9, "the most clusters the silhouette may choose (from 2)")
    kmeans_starts: int = setting(1, "k-means++ starts for each count (the least inertia wins)")
    cluster_round: int | None = setting(
        None, "also cluster the clients at this round (null: only at each new time step)"
    )

    def validate(self) -> None:
        most = self.max_clusters
        require(most >= 2, "max_clusters", "an integer >= 2", most)
        starts = self.kmeans_starts
        require(starts >= 1, "kmeans_starts", "an integer >= 1", starts)
        cr = self.cluster_round
        require(cr is None or cr >= 2, "cluster_round", "an integer >= 2 or null", cr)


# --- Floco -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlocoSettings(Settings):
    """The Flower baseline's CIFAR-10 setting (M 10, τ 250, ρ 0.3; the authors' FL-bench
    configs: M 10 or 20, τ 250, ρ 0.01 to 0.5)."""

    endpoints: int = setting(10, "M, the endpoints of the solution simplex (1: FedAvg)")
    tau: int = setting(250, "τ: the round in which every client trains and is projected")
    rho: float = setting(0.3, "ρ, the radius of a client's region around its projection")

    def validate(self) -> None:
        require(self.endpoints >= 1, "endpoints", "an integer >= 1", self.endpoints)
        require(self.tau >= 1, "tau", "an integer >= 1", self.tau)
        require(self.rho >= 0, "rho", "a number >= 0", self.rho)


# --- the server and learning-rate optimizers of issue 43 (Adaptive-FedAvg, Flash) ---------
@dataclass(frozen=True)
class AdaptiveFedAvgSettings(Settings):
    """The decays of the three running estimates; FedCCFA's configs/AdaptiveFedAvg.yaml (the
    paper's values, unverified: FedDrift's code uses 0.5 for all three)."""

    beta1: float = setting(0.7, "β1: the decay of the running mean of the global model")
    beta2: float = setting(0.3, "β2: the decay of the running variance around that mean")
    beta3: float = setting(0.7, "β3: the decay of the running ratio of two variances")

    def validate(self) -> None:
        for key in ("beta1", "beta2", "beta3"):
            value = getattr(self, key)
            require(0 <= value < 1, key, "a number in [0, 1)", value)


@dataclass(frozen=True)
class FlashSettings(Settings):
    """FedCCFA's configs/Flash.yaml (the authors' code is not public); the server's own η
    replaces train.server_lr."""

    eta: float = setting(0.01, "η, the server's step size in η m / (√v − d + τ)")
    beta1: float = setting(0.9, "β1: the decay of the server's momentum m")
    beta2: float = setting(0.99, "β2: the decay of the second moment v")
    tau: float = setting(1e-3, "τ, the adaptivity; v starts at τ²")
    gamma: float = setting(
        0.004, "γ: a client stops after epoch e ≥ 2 when its loss gained less than γ / e"
    )

    def validate(self) -> None:
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            require(0 <= value < 1, key, "a number in [0, 1)", value)
        require(positive(self.eta), "eta", "a number > 0", self.eta)
        require(positive(self.tau), "tau", "a number > 0", self.tau)
        require(self.gamma >= 0, "gamma", "a number >= 0 (0: no early stopping)", self.gamma)
