"""Accuracy of every client under its ω, and how cleanly an algorithm clustered the concepts.

Local accuracy: mean test accuracy of the participating clients on their own test splits.
Global accuracy (the paper's primary metric): mean test accuracy of the non-participating
clients, one per concept, each after fitting its ω on its labelled part.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import accuracies, one_hot, per_sample_losses, sample_predictions
from pipeline.data.shards import FederatedData
from pipeline.engine import SequentialExecutor
from pipeline.engine.inference import logits_where
from pipeline.places.communicate import Communicator


def all_logits(
    executor: SequentialExecutor, models: torch.Tensor, data: FederatedData
) -> torch.Tensor:
    """(R, N, classes) logits for every row here; each distinct image goes through a model
    once."""
    if not len(data.distinct):  # a place with no clients (more ranks than clients)
        return models.new_zeros((models.shape[0], 0, data.num_classes))
    return executor.logits(models, data.images[data.distinct])[:, data.inverse]


def distinct_logits(
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    need: torch.Tensor,
    block: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, D, classes) logits on the D distinct images wherever `need` (R, rows) asks for a
    row's image, taking those `block` (an earlier pass's; NaN: not computed) has, and the
    (R, D) mask of what was asked (`logits_where`)."""
    inverse = data.inverse.cpu()
    asked = torch.zeros(models.shape[0], data.distinct.numel(), dtype=torch.bool)
    rows, samples = need.nonzero(as_tuple=True)
    asked[rows, inverse[samples]] = True
    if not len(data.distinct):
        return models.new_zeros((models.shape[0], 0, data.num_classes)), asked
    images, classes = data.images, data.num_classes
    found = logits_where(executor, models, images, asked, classes, block, data.distinct)
    return found, asked


def scoring_need(
    algorithm: Algorithm,
    data: FederatedData,
    omega: torch.Tensor,
    own: dict[int, torch.Tensor],
    clients: list[int],
    cache: bool,
) -> torch.Tensor:
    """(R, rows): the rows' logits that scoring `clients` reads, each with the predictors its
    ω weighs (`accuracies`; none for a client with its own models), and with `cache`, those the
    next round's E-steps read on the participating clients' training rows (`Algorithm.reads`),
    which the evaluation's logits serve."""
    need = torch.zeros(algorithm.num_rows, data.inverse.numel(), dtype=torch.bool)
    participating = set(data.participating)
    for client in clients:
        train, test = data.train_slices[client], data.test_slices[client]
        if client not in own:
            weights = omega[client]
            chosen = {int(weights.argmax()), *(weights > 0).nonzero().flatten().tolist()}
            rows = algorithm.combined_rows(tuple(sorted(chosen)))
            need[list(rows), train.start : test.stop] = True
        if cache and client in participating:
            need[list(algorithm.reads(client)), train] = True
    return need


def personal_logits(
    algorithm: Algorithm, executor: SequentialExecutor, data: FederatedData, clients: list[int]
) -> dict[int, torch.Tensor]:
    """(1, N_i, classes) logits of each client's own model on its rows, where it has one
    (FedSoft's personal models; APFL's two rows, mixed by `combine_personal`)."""
    out = {}
    for client in clients:
        own = algorithm.personal_model(client)
        if own is not None:
            rows = slice(data.train_slices[client].start, data.test_slices[client].stop)
            own = own.reshape(-1, own.shape[-1]).to(data.images.device)
            out[client] = algorithm.combine_personal(
                client, executor.logits(own, data.images[rows])
            )
    return out


def score_clients(
    logits: torch.Tensor,
    data: FederatedData,
    omega: torch.Tensor,
    own: dict[int, torch.Tensor],
    clients: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (all clients, 3) tables, soft and hard: train and test accuracy of `clients` and a 1
    that says it was scored (zeros elsewhere), each predicting with its row of ω, or with its
    own models' logits on its rows where `own` has them (one model: weight 1). All clients in
    one pass (`accuracies`)."""
    tables = torch.zeros((2, len(data.clients), 3), dtype=torch.float64)
    if not clients:
        return tables[0], tables[1]
    logits = logits.clone() if own else logits
    spans, weights = [], []
    for client in clients:
        train, test = data.train_slices[client], data.test_slices[client]
        mine, chosen = own.get(client), omega[client]
        if mine is not None:
            logits[: mine.shape[0], train.start : test.stop] = mine
            if mine.shape[0] != omega.shape[1]:
                chosen = one_hot(0, omega.shape[1])
        spans += [(train.start, train.stop), (test.start, test.stop)]
        weights += [chosen, chosen]
    values = accuracies(logits, data.labels, spans, torch.stack(weights))
    tables[:, clients, 0], tables[:, clients, 1] = values[:, 0::2], values[:, 1::2]
    tables[:, clients, 2] = 1.0
    return tables[0], tables[1]


def summarize(
    data: FederatedData, table: torch.Tensor, groups: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """Client-averaged train / local / global accuracy and the global accuracy per concept,
    from a (clients, 3) table of train and test accuracies of the clients that were scored;
    `clients_scored` says how many when some were not (their node was away). A drifting
    benchmark adds the local accuracy per concept of the step, and each of `groups` (named
    participating clients, e.g. those that just drifted) its mean test accuracy,
    `<name>_accuracy`."""
    scored = table[:, 2] > 0
    part = [c for c in data.participating if scored[c]]
    held = [c for c in data.held_out if scored[c]]
    scores = table.tolist()
    by_concept = {data.manifest.concept_name(h): scores[h][1] for h in held}
    missing = {} if bool(scored.all()) else {"clients_scored": int(scored.sum())}
    return {
        **missing,
        "train_accuracy": float(np.mean([scores[i][0] for i in part])),
        "local_accuracy": float(np.mean([scores[i][1] for i in part])),
        "global_accuracy": float(np.mean([scores[h][1] for h in held])),
        "global_accuracy_by_concept": by_concept,
        **drift_accuracies(data, scores, part, groups or {}),
    }


def drift_accuracies(
    data: FederatedData, scores: list[list[float]], part: list[int], groups: dict[str, list[int]]
) -> dict[str, Any]:
    """`summarize`'s scores of a drifting benchmark from `scores` (clients, 3): the local
    accuracy per concept of the step over the scored participating clients `part`, and each
    group's mean test accuracy over its scored members."""
    found: dict[str, Any] = {}
    if data.time_steps > 1:
        local: dict[str, list[float]] = {}
        for i in part:
            local.setdefault(data.manifest.concept_name(i), []).append(scores[i][1])
        found["local_accuracy_by_concept"] = {k: float(np.mean(v)) for k, v in local.items()}
    for name, members in groups.items():
        values = [scores[i][1] for i in members if scores[i][2] > 0]
        if values:
            found[f"{name}_accuracy"] = float(np.mean(values))
    return found


def fit_held_out(
    algorithm: Algorithm,
    logits: torch.Tensor,
    data: FederatedData,
    comm: Communicator,
    held: list[int],
) -> None:
    """Every non-participating client in `held` (those present) fits its ω on its labelled part
    (on every place, in client order, from the losses, and the predictions if the algorithm
    wants them, that the client's own place computed)."""
    sizes = {h: data.clients[h].train_size for h in held}
    wanted = algorithm.predicts
    losses, labels, guesses = {}, {}, {}
    for h in held:
        if comm.owns(h):
            rows = data.train_slices[h]
            labels[h] = data.labels[rows]
            losses[h] = per_sample_losses(logits[:, rows], labels[h]).float()
            if wanted:
                guesses[h] = sample_predictions(logits[:, rows])
    empty = torch.zeros((0, logits.shape[0]))
    losses = comm.gather(held, losses, sizes, empty)
    labels = comm.gather(held, labels, sizes, torch.zeros(0, dtype=torch.int64))
    if wanted:
        guesses = comm.gather(held, guesses, sizes, empty.long())
    for h in held:
        algorithm.held_out_step(h, losses[h], labels[h], guesses.get(h))


def evaluate_round(
    algorithm: Algorithm,
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    comm: Communicator,
    groups: dict[str, list[int]] | None = None,
) -> tuple[dict[str, Any], torch.Tensor | None, bool]:
    """Held-out E-steps, then soft and hard accuracies of every client, each scored by its
    own place (`score_round`, the held-out fit: `fit_held_out`)."""

    def fit(logits: torch.Tensor, held: list[int]) -> None:
        fit_held_out(algorithm, logits, data, comm, held)

    return score_round(algorithm, executor, models, data, comm, fit, groups)


HeldOutFit = Callable[[torch.Tensor, list[int]], None]  # (K, rows, classes) logits, held-out


def score_round(
    algorithm: Algorithm,
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    comm: Communicator,
    fit: HeldOutFit,
    groups: dict[str, list[int]] | None = None,
) -> tuple[dict[str, Any], torch.Tensor | None, bool]:
    """The held-out clients present fit their ω (`fit`, on their K predictors' logits on every
    model), then every client of this place is scored (`score_clients`; `groups`: see
    `summarize`), in two passes of only the logits they read (`scoring_need`). Returns the
    scores, the raw logits (R, rows, classes) of this place (`kept_logits`; NaN where none was
    needed) and whether every logit computed was finite."""
    present = comm.present(list(range(len(data.clients))))  # asked once: one answer throughout
    mine = [c for c in present if comm.owns(c)]
    here = set(present)
    held = [h for h in data.held_out if h in here]
    need = torch.zeros(algorithm.num_rows, data.inverse.numel(), dtype=torch.bool)
    for h in held:
        if comm.owns(h):
            need[:, data.train_slices[h].start : data.test_slices[h].stop] = True
    block, _ = distinct_logits(executor, models, data, need)
    fit(algorithm.combine_logits(block[:, data.inverse]), held)
    omega = algorithm.omega_table()
    own = personal_logits(algorithm, executor, data, mine)
    cache = len(present) == len(data.clients)
    need |= scoring_need(algorithm, data, omega, own, mine, cache)
    block, asked = distinct_logits(executor, models, data, need, block)
    raw = block[:, data.inverse]
    tables = score_clients(algorithm.combine_logits(raw), data, omega, own, mine)
    comm.sum(list(tables))
    soft, hard = (summarize(data, t, groups) for t in tables)
    scores = {**soft, **{f"hard_{k}": v for k, v in hard.items()}}
    finite = bool(torch.isfinite(block[asked.to(block.device)]).all())
    return scores, kept_logits(raw, present, data), finite


def kept_logits(raw: torch.Tensor, present: list[int], data: FederatedData) -> torch.Tensor | None:
    """The evaluation's logits, which the next round's E-step reuses (the participating
    clients' training rows), or None when a client was absent (`Communicator.present`) and
    its rows were never computed."""
    return raw if len(present) == len(data.clients) else None


def unlabeled_omega(
    algorithm: Algorithm, logits: torch.Tensor, data: FederatedData, omega: torch.Tensor
) -> torch.Tensor:
    """`omega` with each held-out client's row from `assign_unlabeled` on its E-step part
    (logits and images, never its labels): Flux's protocol for new clients."""
    omega = omega.clone()
    for client in data.held_out:
        rows = data.train_slices[client]
        omega[client] = algorithm.assign_unlabeled(client, logits[:, rows], data.images[rows])
    return omega


def concept_purity(omega: np.ndarray, concepts: np.ndarray, sizes: np.ndarray) -> float | None:
    """Share of the ω-mass that falls in each concept's own cluster, clusters matched 1:1.

    mass[c, k] = Σ_{i in concept c} N_i ω_{i;k}; concepts are matched to distinct clusters to
    maximise the matched mass (Hungarian), so 1.0 means every concept sits wholly in a cluster
    of its own, and putting two concepts in one cluster is penalised. None with one model.
    """
    if omega.shape[1] < 2:
        return None
    num_concepts = int(concepts.max()) + 1
    mass = np.zeros((num_concepts, omega.shape[1]))
    np.add.at(mass, concepts, omega * sizes[:, None])
    rows, cols = linear_sum_assignment(-mass)
    return float(mass[rows, cols].sum() / mass.sum())


def label_purity(omega: np.ndarray, histograms: np.ndarray) -> float | None:
    """Share of each label's ω-mass in the cluster that holds most of it: 1.0 when every label
    sits wholly in one cluster (clusters follow the labels), 1/K when every label is spread
    evenly. mass[y, k] = Σ_i n_i(y) ω_{i;k}, with n_i(y) the client's observed labels. Labels may
    share a cluster (no matching): the dual of the paper's Fig. 9 "label distribution within
    each model". None with one model."""
    if omega.shape[1] < 2:
        return None
    mass = histograms.T @ omega
    return float(mass.max(1).sum() / mass.sum())


def finetuned_logits(
    algorithm: Algorithm,
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    seed: int,
) -> dict[int, torch.Tensor]:
    """FedRC-FT (protocol §1): one epoch of γ-weighted fine-tuning of copies of the models on each
    client's training (held-out: E-step) part, then (K, N_i, classes) logits on all its rows.

    The algorithm's E-step runs on a copy, so the global state is untouched.
    """
    scratch = copy.deepcopy(algorithm)
    scratch.plan_round(list(range(len(data.clients))))  # every client takes an E-step
    epochs, executor.local_epochs = executor.local_epochs, 1
    out = {}
    try:
        for client in range(len(data.clients)):
            train, test = data.train_slices[client], data.test_slices[client]
            x, y = data.images[train], data.labels[train]
            raw = executor.logits(models, x)
            combined = scratch.combine_logits(raw)
            guesses = sample_predictions(combined)
            gamma = scratch.e_step(client, per_sample_losses(combined, y), y, guesses)
            own = models.clone()
            for task in scratch.local_tasks(client, gamma, models, raw):
                own[task.model] = executor.train(task, x, y, seed + client).params
            everything = data.images[train.start : test.stop]
            out[client] = algorithm.combine_logits(executor.logits(own, everything))
    finally:
        executor.local_epochs = epochs
    return out
