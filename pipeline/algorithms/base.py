"""The contract every algorithm fulfils; the round loop (`pipeline.run.training`) calls its verbs.

A subclass implements `assign` and overrides only the verbs its paper changes; docs/plugins.md
lists every verb with when it is called and what it must not do.

Once: `init_state()`                the state before round 1 (ω uniform; clusters, tables …)
      `participants(clients)`         the participating clients (every place; again at a resume)
At the first round of each time step of a drifting benchmark (every place):
  `begin_step(step)`                 a detector's cue (FedDrift); the data of `step` is in use
Only for an oracle option that asks (`wants_true_concepts()`), before each round (every place):
  `true_concepts(names, concepts)`   each client's true concept at the round's step
Per round (FedRC paper, Algorithm 1; the same skeleton fits every baseline):
  `round_clients(round, sampled, participating)`  who trains (default: the loop's sample)
  `begin_round(models)`              the server's models before local training; the running
                                     aggregates start from zero
  `plan_round(sampled)`              every place: the round's decisions that need no client
                                     data (StoCFL: a cluster's first model)
  `wants_statistics(sampled)`        the sampled clients asked for a statistic of their data
  `describe(i, images, labels, models)`  on the place holding client i's data: the statistic
                                     (a 1-D float tensor), e.g. PACFL's subspace bases
  `observe(i, statistic)`            on every place, in client order: keep it
E-step, in one of two ways:
  with a client part (`Step`, `client_part`), where client i's data lives:
  `score_steps(sampled)`             the clients whose E-step waits for the server's decision
                                     on their scores (FedDrift), each with a step that sends
                                     them and trains nothing; run where the data is, then
  `receive_scores(i, upload)`        on every place, in client order
  `client_step(i)`                   on the server: the state client i needs (a `ClientStep`)
  `step.run(losses, labels, memory)` on the client: γ (kept there), its upload, its memory
  `step.local_tasks(γ, models)`      on the client: its local trainings
  `receive(i, upload)`               on every place, in client order, after local training
  without one (the fallback: losses and labels reach every place, a Flower server included):
  `assign(i, losses, labels)`        each sampled client, every place, in client order → γ
                                     (N_i, K); the base then sets ω_i = `client_omega(i, γ)`
  (an algorithm, or a `Step`, with `wants_predictions` also gets `predictions=` in `assign`,
  `assign_held_out`, `step.run` and `step.held_out`: each sample's arg-max class under each
  model, (N_i, K), for a rule that needs correctness, e.g. the most accurate model)
  `local_tasks(i, gamma, models, raw)`  on client i's place: its local trainings, at the
                                     round's learning rate (`local_lr`, every place, once a
                                     round: the schedule's, or the algorithm's own), on
                                     its training rows and, where `retains(i)` (FedDAA), its
                                     previous step's
  `reads(i)` (`step.reads(K)` with a client part)  before the E-step: the model rows whose
                                     logits the E-step and `local_tasks` read on client i's
                                     samples; only those are computed, the others are NaN
  `fold(i, task, result)`            add one trained model to the running aggregates
                                     (`accumulate`); the loop drops the result right after
then once per round:
  `contributions()`                  the running sums, which a communicator adds up over places
  `shared_rows()`                    per-client vectors a rule needs all at once (or None)
  `aggregate(models)`                the new global models, from the combined contributions;
                                     it may create a model in a free row or merge two rows;
                                     an average becomes a model through `server_step`
                                     (`train.server_opt`: FedAvg's η_g, or FedOpt's)
  `end_round()`                      bookkeeping for the next round (FedRC: C_{y,k})
and for prediction:
  `combine_logits(raw)`              from the rows' logits to the K predictors' logits (CAM: sum)
  `combined_rows(predictors)`        the rows `combine_logits` reads for those predictors
  `assign_held_out(i, losses, labels)`  a non-participating client's ω (returned; with a client
                                     part: `step.held_out`, where the client's data lives)
  `assign_unlabeled(i, logits, images)`  the same without its labels (`fedrc eval`)
  `predict_weights(i)`               ω_i, the client's mixture over the K predictors
  `personal_model(i)`                a client's own model, where the algorithm keeps one (or
                                     several rows, whose logits `combine_personal` mixes)

`models` is an (R, P) tensor of flat models; R = `num_rows` (K, or K + 1 with a global model).
A method that creates models during a run (CFL's splits) reserves its rows up front
(`count_models`: a cap) and keeps which are in use; `self.head` gives the final layer's place in
a flat model, for methods that share the body and cluster the head.

State: what `state_dict` returns (ω, label tables, clusters, …; the base saves ω and the
attributes named in `state_attributes`) is the same on every place and goes into checkpoints;
the round's aggregates live from `begin_round` to `aggregate` only (attributes named `_…`). A
checkpoint that leaves state out is one warning (`pipeline.algorithms.state`). A
`fold` must only add to `contributions()` or write `shared_rows()`: per-client facts that other
places need (FeSEM's new cluster of a client) travel as rows of a summed (clients,) tensor.
Memory per round is K × model for the sums, plus whatever `shared_rows` keeps (in the host's
memory where a row per client fits in a quarter of what is free, else on disk: `client_rows`).
"""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar

import torch
from torch import nn

from pipeline.algorithms.client import ClientStep, Memory, Rows, Upload, hard_tasks, soft_tasks
from pipeline.algorithms.client import hard_gamma as hard_gamma  # re-exported for algorithms
from pipeline.algorithms.client import lowest_loss as lowest_loss
from pipeline.algorithms.client import one_hot as one_hot
from pipeline.algorithms.server_opt import ServerOptimizer
from pipeline.algorithms.settings import released_suffix
from pipeline.common.errors import FedrcError
from pipeline.common.settings import Settings
from pipeline.config import TrainConfig
from pipeline.engine.rows import RowStore
from pipeline.engine.task import LocalResult, LocalTask


class Algorithm(ABC):
    """Subclass this, give `name`, `title`, `paper` and (if it has any) a `Settings` dataclass,
    and implement `assign` (or a client part: `Step`, `client_step`, `receive`); the defaults
    of the other verbs are FedEM's (soft γ, every model trains with its γ column, N_i-weighted
    averages). `self.settings` holds the run's settings.
    """

    name: ClassVar[str]  # the registry name, as in `--algorithm`
    title: ClassVar[str]  # as printed in reports and figures
    paper: ClassVar[str]  # the citation `fedrc info` shows
    Settings: ClassVar[type[Settings]] = Settings  # the algorithm's own options (none here)
    personal_models: ClassVar[bool] = False  # clients score with `personal_model` (FedSoft)
    describes: ClassVar[bool] = False  # clients send a statistic of their data (`describe`)
    # its tasks need the sequential executor: `LocalTask.stages` (FedCCFA), a `LocalTask.rule`
    # (APFL, pFedMe, FedGWC, Floco) or `stop_gain` (Flash); `local_training` says which, in the
    # one-line refusals
    needs_sequential: ClassVar[bool] = False
    local_training: ClassVar[str] = ""
    # its tasks train by stages or a rule: SGD steps with fresh momentum in each local training,
    # which Flower's messages do not carry
    own_training: ClassVar[bool] = False
    # how a new client is assigned without its labels (`assign_unlabeled`), for reports
    unlabeled_rule: ClassVar[str] = "fallback: the model with the lowest prediction entropy"
    # the client part's class (`pipeline.algorithms.client`); None: the E-step runs where the
    # losses and labels are gathered (every place; a Flower server)
    Step: ClassVar[type[ClientStep] | None] = None
    # True: `assign` and `assign_held_out` also get `predictions=` (N_i, K), the arg-max class
    # of each sample under each model, beside the losses (e.g. to choose by accuracy); a
    # client part's `Step` says so itself (`ClientStep.wants_predictions`)
    wants_predictions: ClassVar[bool] = False
    # attributes that the base's `state_dict` saves and `load_state_dict` restores, besides ω:
    # a subclass keeping state of its own lists it here (or extends `state_dict`)
    state_attributes: ClassVar[tuple[str, ...]] = ()
    # verbs a client part stands in for: a subclass overriding one without a `Step` of its own
    # falls back to them (`client_part`); so a client part's predictors are always the first K
    # rows (the base's `combine_logits`), which a node can take without the server's state
    STEP_VERBS: ClassVar[tuple[str, ...]] = (
        "assign", "client_omega", "assign_held_out", "local_tasks", "combine_logits",
    )  # fmt: skip

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        """K, the number of predictors for `--clusters` (FedAvg: 1; CFL: its cap)."""
        return clusters

    @classmethod
    def adapt_model(cls, model: nn.Module, settings: Settings) -> nn.Module:
        """The run's model from `--model`'s, built before the algorithm (Floco swaps the final
        layer for its solution simplex). Default: the model as it is."""
        return model

    @classmethod
    def label(cls, settings: Settings) -> str:
        """The run's name in a report: the title, with a setting that names a variant (the
        switches of the `released` profile: " (as released)")."""
        return cls.title + released_suffix(settings)

    def __init__(
        self,
        num_models: int,
        num_clients: int,
        num_classes: int,
        config: TrainConfig,
        head: tuple[int, int] | None = None,
    ):
        self.num_models = num_models
        self.num_clients = num_clients
        self.num_classes = num_classes
        self.config = config
        given = config.settings.get(config.algorithm)
        self.settings = given if isinstance(given, self.Settings) else self.Settings()
        # [start, stop) of the final layer in a flat model, for variants that share everything
        # else across the K models (`models.layout.head_range`)
        self.head = head
        if self.own_training and config.persistent_momentum:
            raise FedrcError(
                f"train.persistent_momentum: {self.name} {self.local_training}, each local "
                "training starting with fresh momentum; set it to false"
            )
        if self.own_training and config.optimizer != "sgd":
            raise FedrcError(
                f"train.optimizer: {self.name} {self.local_training}, whose steps are SGD's; "
                "set it to sgd"
            )
        self.sums: torch.Tensor | None = None  # (R, P) Σ_i w_ik θ_ik of the round (`accumulate`)
        self.totals: torch.Tensor | None = None  # (R,) Σ_i w_ik
        self.server = ServerOptimizer(config)  # `server_step`: train.server_opt
        self.init_state()

    def init_state(self) -> None:
        """The state before round 1 (a subclass adds its own after calling this)."""
        self.omega = torch.full(
            (self.num_clients, self.num_models), 1.0 / self.num_models, dtype=torch.float64
        )
        # client → what its step keeps between its E-steps, held where the client's data is
        # (here in one process and under torchrun; on the node in a Flower deployment)
        self.memory: dict[int, Memory] = {}
        # the server optimizer's moments per model row (`server_opt`); None until the first
        # adaptive step, and always for sgd
        self.server_opt: dict[str, torch.Tensor] | None = None

    @property
    def num_rows(self) -> int:
        return self.num_models

    def round_clients(self, round_: int, sampled: list[int], participating: list[int]):
        """The clients that train in round `round_` (1, 2, …), from the round loop's sample and
        all participating clients, on every place: a pure function of them and the state.
        Default: the sample (Floco takes every client in its projection round)."""
        return sampled

    def participants(self, clients: list[int]) -> None:  # noqa: B027 (a hook)
        """The participating clients (the others are held out and never train), once on every
        place before round 1, again before a resume loads the state. FedGWC sizes its clusters
        by them; default: nothing."""

    # --- time steps and client statistics -------------------------------------------------
    def begin_step(self, step: int) -> None:  # noqa: B027 (a hook: most algorithms need none)
        """A drifting benchmark's step `step` starts (called before its first round's
        `begin_round`, on every place; never on a static benchmark)."""

    def wants_true_concepts(self) -> bool:
        """True asks the round loop for the benchmark's true concepts before every round
        (`true_concepts`): for an oracle setting only, never for a method's own rule."""
        return False

    def true_concepts(self, names: tuple[str, ...], concepts: list[int]) -> None:  # noqa: B027
        """Only when `wants_true_concepts()`: before each round's `begin_round`, on every place,
        each client's concept at the round's time step, an index into `names` (the benchmark's
        label maps, `partition.concepts`). The in-process and torchrun loops call it; Flower
        does not."""

    def wants_statistics(self, sampled: list[int]) -> list[int]:
        """The sampled clients whose data statistic this round needs (default: none)."""
        return []

    def describe(
        self, client: int, images: torch.Tensor, labels: torch.Tensor, models: torch.Tensor
    ) -> torch.Tensor:
        """The statistic client `client` sends up: a 1-D float tensor of a length fixed by
        the algorithm, computed where its data lives from its images (N_i, C, H, W), its
        labels and the models it received. It must not touch the algorithm's state."""
        raise NotImplementedError(f"{self.name} asks for statistics but has no describe")

    def observe(self, client: int, statistic: torch.Tensor) -> None:  # noqa: B027 (a hook)
        """Keep a client's statistic (every place, in client order, before `assign`)."""

    # --- client part ----------------------------------------------------------------------
    @property
    def client_part(self) -> bool:
        """Whether the E-step runs as a `ClientStep` where each client's data lives. False when
        the class has no `Step`, or a subclass overrides a verb the step stands in for
        (`STEP_VERBS`) without a `Step` of its own: its E-step is then the server-side one."""
        owner = _owner(type(self), "Step")
        if self.Step is None or any(verb in vars(self) for verb in self.STEP_VERBS):
            return False  # (a verb replaced on the instance counts as overridden)
        return all(issubclass(owner, _owner(type(self), verb)) for verb in self.STEP_VERBS)

    @property
    def predicts(self) -> bool:
        """Whether the E-step verbs get `predictions=`: `wants_predictions`, or with a client
        part, its step's (`ClientStep.wants_predictions`)."""
        client_wants = self.client_part and self.Step.wants_predictions
        return self.wants_predictions or client_wants

    def plan_round(self, sampled: list[int]) -> None:  # noqa: B027 (a hook)
        """The round's decisions that need no client data, made before its E-steps with the
        sampled clients in client order (every place; StoCFL gives a cluster its first model),
        for `client_step` to hand on."""

    def score_steps(self, sampled: list[int]) -> dict[int, ClientStep]:
        """The sampled clients whose E-step waits for a decision of the server from their
        scores (FedDrift's drift check: each model's loss on the client's new data), each with
        the step that asks for them: a step that trains nothing, run where the client's data
        is before any `client_step` of the round is made, its upload handed to
        `receive_scores`. Every place; it must not change the state. Default: none."""
        return {}

    def receive_scores(self, client: int, upload: Upload) -> None:
        """Keep what a client's scoring step sent up (every place, in client order, before
        the round's `client_step`s)."""
        raise NotImplementedError(f"{self.name} asks for no scores")

    def client_step(self, client: int) -> ClientStep:
        """The state client `client` needs for its E-step, as a `Step`. It must not change the
        algorithm's state."""
        raise NotImplementedError(f"{self.name} has no client part")

    def receive(self, client: int, upload: Upload) -> None:
        """Keep what client `client` sent up after its E-step (every place, in client order,
        after local training). Default: ω_i."""
        self.omega[client] = upload["omega"].to("cpu", torch.float64)

    def run_client_step(
        self,
        client: int,
        losses: torch.Tensor,
        labels: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The client part run here on given losses and labels, its upload received at once
        (after its scoring step's, where `score_steps` asks for one): γ. (The round loop runs
        the parts where the data lives; this is `assign` for them.)"""
        scoring = self.score_steps([client]).get(client)
        if scoring is not None:
            extra = _predictions(scoring.wants_predictions, predictions, type(scoring).__name__)
            self.receive_scores(client, scoring.run(losses, labels, None, **extra).upload)
        step = self.client_step(client)
        extra = _predictions(step.wants_predictions, predictions, type(step).__name__)
        outcome = step.run(losses, labels, self.memory.get(client), **extra)
        if outcome.memory is not None:
            self.memory[client] = outcome.memory
        self.receive(client, outcome.upload)
        return outcome.gamma

    # --- E-step ---------------------------------------------------------------------------
    def assign(
        self,
        client: int,
        losses: torch.Tensor,
        labels: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """γ (N_i, K) for a sampled client from its per-sample losses under the K models
        (`combine_logits` applied); update any per-client statistics here. Call it through
        `e_step`, which also sets ω_i. With `wants_predictions`, also given `predictions`
        (N_i, K): each sample's arg-max class under each model (a subclass without it may
        leave the argument out). Default: the client part, run here."""
        if self.Step is None:
            raise NotImplementedError(f"{self.name} defines neither assign nor a client part")
        return self.run_client_step(client, losses, labels, predictions)

    def client_omega(self, client: int, gamma: torch.Tensor) -> torch.Tensor:
        """ω_i after the E-step: the mean responsibility (1/N_i) Σ_j γ_{ij} (FedEM's update;
        one-hot for a hard assignment)."""
        return gamma.mean(0).to("cpu", torch.float64)

    def e_step(
        self,
        client: int,
        losses: torch.Tensor,
        labels: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`assign`, then ω_i ← `client_omega`: what the round loop calls for a sampled client
        (with a client part, ω_i is what the client's upload said: `receive`). `predictions`
        (`sample_predictions`) reach `assign` only where it wants them (`predicts`)."""
        extra = _predictions(self.predicts, predictions, self.name)
        gamma = self.assign(client, losses, labels, **extra)
        if not self.client_part:
            self.omega[client] = self.client_omega(client, gamma)
        return gamma

    def assign_held_out(
        self,
        client: int,
        losses: torch.Tensor,
        labels: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A non-participating client's ω from its labelled part (`predictions` as for
        `assign`). Hard-clustering default (protocol §2): the model with the lowest loss; with
        a client part, its `held_out`."""
        if self.Step is not None:
            step = self.client_step(client)
            extra = _predictions(step.wants_predictions, predictions, type(step).__name__)
            return step.held_out(losses, labels, **extra)
        return lowest_loss(losses, self.num_models)

    def assign_unlabeled(
        self, client: int, logits: torch.Tensor, images: torch.Tensor
    ) -> torch.Tensor:
        """A new client's ω from its unlabeled data: its K predictors' logits (K, N, classes)
        and its images. fedrc's fallback for methods without a label-free rule of their own:
        the model whose predictions are the most confident, i.e. the lowest mean entropy
        −Σ_c p_c log p_c; it must not change the algorithm's state."""
        logp = torch.log_softmax(logits.double(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1).mean(1)  # (K,)
        return one_hot(int(entropy.argmin()), self.num_models)

    def held_out_step(
        self,
        client: int,
        losses: torch.Tensor,
        labels: torch.Tensor,
        predictions: torch.Tensor | None = None,
    ) -> None:
        """ω_i ← `assign_held_out`: what evaluation calls for a non-participating client."""
        extra = _predictions(self.predicts, predictions, self.name)
        self.omega[client] = self.assign_held_out(client, losses, labels, **extra)

    def receive_held_out(self, client: int, omega: torch.Tensor) -> None:
        """ω_i of a non-participating client, from its client part's `held_out`."""
        self.omega[client] = omega.to("cpu", torch.float64)

    def reads(self, client: int) -> Rows:
        """The rows of `models` whose logits on client `client`'s training samples its E-step
        (`assign`, through `combine_logits`) and its `local_tasks` (`raw`) read this round: the
        round computes only those, and the others are NaN in what these verbs get (their shape
        and dtype stay). Asked after `plan_round`. With a client part: its step's
        (`ClientStep.reads`). Default: every row; a rule that reads no loss returns ()."""
        if self.client_part:
            return self.client_step(client).reads(self.num_models)
        return tuple(range(self.num_rows))

    # --- local training -------------------------------------------------------------------
    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        """Default (FedEM, FedRC): every model k trains with weights γ_{:,k}, counting N_i."""
        return soft_tasks(gamma, models)

    def retains(self, client: int) -> bool:
        """Whether client's local trainings this round also take its training rows of the
        previous time step (FedDAA's adaptation to a drift that is not real): they follow the
        current step's rows with sample weight 1 in each task, whose `weight` grows by their
        count. Asked on every place after the round's E-steps, in one process and under
        torchrun. Default: no."""
        return False

    def local_lr(self, lr: float) -> float:
        """The learning rate of this round's local trainings, given the schedule's
        (`train.lr_schedule`); called on every place after `begin_round`. Default: the
        schedule's (Adaptive-FedAvg adapts it to drift)."""
        return lr

    # --- aggregation ----------------------------------------------------------------------
    def begin_round(self, models: torch.Tensor) -> None:
        self.sums = torch.zeros(models.shape, dtype=torch.float64, device=models.device)
        self.totals = torch.zeros(models.shape[0], dtype=torch.float64, device=models.device)

    def accumulate(self, row: int, vector: torch.Tensor, weight: float) -> None:
        """sums[row] += weight · vector, totals[row] += weight (`add_into`)."""
        add_into(self.sums[row], vector, weight)
        self.totals[row] += weight

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        """Σ_i w_ik θ_ik and Σ_i w_ik per row k."""
        self.accumulate(task.model, result.params, task.weight)

    def contributions(self) -> list[torch.Tensor]:
        """The round's running sums, added up over places (in place) before `aggregate`."""
        return [self.sums, self.totals]

    def shared_rows(self) -> RowStore | None:
        """Per-client vectors every place needs before `aggregate` (None: nothing to share).
        Whether it is None must not depend on the place."""
        return None

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """θ_k ← θ_k + η_g (Σ_i w_ik θ_ik / Σ_i w_ik − θ_k), or FedOpt's step from that
        pseudo-gradient (`server_step`); a model nobody trained is kept."""
        trained = self.totals > 0
        new = models.clone()
        average = (self.sums[trained] / self.totals[trained, None]).to(models.dtype)
        new[trained] = self.server_step(models, average - models[trained], trained)
        return new

    def server_step(
        self, models: torch.Tensor, delta: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """The new models of `rows` (a mask or indices of `models`) from their pseudo-gradients
        `delta` (average − θ, one per row): θ + η_g Δ, or with `train.server_opt` FedOpt's
        adaptive step on each row's own moments (`pipeline.algorithms.server_opt`)."""
        new, self.server_opt = self.server.step(models, delta, rows, self.server_opt)
        return new

    def end_round(self) -> None:  # noqa: B027 (a hook: most algorithms need none)
        """Nothing to do between rounds unless the algorithm keeps server-side statistics."""

    # --- prediction -----------------------------------------------------------------------
    def combine_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """The K predictors' logits from the rows' (R, N, classes): the first K rows."""
        return raw[: self.num_models]

    def combined_rows(self, predictors: Rows) -> Rows:
        """The rows of `models` whose logits `combine_logits` reads to give these predictors:
        the same rows with the base's (the first K); every row where a subclass combines them
        otherwise without saying (CAM adds the global row)."""
        if _owner(type(self), "combine_logits") is Algorithm and "combine_logits" not in vars(self):
            return predictors
        return tuple(range(self.num_rows))

    def predict_weights(self, client: int) -> torch.Tensor:
        return self.omega[client]

    def omega_table(self) -> torch.Tensor:
        """(clients, K): every client's ω, as used for prediction."""
        return torch.stack([self.predict_weights(i) for i in range(self.num_clients)])

    def personal_model(self, client: int) -> torch.Tensor | None:
        """A client's own model (P,), or the (M, P) rows its predictor mixes
        (`combine_personal`); None where it has none (the ω-weighted K rows predict)."""
        return None

    def combine_personal(self, client: int, logits: torch.Tensor) -> torch.Tensor:
        """The client's own logits (1, N, classes) from those of its `personal_model` rows
        (M, N, classes). Default: the rows as they are (one row: FedSoft's model)."""
        return logits

    def divergence_hint(self, now: str) -> str:
        """What a user lowers when a local training diverges (its step sizes' setting); `now`
        says the run's --lr and, where a schedule or the algorithm moved it, the round's."""
        return f"lower --lr ({now})"

    def as_released(self, switch: str) -> bool:
        """One of the settings that give a released code's departure from its paper (IFCA's
        zero_empty, say); False, the paper's rule, for a method built on this one whose own
        `Settings` does not have it (a plugin's settings need not extend its parent's)."""
        return bool(getattr(self.settings, switch, False))

    def round_info(self) -> dict[str, Any]:
        """Extra numbers for the round's metrics line (e.g. the number of active models)."""
        return {}

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """ω, the attributes named in `state_attributes` and, with an adaptive
        `train.server_opt`, its moments; a checkpoint holds this."""
        declared = {name: getattr(self, name) for name in self.state_attributes}
        if self.server.adaptive:
            declared["server_opt"] = self.server_opt
        return {"omega": self.omega, **declared}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            if isinstance(current, torch.Tensor):
                if current.shape != value.shape:
                    raise ValueError(f"{key}: shape {tuple(value.shape)} != {tuple(current.shape)}")
                value = value.to(current.dtype)
            setattr(self, key, value)


class HardClustering(Algorithm):
    """Every client belongs to one cluster (IFCA, CFL, FeSEM): `assign` returns `hard_gamma`,
    and the client trains that cluster's model alone, on all its samples."""

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        return hard_tasks(gamma, models)


FOLD_CHUNK = 1 << 19  # elements: a 4 MB float64 block, measured fastest on the 2-core EPYC


def add_into(sums: torch.Tensor, vector: torch.Tensor, weight: float) -> None:
    """sums += weight · vector, in the sums' dtype (float64), the numbers of
    `sums.add_(vector, alpha=weight)`. On the CPU a float32 `vector` is first cast to float64 a
    block at a time: torch's add of mixed dtypes runs a casting loop at about half the speed of
    an add of float64 (1.1 against 0.6 ms for the FMNIST CNN), while the block stays in cache
    between its cast and its add (0.9 ms for both). A fold is made once per client and model
    (9,000 a round at 3,000 clients, `benchmarks/many_clients.py`)."""
    if sums.device.type != "cpu" or vector.dtype == sums.dtype:
        sums.add_(vector, alpha=weight)
        return
    block = torch.empty(min(FOLD_CHUNK, vector.numel()), dtype=sums.dtype)
    for part, piece in zip(sums.split(FOLD_CHUNK), vector.split(FOLD_CHUNK)):
        cast = block[: piece.numel()]
        cast.copy_(piece)
        part.add_(cast, alpha=weight)


def _predictions(wanted: bool, predictions: torch.Tensor | None, who: str) -> dict[str, Any]:
    """The optional `predictions=` argument of an E-step verb: only for those that want it."""
    if not wanted:
        return {}
    if predictions is None:
        raise ValueError(f"{who} wants per-sample predictions, and none were given")
    return {"predictions": predictions}


def _owner(cls: type, name: str) -> type:
    """The class of `cls`'s method resolution order that defines `name`."""
    return next(c for c in cls.__mro__ if name in c.__dict__)
