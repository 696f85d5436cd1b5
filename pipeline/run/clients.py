"""Where the client parts of a round run (`pipeline.algorithms.client`): on the place holding
the clients' data. `LocalClients` runs them here (one process, a torchrun rank); a Flower server
replaces it with one that sends each part to the node holding the client
(`pipeline.flower.server.RemoteClients`): the same step, the same code, on the node's data.

Per round, each client: logits of the model rows on its training rows → those of the K
predictors (`Algorithm.combine_logits`: the first K rows) → per-sample losses → its step's
E-step (γ stays here, the upload is kept for the server) → its local trainings, weighted by γ.
In evaluation, each client: the K predictors' logits on all its rows → a held-out client's ω
from its labelled part → its soft and hard accuracies on its training and test parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import (
    ClientStep,
    Memory,
    Upload,
    client_accuracy,
    per_sample_losses,
)
from pipeline.data.shards import FederatedData
from pipeline.engine import SequentialExecutor
from pipeline.engine.task import Job, LocalResult, LocalTask
from pipeline.evaluation.accuracy import all_logits, kept_logits, summarize
from pipeline.places.communicate import Communicator


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
        spans = [data.train_slices[c] for c in covered]
        index = torch.cat([torch.arange(s.start, s.stop) for s in spans] or [torch.zeros(0).long()])
        index = index.to(data.labels.device)
        # after an evaluation round the logits of these models on these samples are known
        block = (
            self.executor.logits(work.models, data.images[index])
            if work.cached is None
            else work.cached[:, index]
        )
        ends = np.cumsum([s.stop - s.start for s in spans]).tolist()
        parts = {c: slice(end - (s.stop - s.start), end) for c, s, end in zip(covered, spans, ends)}
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
        present = comm.present(list(range(len(data.clients))))
        mine = [c for c in present if comm.owns(c)]
        raw = all_logits(self.executor, models, data, mine)
        predictors = algorithm.combine_logits(raw)
        omegas = {}
        for h in data.held_out:
            if h in mine:
                rows = data.train_slices[h]
                step = algorithm.client_step(h)
                omegas[h] = held_out_omega(step, predictors[:, rows], data.labels[rows])
        receive_held_out(algorithm, comm, omegas)
        omega = algorithm.omega_table()
        accuracy = {}
        for c in mine:
            train, test = data.train_slices[c], data.test_slices[c]
            rows = slice(train.start, test.stop)
            size = train.stop - train.start
            accuracy[c] = client_accuracy(predictors[:, rows], data.labels[rows], size, omega[c])
        scores = score_tables(data, comm, accuracy, groups)
        return scores, kept_logits(raw, present, data), bool(torch.isfinite(raw).all())


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
    accuracies (`client_accuracy`), summed over places."""
    tables = [torch.zeros((len(data.clients), 3), dtype=torch.float64) for _ in range(2)]
    for client, values in accuracy.items():
        for row, table in enumerate(tables):
            table[client, :2] = values[row]
            table[client, 2] = 1.0
    comm.sum(tables)
    soft, hard = (summarize(data, t, groups) for t in tables)
    return {**soft, **{f"hard_{k}": v for k, v in hard.items()}}
