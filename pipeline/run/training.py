"""The federated round loop (FedRC paper, Algorithm 1), written once for every algorithm and
every place it runs: one process, or torchrun's ranks (`pipeline.places.communicate`).

sample clients → E-step with the received models → γ-weighted local training of the K models,
each result folded into the algorithm's running sums and dropped → sums combined over places →
server aggregation → server bookkeeping (FedRC's C_{y,k}) → evaluate → log and checkpoint.
On a drifting benchmark each round trains on its time step's data (`pipeline.data.time_steps`); the
last round of a step is also scored on the next step's data, before any round has seen it.
A round holds K × model of sums and one chunk of local trainings, whatever the number of
clients.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientStep, Memory, Upload, sample_predictions
from pipeline.algorithms.settings import CAMSettings
from pipeline.common.checks import require_finite
from pipeline.common.errors import FedrcError, FedrcWarning, counted
from pipeline.common.run_lock import writer_lock
from pipeline.config import TrainConfig
from pipeline.data.drift import drifted
from pipeline.data.shards import FederatedData, data_digest
from pipeline.data.time_steps import ends_step, step_of
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.engine.task import Job, LocalResult, LocalTask
from pipeline.evaluation.accuracy import evaluate_round, per_sample_losses
from pipeline.places import distributed
from pipeline.places.communicate import Communicator
from pipeline.run import files as rf
from pipeline.run.checkpoints import Checkpoints, checkpoint_interval, resume_run
from pipeline.run.clients import (
    ClientWork,
    LocalClients,
    train_logits,
    training_rows,
    with_retained,
)
from pipeline.run.folder import clear_run, open_run_dir
from pipeline.run.log import RunLog
from pipeline.run.schedule import scheduled_lr
from pipeline.run.setup import (
    ClientsFactory,
    ExecutorFactory,
    Progress,
    Run,
    build_run,
    load_data,
    make_executor,
)
from pipeline.run.trackers import require_trackers
from pipeline.run.traffic import Traffic

RoundCallback = Callable[[dict[str, Any]], None]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FedrcError("--device: cuda requested but torch sees no GPU (use auto or cpu)")
    return torch.device(name)


def sample_clients(clients: list[int], participation: float, seed: int, round_: int) -> list[int]:
    """The round's participants, a pure function of (seed, round) so a resumed run agrees."""
    count = max(1, round(len(clients) * participation))
    rng = np.random.default_rng([seed, round_])
    return sorted(rng.choice(clients, size=count, replace=False).tolist())


def local_seed(seed: int, round_: int, client: int) -> int:
    return int(np.random.SeedSequence([seed, round_, client]).generate_state(1)[0])


def train_round(round_: int, run: Run, cached_logits: torch.Tensor | None) -> dict[str, Any]:
    """One round of Algorithm 1: updates `run.models`, returns the round's metrics."""
    config, data, comm, algorithm = run.config, run.data, run.comm, run.algorithm
    sampled = sample_clients(data.participating, config.participation, config.seed, round_)
    sampled = algorithm.round_clients(round_, sampled, data.participating)
    sampled = comm.present(sampled)  # a client whose node is away sits the round out
    sizes = {c: data.clients[c].train_size for c in sampled}
    mine = [c for c in sampled if comm.owns(c)]
    run.traffic = Traffic()
    for _ in mine:  # each client's E-step scores every model row it receives
        run.traffic.down(run.models)
    if algorithm.wants_true_concepts():  # an oracle setting asked for the benchmark's truth
        algorithm.true_concepts(data.manifest.concepts, [c.concept for c in data.clients])
    algorithm.begin_round(run.models)
    lr = run.executor.lr = algorithm.local_lr(scheduled_lr(config, round_))  # every place
    algorithm.plan_round(sampled)
    wanted = algorithm.wants_statistics(sampled)
    if wanted:
        observe_statistics(run, wanted)
    if algorithm.client_part:
        loss_sum = client_parts(run, round_, sampled, mine, cached_logits)
    else:
        raw, losses, guesses = estep_inputs(run, mine, cached_logits)  # Alg. 1 line 5
        labels = {c: data.labels[data.train_slices[c]] for c in mine}
        run.traffic.up([losses, labels, guesses])  # what the server's E-step reads
        losses = comm.gather(sampled, losses, sizes, torch.zeros(0, algorithm.num_models))
        labels = comm.gather(sampled, labels, sizes, torch.zeros(0, dtype=torch.int64))
        if algorithm.predicts:
            empty = torch.zeros((0, algorithm.num_models), dtype=torch.int64)
            guesses = comm.gather(sampled, guesses, sizes, empty)
        # Every place assigns every sampled client, in client order: the state stays identical.
        gammas = {
            c: algorithm.e_step(c, losses[c], labels[c], guesses.get(c)).detach() for c in sampled
        }
        loss_sum = train_and_fold(run, round_, local_jobs(run, round_, mine, gammas, raw))
    traffic = run.traffic.tensor(comm.device)
    comm.sum([*algorithm.contributions(), loss_sum, traffic])
    shared = algorithm.shared_rows()
    if shared is not None:
        comm.share(shared)
    run.models = algorithm.aggregate(run.models)  # e.g. θ_k ← Σ_i N_i θ_ik / Σ_i N_i
    algorithm.end_round()
    kept = sum(data.previous_train_size(c) for c in sampled if algorithm.retains(c))
    seen = (sum(sizes.values()) + kept) * config.local_epochs
    row = {"train_loss": float(loss_sum) / max(seen, 1), "clients": len(sampled)}
    row.update(Traffic.row(traffic))
    if config.lr_schedule != "constant" or type(algorithm).local_lr is not Algorithm.local_lr:
        row["lr"] = lr  # the round's local learning rate, in a run where it moves
    return {**row, **algorithm.round_info()}


def client_parts(
    run: Run, round_: int, sampled: list[int], mine: list[int], cached: torch.Tensor | None
) -> torch.Tensor:
    """Alg. 1 lines 5–7 with the algorithm's client part: each client of this place runs its
    E-step and local trainings where its data is (`run.clients`), the results folded as they
    come; then every place receives every client's upload, in client order. Clients whose
    E-step needs the server's decision on their scores first (`Algorithm.score_steps`) send
    them in a pass before; one that did not answer it sits the round out. Returns this place's
    Σ loss."""
    algorithm = run.algorithm
    scoring = algorithm.score_steps(sampled)
    if scoring:
        steps = {c: step for c, step in scoring.items() if c in mine}
        _, scores = run_parts(run, round_, steps, mine, cached)
        for client in sampled:
            if client in scores:
                algorithm.receive_scores(client, scores[client][0])
        mine = [c for c in run.comm.present(mine) if c not in scoring or c in scores]
    steps = {c: algorithm.client_step(c) for c in mine}
    loss_sum, outcomes = run_parts(run, round_, steps, mine, cached)
    for client in sampled:
        if client not in outcomes:  # its node was lost before it answered
            continue
        upload, memory = outcomes[client]
        if memory is not None:
            algorithm.memory[client] = memory
        algorithm.receive(client, upload)
    return loss_sum


def run_parts(
    run: Run,
    round_: int,
    steps: dict[int, ClientStep],
    covered: list[int],
    cached: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[int, tuple[Upload, Memory | None]]]:
    """The `steps` of this place's clients run where their data is, their results folded as
    they come (`covered`: the clients whose logits one block holds). Returns this place's
    Σ loss and every place's outcomes (upload, memory) by client."""
    algorithm, config = run.algorithm, run.config

    def skipped(task: LocalTask, result: LocalResult) -> None:
        algorithm.fold(task.client, task, result)

    work = ClientWork(
        run.data,
        run.models,
        steps,
        {c: local_seed(config.seed, round_, c) for c in steps},
        algorithm.memory,
        config.skip_below,
        algorithm.num_models,
        cached,
        covered,
        lambda task: run.momentum.attach(task, run.models.device),
        skipped,
    )
    run.traffic.down([step.values() for step in steps.values()])
    loss_sum = fold_results(run, round_, run.clients.train(work))
    run.traffic.up([upload for upload, _ in work.outcomes.values()])
    outcomes = {}
    for part in run.comm.all_gather_object(work.outcomes):
        outcomes.update(part)
    return loss_sum, outcomes


def observe_statistics(run: Run, clients: list[int]) -> None:
    """Each client's statistic (`Algorithm.describe`), computed on the place holding its data
    and handed to the algorithm on every place, in client order."""
    data, algorithm = run.data, run.algorithm
    local = {}
    for client in clients:
        if run.comm.owns(client):
            rows = data.train_slices[client]
            statistic = algorithm.describe(client, data.images[rows], data.labels[rows], run.models)
            local[client] = statistic.detach().to("cpu", torch.float32).flatten()
    run.traffic.up(local)
    gathered = {}
    for part in run.comm.all_gather_object(local):
        gathered.update(part)
    for client in clients:
        algorithm.observe(client, gathered[client])


def estep_inputs(
    run: Run, clients: list[int], cached: torch.Tensor | None
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Each client's raw logits (R, N_i, classes) under the received models, its E-step
    losses (N_i, K) and, for an algorithm that wants them (`predicts`), its predictions (N_i, K;
    else none), from one pass over the rows the algorithm reads of each client
    (`Algorithm.reads`; NaN elsewhere, `train_logits`)."""
    data, algorithm = run.data, run.algorithm
    reads = {c: algorithm.reads(c) for c in clients}
    block, parts = train_logits(run.executor, run.models, data, clients, reads, cached)
    combined = algorithm.combine_logits(block)
    labels = torch.cat([data.labels[data.train_slices[c]] for c in clients] or [data.labels[:0]])
    losses = per_sample_losses(combined, labels)
    guesses = {}
    if algorithm.predicts:
        predicted = sample_predictions(combined)
        guesses = {c: predicted[parts[c]] for c in clients}
    return (
        {c: block[:, parts[c]] for c in clients},
        {c: losses[parts[c]] for c in clients},
        guesses,
    )


def local_jobs(
    run: Run,
    round_: int,
    clients: list[int],
    gammas: dict[int, torch.Tensor],
    raw: dict[int, torch.Tensor],
) -> Iterator[Job]:
    """The clients' local trainings, each built only when the executor asks for it.

    With `skip_below` δ > 0, a task whose mean sample weight (for FedEM and FedRC: ω_{i;k}) is
    below δ is not trained: its gradient is scaled by that weight, so the model would hardly
    move, and it is folded in unchanged (its weight in the average is kept; its loss counts 0)."""
    data, algorithm, device = run.data, run.algorithm, run.models.device
    skip_below = run.config.skip_below
    for client in clients:
        images, labels, added = training_rows(data, algorithm, client)
        seed = local_seed(run.config.seed, round_, client)
        for task in algorithm.local_tasks(client, gammas.pop(client), run.models, raw.pop(client)):
            task.client = client
            if skip_below > 0 and float(task.weights.mean()) < skip_below:
                algorithm.fold(client, task, LocalResult(task.start.clone(), 0.0, None))
                continue
            run.momentum.attach(task, device)
            yield with_retained(task, added), images, labels, seed


def train_and_fold(run: Run, round_: int, jobs: Iterator[Job]) -> torch.Tensor:
    """Local training (Alg. 1 lines 6–7) on this place's executor: `fold_results`."""
    return fold_results(run, round_, run.executor.stream(jobs))


def fold_results(run: Run, round_: int, results: Iterator[tuple[Job, LocalResult]]) -> torch.Tensor:
    """Each local result is folded into the algorithm's sums and dropped. Returns this place's
    Σ loss; every place stops if one diverged."""
    loss_sum = torch.zeros(1, dtype=torch.float64, device=run.comm.device)
    error = None
    try:
        for (task, *_), result in results:
            run.momentum.keep(task, result)
            run.algorithm.fold(task.client, task, result)
            run.traffic.up([result.params, result.prototypes])  # the trained model goes up
            loss_sum += result.loss_sum
    except NonFiniteLoss as e:
        task = e.job[0]
        error = (
            f"round {round_}, client {task.client}, model {task.model}: {e} — training "
            f"diverged; {divergence_hint(run, round_)}"
        )
    run.momentum.flush()  # the last chunk's buffers
    failed = next((e for e in run.comm.all_gather_object(error) if e is not None), None)
    if failed is not None:
        raise FedrcError(failed)
    return loss_sum


def divergence_hint(run: Run, round_: int) -> str:
    """What to change when training diverged: the lr (and this round's, where a schedule
    changed it), or, in the first round after a resume, perhaps the checkpoint (a state no
    training wrote: edited or damaged)."""
    lr = run.executor.lr
    now = f"now {run.config.lr}" + (f"; this round {lr:.4g}" if lr != run.config.lr else "")
    hint = run.algorithm.divergence_hint(now)  # the algorithm's step sizes (pFedMe: its own)
    if run.resumed_at and round_ == run.resumed_at + 1:
        hint += (
            f", unless checkpoint.pt (round {run.resumed_at}, which this run resumed from) "
            "was edited or damaged: in that case resume from a good copy or --overwrite"
        )
    return hint


def warn_no_clusters(config: TrainConfig, settings: object) -> None:
    """A warm-up (Fed-CAM's β) as long as the run: the clusters never form, and the run is the
    global model's FedAvg under the algorithm's name."""
    if isinstance(settings, CAMSettings) and settings.warmup_rounds >= config.rounds:
        warnings.warn(
            FedrcWarning(
                f"warmup_rounds: {settings.warmup_rounds} of the run's {config.rounds} rounds: "
                f"the clusters never form and {config.algorithm} trains the global model alone; "
                "set --set warmup_rounds=N below train.rounds (the paper: 30 of 100)"
            ),
            stacklevel=2,
        )


def warn_server_step(config: TrainConfig) -> None:
    """An adaptive server optimizer at η_g = 1: FedOpt moves every coordinate by up to about
    η_g a round, whatever its update, which the models do not survive."""
    if config.server_opt != "sgd" and config.server_lr >= 1:
        warnings.warn(
            FedrcWarning(
                f"server_lr: {config.server_lr:g} with server_opt {config.server_opt} moves "
                "every parameter by up to about that much a round; FedOpt's paper tunes it "
                "between 1e-3 and 1 (e.g. --server-lr 0.01)"
            ),
            stacklevel=2,
        )


def warn_spare_models(run: Run, data: str) -> None:
    """K above the number of participating clients: some clusters can have no client."""
    k, clients = run.algorithm.num_models, len(run.data.participating)
    if k > clients:
        warnings.warn(
            FedrcWarning(
                f"--clusters: K = {k} exceeds the {clients} participating clients of {data}; "
                f"at least {counted(k - clients, 'cluster')} will have no client of their own"
            ),
            stacklevel=2,
        )


def evaluation_checked(
    run: Run, round_: int, data: FederatedData, groups: dict[str, list[int]] | None = None
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """The round's scores and logits on `data` (None where they stayed on the nodes); every
    place stops when one place's logits diverged."""
    if run.algorithm.client_part:
        evaluate = partial(run.clients.evaluate, run.algorithm)
    else:
        evaluate = partial(evaluate_round, run.algorithm, run.executor)
    scores, logits, finite = evaluate(run.models, data, run.comm, groups)
    diverged = run.comm.any(not finite)
    bad = torch.tensor([float("nan")]) if diverged else None
    require_finite(f"round {round_}: evaluation", scores, bad, divergence_hint(run, round_))
    return scores, logits


def movers(data: FederatedData, step: int) -> list[int]:
    """The participating clients whose concept changes at `step` (none at step 0)."""
    if not 0 < step < data.time_steps:
        return []
    full = data.benchmark
    return [full.participating[i] for i in drifted(np.asarray(full.schedule), step)]


def drift_groups(data: FederatedData, step: int) -> dict[str, list[int]]:
    """Who drifted into this step, and who drifts out of it next (scored before their drift)."""
    groups = {"drifted": movers(data, step), "drifting": movers(data, step + 1)}
    return {name: clients for name, clients in groups.items() if clients}


def next_step_scores(
    run: Run, full: FederatedData, step: int, round_: int
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """The models and ω at the end of `step` scored on step + 1's data, which no round has
    trained on yet (FedDrift's protocol: train on t, test on t + 1). The algorithm's state is
    restored afterwards (the held-out clients fit their ω again), so the run goes on as if this
    had not happened; the logits are the next round's E-step's."""
    saved = copy.deepcopy(run.algorithm.state_dict())
    groups = {"drifted": movers(full, step + 1)}
    try:
        scores, logits = evaluation_checked(run, round_, full.at_step(step + 1), groups)
    finally:
        run.algorithm.load_state_dict(saved)
    keys = ("local_accuracy", "hard_local_accuracy", "local_accuracy_by_concept")
    kept = {f"next_{k}": scores[k] for k in keys if k in scores}
    if "drifted_accuracy" in scores:
        kept["next_drifted_accuracy"] = scores["drifted_accuracy"]
    return kept, logits


def run_training(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_round: RoundCallback | None = None,
    executor_factory: ExecutorFactory = make_executor,
) -> Path:
    """Train in this process, or as one rank of a torchrun job (the clients shared out).
    `executor_factory`: how the run's executor is made (a sweep's cohort hands in its own)."""
    if not distributed.launched():
        comm = Communicator(resolve_device(config.device))
        return train_run(config, comm, resume, overwrite, on_round, None, executor_factory)
    if config.device == "cuda":
        resolve_device("cuda")  # no GPU: the same one-line error on every rank
    with distributed.Group.start(config.device) as group:
        return train_run(config, group, resume, overwrite, on_round, None, executor_factory)


def train_run(
    config: TrainConfig,
    comm: Communicator,
    resume: bool,
    overwrite: bool,
    on_round: RoundCallback | None,
    data: FederatedData | None = None,
    executor_factory: ExecutorFactory = make_executor,
    clients_factory: ClientsFactory = LocalClients,
) -> Path:
    """The run on this place; `data`, `executor_factory` and `clients_factory` are given where
    the samples are elsewhere (a Flower server: row ids in place of images, an executor and
    client parts that ask the nodes).

    The main place, which writes the run's files, holds the run folder's lock throughout: a
    second writer is refused on every place (`pipeline.common.run_lock`)."""
    require_trackers(config.log)  # a missing extra stops the run before its folder is touched
    with ExitStack() as held:

        def lock() -> None:
            held.enter_context(writer_lock(config.out, "--out", "fedrc train"))

        comm.agree(lock, everywhere=False)
        data = load_data(config, comm) if data is None else data
        config = config.over_steps(data.time_steps)  # the rounds of each time step, fixed
        with ExitStack() as opened:
            factories = (executor_factory, clients_factory)
            run, progress, log, checkpoints = open_run(
                config, comm, data, resume, overwrite, factories, opened
            )
            fresh = progress.round == 0
            try:
                round_loop(run, data, progress, log, checkpoints, on_round)
            except BaseException:
                # stopped before its first checkpoint: what it wrote can be neither resumed
                # nor used (a failure, Ctrl-C); a kill leaves it, and the next run starts over
                if fresh and comm.is_main and not (Path(config.out) / rf.CHECKPOINT).exists():
                    opened.close()  # DVCLive lets go of its files first
                    clear_run(Path(config.out))
                raise
        checkpoints.save_model(run)
    return Path(config.out)


def open_run(
    config: TrainConfig,
    comm: Communicator,
    data: FederatedData,
    resume: bool,
    overwrite: bool,
    factories: tuple[ExecutorFactory, ClientsFactory],
    opened: ExitStack,
) -> tuple[Run, Progress, RunLog, Checkpoints]:
    """A new run, or one resumed from its checkpoint in `--out` once its identity (the
    configuration and the data's digest) is checked; its momentum store and record are closed
    by `opened`. Every step that can fail on one place only is agreed on."""
    out = Path(config.out)
    ready = comm.agree(lambda: open_run_dir(out, resume, overwrite), everywhere=False)
    resume = comm.broadcast_object(ready)  # a run stopped before its checkpoint starts over
    digest = data_digest(data.manifest)
    identity = rf.run_identity(config, digest)
    wanted = json.loads(identity)
    run = comm.agree(lambda: build_run(config, data, comm, out, *factories))
    opened.callback(run.momentum.close)
    if comm.is_main:
        warn_spare_models(run, config.data)
        warn_no_clusters(config, run.algorithm.settings)
        warn_server_step(config)
    progress = resume_run(run, out, wanted) if resume else Progress()
    run.resumed_at = progress.round
    log = RunLog(run, out, digest)
    opened.callback(log.close)
    log.open(progress, resume)
    return run, progress, log, Checkpoints(out, identity, checkpoint_interval(config, run))


def round_loop(
    run: Run,
    full: FederatedData,
    progress: Progress,
    log: RunLog,
    checkpoints: Checkpoints,
    on_round: RoundCallback | None,
) -> None:
    """The rounds after `progress.round` up to the last, each logged, checkpointed when due and
    handed to `on_round` (the main place)."""
    for round_ in range(progress.round + 1, run.config.rounds + 1):
        row = play_round(round_, run, full, progress)
        log.add(row, progress)
        if checkpoints.due(run, round_):
            log.checkpoint(progress, lambda into: checkpoints.save(run, progress, into))
        if run.comm.is_main and on_round is not None:
            on_round(row)


def play_round(round_: int, run: Run, full: FederatedData, progress: Progress) -> dict[str, Any]:
    """One round on its time step's data (`full` holds every step): train, then evaluate when
    due and, at the end of a step, score the next step's data. Returns the round's row."""
    tic = time.perf_counter()
    config, steps, per_step = run.config, full.time_steps, run.config.rounds_per_step
    step = step_of(round_, per_step, steps)
    run.data = full.at_step(step)
    if steps > 1 and (round_ == 1 or step_of(round_ - 1, per_step, steps) != step):
        run.algorithm.begin_step(step)
    row = train_round(round_, run, progress.cached)
    progress.round, progress.cached = round_, None
    boundary = ends_step(round_, per_step, steps)
    if round_ % config.eval_every == 0 or round_ == config.rounds or boundary:
        groups = drift_groups(full, step)
        scores, progress.cached = evaluation_checked(run, round_, run.data, groups)
        row.update(scores)
        progress.eval_rounds.append(round_)
        progress.history.append(run.algorithm.omega_table().float())
    if boundary:
        scores, progress.cached = next_step_scores(run, full, step, round_)
        row.update(scores)
    at = {"step": step} if steps > 1 else {}
    wire = run.comm.measured_bytes()  # a Flower deployment's records, evaluation included
    return {"round": round_, **at, **row, **wire, "seconds": time.perf_counter() - tic}
