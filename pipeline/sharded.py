"""One experiment over several ranks (torchrun): the clients are sharded, the state is not.

Every rank holds the whole algorithm state (the K models, ω, FedRC's label tables and Adam
moments, CFL's pending lists, FedSoft's personal models …) and keeps it identical to every other
rank's, so the run computes the single-process numbers (up to the order of float sums):

- ownership: participating client i (i-th in id order) belongs to rank i mod W, and so does
  the i-th held-out client. It never changes, so a rank loads only its own clients' shards and
  keeps their persistent SGD momentum (if enabled) for the whole run.
- E-step: the round's sample is a pure function of (seed, round); each rank computes the
  per-sample losses (N_i, K) of its sampled clients, the ranks all-gather them (with the
  labels), and EVERY rank calls `assign` for every sampled client in client order.
- local training: each rank trains its clients' tasks with the usual executor.
- aggregation: algorithms whose `receive` only adds N_i-weighted terms (`Algorithm.summed`:
  fedavg, fedprox, ifca, fedem, fedrc, ifca-cam) receive their own results and all-reduce those
  sums (K×P); the others (cfl, fesem, fedsoft, fesem-cam) all-gather every trained model so that
  every rank calls `receive` for every client in client order. Then every rank aggregates.
- evaluation: each rank scores its own clients; the held-out clients' E-step losses are
  gathered so every rank fits every held-out ω; per-client accuracies are all-reduced.
- outputs: rank 0 alone touches the run folder. A checkpoint gathers the momentum buffers, so it
  is the single-process checkpoint and resumes with any number of ranks (or none).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from pipeline import run_files as rf
from pipeline.algorithms import Algorithm
from pipeline.checks import require_finite
from pipeline.config import TrainConfig, config_dict
from pipeline.data.shards import FederatedData, data_digest, load_federated, read_manifest
from pipeline.distributed import Group
from pipeline.engine import LocalResult, LocalTask
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.errors import FedrcError
from pipeline.evaluate import omega_table, per_sample_losses, predictions, summarize
from pipeline.io import write_json
from pipeline.training import (
    MomentumStore,
    RoundCallback,
    build_run,
    checked_state,
    local_seed,
    prepare_run_dir,
    resolve_device,
    sample_clients,
)


def owners(clients: list[dict[str, Any]], size: int) -> dict[int, int]:
    """client id → rank: round-robin over the participating clients, then the held-out ones."""
    own = {}
    for participating in (True, False):
        ids = [c["client_id"] for c in clients if c["participating"] == participating]
        own.update({client: i % size for i, client in enumerate(ids)})
    return own


def train_round_sharded(
    round_: int,
    config: TrainConfig,
    algorithm: Algorithm,
    executor: Any,
    models: torch.Tensor,
    data: FederatedData,
    cached_logits: torch.Tensor | None,
    momentum: MomentumStore,
    group: Group,
    owner: dict[int, int],
) -> tuple[torch.Tensor, dict[str, Any]]:
    """`pipeline.training.train_round` with the clients spread over the ranks."""
    sampled = sample_clients(data.participating, config.participation, config.seed, round_)
    sizes = {c: int(data.clients[c]["train_size"]) for c in sampled}
    mine = [c for c in sampled if owner[c] == group.rank]
    algorithm.begin_round(models)
    raws, losses, labels = {}, [], []
    for client in mine:  # the E-step losses of this rank's clients
        rows = data.train_slices[client]
        x, y = data.images[rows], data.labels[rows]
        raw = executor.logits(models, x) if cached_logits is None else cached_logits[:, rows]
        raws[client] = raw
        losses.append(per_sample_losses(algorithm.combine_logits(raw), y).float())
        labels.append(y)
    shape = (0, algorithm.num_models)
    every_loss = exchange(group, sampled, owner, sizes, losses, shape, torch.float32)
    every_label = exchange(group, sampled, owner, sizes, labels, (0,), torch.int64)
    jobs, job_clients = [], []
    for client in sampled:  # every rank, every client, in client order: identical state
        gamma = algorithm.assign(client, every_loss[client], every_label[client])
        if owner[client] != group.rank:
            continue
        rows = data.train_slices[client]
        x, y = data.images[rows], data.labels[rows]
        for task in algorithm.local_tasks(client, gamma.detach(), models, raws[client]):
            momentum.attach(client, task, models.device)
            jobs.append((task, x, y, local_seed(config.seed, round_, client)))
            job_clients.append(client)
    results, error = [], None
    try:
        results = executor.train_many(jobs)
    except NonFiniteLoss as e:
        client, task = job_clients[e.index], jobs[e.index][0]
        error = (
            f"round {round_}, client {client}, model {task.model}: {e} — training "
            f"diverged; lower --lr (now {config.lr})"
        )
    meta = [(c, j[0].model, j[0].weight) for c, j in zip(job_clients, jobs)]
    everyone = group.all_gather_object((error, meta))
    failed = next((e for e, _ in everyone if e is not None), None)
    if failed is not None:
        raise FedrcError(failed)
    loss_sum = torch.zeros(1, dtype=torch.float64, device=group.device)
    for client, (task, _, _, _), result in zip(job_clients, jobs, results):
        momentum.keep(client, task, result)
        loss_sum += result.loss_sum
    if algorithm.summed:  # N_i-weighted sums: add this rank's terms, then sum over ranks
        for client, (task, _, y, _), result in zip(job_clients, jobs, results):
            algorithm.receive(client, task, result, y.numel())
        for name in algorithm.summed:
            value = getattr(algorithm, name)
            if isinstance(value, torch.Tensor):
                group.all_reduce(value)
            else:
                total = torch.tensor([float(value)], dtype=torch.float64, device=group.device)
                setattr(algorithm, name, float(group.all_reduce(total)))
    else:  # per-client results: every trained model to every rank, `receive` in client order
        params = [r.params[None] for r in results]
        counts = [len(m) for _, m in everyone]
        blocks = group.all_gather_rows(
            torch.cat(params) if params else models.new_zeros((0, models.shape[1])), counts
        )
        received: dict[int, list[tuple[int, float, torch.Tensor]]] = {}
        for (_, rank_meta), block in zip(everyone, blocks):
            for (client, row, weight), flat in zip(rank_meta, block):
                received.setdefault(client, []).append((row, weight, flat))
        for client in sampled:
            for row, weight, flat in received.get(client, []):
                task = LocalTask(row, flat, flat.new_empty(0), weight=weight)
                algorithm.receive(client, task, LocalResult(flat, 0.0, None), sizes[client])
    group.all_reduce(loss_sum)
    seen = sum(sizes.values()) * config.local_epochs
    models = algorithm.aggregate(models)
    algorithm.end_round()
    row = {"train_loss": float(loss_sum) / max(seen, 1), "clients": len(sampled)}
    return models, {**row, **algorithm.round_info()}


def exchange(
    group: Group,
    clients: list[int],
    owner: dict[int, int],
    sizes: dict[int, int],
    local: list[torch.Tensor],
    empty_shape: tuple[int, ...],
    dtype: torch.dtype,
) -> dict[int, torch.Tensor]:
    """Every client's per-sample rows (N_i, …) on every rank, from the blocks each rank computed
    for its own clients (`local`, in client order): one all-gather, cut back into clients."""
    blocks = [[c for c in clients if owner[c] == r] for r in range(group.size)]
    counts = [sum(sizes[c] for c in block) for block in blocks]
    mine = torch.cat(local) if local else torch.zeros(empty_shape, device=group.device)
    gathered = group.all_gather_rows(mine.to(dtype), counts)
    out = {}
    for block, rows in zip(blocks, gathered):
        offset = 0
        for client in block:
            out[client] = rows[offset : offset + sizes[client]]
            offset += sizes[client]
    return out


def evaluate_sharded(
    algorithm: Algorithm,
    executor: Any,
    models: torch.Tensor,
    data: FederatedData,
    group: Group,
    owner: dict[int, int],
    where: str,
    lr: float,
) -> tuple[dict[str, Any], torch.Tensor]:
    """`pipeline.evaluate.evaluate_round` with each rank scoring its own clients.

    Returns the scores (the same on every rank) and this rank's raw logits on its own rows.
    """
    if len(data.distinct):
        raw = executor.logits(models, data.images[data.distinct])[:, data.inverse]
    else:  # more ranks than clients: nothing here
        raw = models.new_zeros((models.shape[0], 0, data.num_classes))
    logits = algorithm.combine_logits(raw)
    held = data.held_out
    sizes = {h: int(data.clients[h]["train_size"]) for h in held}
    losses, labels = [], []
    for h in held:
        if owner[h] == group.rank:
            rows = data.train_slices[h]
            labels.append(data.labels[rows])
            losses.append(per_sample_losses(logits[:, rows], labels[-1]).float())
    every_loss = exchange(group, held, owner, sizes, losses, (0, logits.shape[0]), torch.float32)
    every_label = exchange(group, held, owner, sizes, labels, (0,), torch.int64)
    for h in held:  # every held-out E-step on every rank, in client order
        algorithm.assign_held_out(h, every_loss[h], every_label[h])
    omega = omega_table(algorithm, len(data.clients))
    # accuracies: columns soft train, soft test, hard train, hard test; each rank its own rows
    table = torch.zeros((len(data.clients), 4), dtype=torch.float64, device=group.device)
    for client in data.loaded or []:
        own = algorithm.personal_model(client)
        train, test = data.train_slices[client], data.test_slices[client]
        if own is not None:  # FedSoft's personal model on all the client's rows
            own = executor.logits(own[None].to(models), data.images[train.start : test.stop])
        for column, (hard, rows) in enumerate(
            [(False, train), (False, test), (True, train), (True, test)]
        ):
            if own is not None:
                local = slice(rows.start - train.start, rows.stop - train.start)
                weights = omega[client] if own.shape[0] == omega.shape[1] else torch.ones(1)
                pred = predictions(own[:, local], weights, hard)
            else:
                pred = predictions(logits[:, rows], omega[client], hard)
            table[client, column] = float((pred == data.labels[rows]).float().mean())
    group.all_reduce(table)
    if group.any(not bool(torch.isfinite(raw).all())):  # diverged on some rank: stop on all
        require_finite(where, {}, torch.tensor([float("nan")]), lr)
    rows = table.tolist()
    soft = summarize(data, [{"train": r[0], "test": r[1]} for r in rows])
    hard = summarize(data, [{"train": r[2], "test": r[3]} for r in rows])
    scores = {**soft, **{f"hard_{k}": v for k, v in hard.items()}}
    require_finite(where, scores, None, lr)  # the same scores on every rank: all stop or none
    return scores, raw


def run_sharded(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_round: RoundCallback | None = None,
) -> Path:
    """`pipeline.training.run_training` for a process that torchrun started: join the group,
    train this rank's share, and leave the group however the run ends."""
    if config.device == "cuda":
        resolve_device("cuda")  # no GPU: the same one-line error on every rank
    with Group.start(config.device) as group:
        return _run(config, group, resume, overwrite, on_round)


def _run(
    config: TrainConfig,
    group: Group,
    resume: bool,
    overwrite: bool,
    on_round: RoundCallback | None,
) -> Path:
    device, out, main = group.device, Path(config.out), group.is_main
    # Every step that can fail on one rank only is agreed on: all ranks raise its error.
    manifest = group.agree(lambda: read_manifest(Path(config.data)))
    owner = owners(manifest["clients"], group.size)
    mine = {client for client, rank in owner.items() if rank == group.rank}
    data = group.agree(lambda: load_federated(Path(config.data), mine)).to(device)
    group.agree(lambda: prepare_run_dir(out, resume, overwrite), everywhere=False)  # rank 0
    digest = data_digest(data.manifest)
    wanted = {**config.identity(), "data_digest": digest}
    identity = json.dumps(wanted, sort_keys=True)

    executor, algorithm, models, momentum = build_run(config, data, device)
    start, cached, eval_rounds, history = 0, None, [], []
    if resume:  # rank 0 reads the checkpoint and sends it to the others
        state = group.broadcast_object(
            group.agree(lambda: checked_state(out, wanted), everywhere=False)
        )
        models = state["models"].to(device)
        algorithm.load_state_dict(state["algorithm"])
        start, eval_rounds = state["round"], state["eval_rounds"]
        history = list(state["omega_history"])
        momentum.buffers = {c: b for c, b in state["momentum"].items() if c in mine}
        # cached logits are not carried over: this rank's rows differ from the writer's
        if main:
            rf.truncate_metrics(out / rf.METRICS, start)
    if main:
        write_json(out / rf.CONFIG, {**config_dict(config), "data_digest": digest})

    for round_ in range(start + 1, config.rounds + 1):
        tic = time.perf_counter()
        models, row = train_round_sharded(
            round_, config, algorithm, executor, models, data, cached, momentum, group, owner
        )
        cached = None
        if round_ % config.eval_every == 0 or round_ == config.rounds:
            where = f"round {round_}: evaluation"
            scores, cached = evaluate_sharded(
                algorithm, executor, models, data, group, owner, where, config.lr
            )
            row.update(scores)
            eval_rounds.append(round_)
            history.append(omega_table(algorithm, len(data.clients)).float())
        row = {"round": round_, **row, "seconds": time.perf_counter() - tic}
        checkpoint = round_ % config.checkpoint_every == 0 or round_ == config.rounds
        buffers = {}
        if checkpoint and momentum.enabled:  # each rank holds its own clients' buffers
            for part in group.all_gather_object(momentum.buffers):
                buffers.update(part)
        if main:
            rf.append_metrics(out / rf.METRICS, row)
            rf.write_assignments(out / rf.ASSIGNMENTS, eval_rounds, history, data.clients)
            if checkpoint:
                rf.save_checkpoint(
                    out,
                    identity,
                    round_,
                    models,
                    algorithm.state_dict(),
                    eval_rounds,
                    history,
                    dict(sorted(buffers.items())),
                    None,
                )
            if on_round is not None:
                on_round(row)

    if main:
        rf.save_model(
            out,
            identity,
            config.rounds,
            config.algorithm,
            models,
            omega_table(algorithm, len(data.clients)),
            algorithm.state_dict(),
        )
    return out
