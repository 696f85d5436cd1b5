"""Where the client parts of a round run (`pipeline.algorithms.client`): on the place holding
the clients' data. `LocalClients` runs them here (one process, a torchrun rank); a Flower server
replaces it with one that sends each part to the node holding the client
(`pipeline.flower.server.RemoteClients`): the same step, the same code, on the node's data.

Per round, each client: logits of the model rows its step reads (`ClientStep.reads`; none for
a step whose cluster is chosen) on its training rows → those of the K predictors
(`Algorithm.combine_logits`: the first K rows) → per-sample losses → its step's E-step (γ stays
here, the upload is kept for the server) → its local trainings, weighted by γ. In evaluation:
a held-out client's ω from the K predictors' logits on its labelled part, then every client's
soft and hard accuracies on its training and test parts, from the predictors its ω weighs
(`pipeline.evaluation.accuracy.score_round`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import ClientStep, Memory, Rows, Upload, per_sample_losses
from pipeline.data.shards import FederatedData
from pipeline.engine import SequentialExecutor
from pipeline.engine.inference import logits_where
from pipeline.engine.task import Job, LocalResult, LocalTask
from pipeline.evaluation.accuracy import score_round, summarize
from pipeline.places.communicate import Communicator


def training_rows(
    data: FederatedData, algorithm: Algorithm, client: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The images and labels client's local trainings take: its training rows, then its
    previous step's where the algorithm retains them (`Algorithm.retains`); and how many of
    those were added."""
    rows = data.train_slices[client]
    before = data.previous_train(client) if algorithm.retains(client) else slice(0, 0)
    if before.stop == before.start:
        return data.images[rows], data.labels[rows], 0
    spans = [torch.arange(s.start, s.stop) for s in (rows, before)]
    index = torch.cat(spans).to(data.labels.device)
    return data.images[index], data.labels[index], before.stop - before.start


def with_retained(task: LocalTask, added: int) -> LocalTask:
    """`task` over `added` retained rows more: each with sample weight 1, the task's weight
    grown by their count."""
    if added == 0:
        return task
    if task.offset is not None:
        raise ValueError("a task with per-sample logit offsets cannot take retained rows")
    task.weights = torch.cat([task.weights, task.weights.new_ones(added)])
    task.weight += added
    return task


@dataclass
class ClientWork:
    """A round's client parts on one place: what they need and where their outcomes go."""

    data: FederatedData
    models: torch.Tensor
    steps: dict[int, ClientStep]  # client → its step, in client order
    seeds: dict[int, int]  # client → the seed of its local trainings' batches
    memory: dict[int, Memory]  # client → its memory from its previous E-step (here)
    skip_below: float  # `TrainConfig.skip_below`
    predictors: int  # K: the E-step's losses are those of the first K rows
    cached: torch.Tensor | None = None  # (R, N, classes) logits of these models, if known
    # the clients whose training rows one block of logits covers (default: the steps'): a
    # scoring pass covers the whole round's, so that each logit is computed as in the round
    covered: list[int] | None = None
    attach: Callable[[LocalTask], None] = lambda task: None  # persistent momentum
    skipped: Callable[[LocalTask, LocalResult], None] = lambda task, result: None  # fold it
    outcomes: dict[int, tuple[Upload, Memory | None]] = field(default_factory=dict)


def client_jobs(
    step: ClientStep,
    client: int,
    raw: torch.Tensor,
    images: torch.Tensor,
    labels: torch.Tensor,
    seed: int,
    work: ClientWork,
) -> Iterator[Job]:
    """One client's part where its data is: E-step on its logits `raw` (R, N_i, classes), its
    outcome kept in `work.outcomes`, then its local trainings as jobs. A task whose mean sample
    weight is below `skip_below` is not trained but handed to `work.skipped` unchanged."""
    predictors = raw[: work.predictors]
    losses, memory = per_sample_losses(predictors, labels), work.memory.get(client)
    outcome = step.run(losses, labels, memory, **step.extra(predictors))
    work.outcomes[client] = (outcome.upload, outcome.memory)
    for task in step.local_tasks(outcome.gamma.detach(), work.models):
        task.client = client
        if work.skip_below > 0 and float(task.weights.mean()) < work.skip_below:
            work.skipped(task, LocalResult(task.start.clone(), 0.0, None))
            continue
        work.attach(task)
        yield task, images, labels, seed


def held_out_omega(step: ClientStep, raw: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A non-participating client's ω from the K predictors' logits (K, N, classes) of its
    labelled part."""
    return step.held_out(per_sample_losses(raw, labels).float(), labels, **step.extra(raw))


class LocalClients:
    """The client parts of the clients this place holds, run here on `executor`."""

    def __init__(self, executor: SequentialExecutor) -> None:
        self.executor = executor

    def train(self, work: ClientWork) -> Iterator[tuple[Job, LocalResult]]:
        """Every client's E-step and local trainings; results as the executor yields them."""
        return self.executor.stream(self.jobs(work))

    def jobs(self, work: ClientWork) -> Iterator[Job]:
        data = work.data
        covered = list(work.steps) if work.covered is None else work.covered
        reads = {c: step.reads(work.predictors) for c, step in work.steps.items()}
        block, parts = train_logits(self.executor, work.models, data, covered, reads, work.cached)
        for client, step in work.steps.items():
            rows = data.train_slices[client]
            images, labels = data.images[rows], data.labels[rows]
            raw, seed = block[:, parts[client]], work.seeds[client]
            yield from client_jobs(step, client, raw, images, labels, seed, work)

    def evaluate(
        self,
        algorithm: Algorithm,
        models: torch.Tensor,
        data: FederatedData,
        comm: Communicator,
        groups: dict[str, list[int]] | None = None,
    ) -> tuple[dict[str, Any], torch.Tensor | None, bool]:
        """As `evaluate_round` for an algorithm with a client part: each held-out client's ω
        from its step, then each client's accuracies, both where its data is. Returns the
        scores, the logits of this place's rows (None where they stay on the nodes or a client
        was absent) and whether every logit was finite."""

        def fit(predictors: torch.Tensor, held: list[int]) -> None:
            omegas = {}
            for h in held:
                if comm.owns(h):
                    rows = data.train_slices[h]
                    step = algorithm.client_step(h)
                    omegas[h] = held_out_omega(step, predictors[:, rows], data.labels[rows])
            receive_held_out(algorithm, comm, omegas)

        return score_round(algorithm, self.executor, models, data, comm, fit, groups)


def train_logits(
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    clients: list[int],
    reads: dict[int, Rows],
    cached: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[int, slice]]:
    """(R, n, classes) logits on the training rows of `clients`, one after another in one
    block (not a tensor per client allocated between large activations, which fragments the
    heap), computed only for the rows each client's E-step reads (`reads`; a client not in it:
    none) and not already in `cached` (R, rows, classes: an evaluation's logits of these
    models; NaN where not computed); NaN elsewhere. Also each client's slice of the block."""
    spans = [data.train_slices[c] for c in clients]
    index = torch.cat([torch.arange(s.start, s.stop) for s in spans] or [torch.zeros(0).long()])
    index = index.to(data.labels.device)
    need = torch.zeros(models.shape[0], index.numel(), dtype=torch.bool)
    parts, end = {}, 0
    for client, span in zip(clients, spans):
        parts[client] = slice(end, end + span.stop - span.start)
        need[list(reads.get(client, ())), parts[client]] = True
        end = parts[client].stop
    known = None if cached is None else cached[:, index]
    return logits_where(executor, models, data.images, need, data.num_classes, known, index), parts


def receive_held_out(algorithm: Algorithm, comm: Communicator, omegas: dict[int, Any]) -> None:
    """Every place's held-out ω on every place, received in client order."""
    gathered = {}
    for part in comm.all_gather_object(omegas):
        gathered.update(part)
    for h in sorted(gathered):
        algorithm.receive_held_out(h, gathered[h])


def score_tables(
    data: FederatedData,
    comm: Communicator,
    accuracy: dict[int, torch.Tensor],
    groups: dict[str, list[int]] | None,
) -> dict[str, Any]:
    """The round's scores (`summarize`, soft and `hard_`) from each scored client's (2, 2)
    accuracies (`accuracies`), summed over places."""
    tables = [torch.zeros((len(data.clients), 3), dtype=torch.float64) for _ in range(2)]
    for client, values in accuracy.items():
        for row, table in enumerate(tables):
            table[client, :2] = values[row]
            table[client, 2] = 1.0
    comm.sum(tables)
    soft, hard = (summarize(data, t, groups) for t in tables)
    return {**soft, **{f"hard_{k}": v for k, v in hard.items()}}
