"""The federated round loop (FedRC paper, Algorithm 1), written once for every algorithm.

sample clients → E-step with the received models → γ-weighted local training of the K models →
server aggregation → server bookkeeping (FedRC's C_{y,k}) → evaluate → log and checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import run_files as rf
from pipeline.algorithms import Algorithm, build_algorithm
from pipeline.config import TrainConfig, config_dict
from pipeline.data.shards import FederatedData, data_digest, load_federated
from pipeline.engine import SequentialExecutor
from pipeline.errors import FedrcError
from pipeline.evaluate import evaluate_round, omega_table
from pipeline.models import build_model

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


def initial_models(executor: SequentialExecutor, data: FederatedData, config: TrainConfig):
    """K independently initialised models, seeded: rows of a (K, P) tensor."""
    torch.manual_seed(config.seed)
    shape = tuple(data.manifest["image_shape"])
    rows = [
        build_model(shape, data.num_classes).to(executor.device) for _ in range(config.num_models)
    ]
    return torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in rows])


def train_round(
    round_: int,
    config: TrainConfig,
    algorithm: Algorithm,
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    cached_losses: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    sampled = sample_clients(data.participating, config.participation, config.seed, round_)
    sums = torch.zeros(models.shape, dtype=torch.float64, device=models.device)
    totals = torch.zeros(models.shape[0], dtype=torch.float64, device=models.device)
    loss_sum, seen = 0.0, 0
    for client in sampled:
        rows = data.train_slices[client]
        x, y = data.images[rows], data.labels[rows]
        # After an evaluation round the losses of these models on these samples are known.
        losses = executor.losses(models, x, y) if cached_losses is None else cached_losses[rows]
        gamma = algorithm.assign(client, losses, y)  # E-step (eq. 3 / Alg. 1 line 5)
        weights = algorithm.aggregation_weights(client, y.numel()).to(models.device)
        for k in range(models.shape[0]):  # local M-step, model by model
            if weights[k] == 0:
                continue
            trained, weighted_loss = executor.train(
                models[k], x, y, gamma[:, k].detach(), local_seed(config.seed, round_, client)
            )
            sums[k] += weights[k] * trained
            totals[k] += weights[k]
            loss_sum += weighted_loss
        seen += y.numel() * config.local_epochs
    models = algorithm.aggregate(models, sums, totals)  # θ_k ← Σ_i N_i θ_ik / Σ_i N_i
    algorithm.end_round()
    return models, {"train_loss": loss_sum / max(seen, 1), "clients": len(sampled)}


def prepare_run_dir(out: Path, resume: bool, overwrite: bool) -> None:
    if resume:
        if not (out / rf.CHECKPOINT).is_file():
            raise FedrcError(f"--resume: no checkpoint in {out}")
        return
    owned = [out / name for name in rf.TRAIN_FILES]
    if any(p.exists() for p in owned):
        if not overwrite:
            raise FedrcError(
                f"--out: {out} already holds a run; pass --resume to continue it or "
                "--overwrite to start again"
            )
        for p in owned:  # only train's own files: eval and plot outputs belong to their stages
            p.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def run_training(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_round: RoundCallback | None = None,
) -> Path:
    device = resolve_device(config.device)
    data = load_federated(Path(config.data)).to(device)
    out = Path(config.out)
    prepare_run_dir(out, resume, overwrite)
    digest = data_digest(data.manifest)
    identity = json.dumps({**config.identity(), "data_digest": digest}, sort_keys=True)

    shape = tuple(data.manifest["image_shape"])
    executor = SequentialExecutor(
        build_model(shape, data.num_classes),
        device,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        drop_last=config.drop_last,
    )
    algorithm = build_algorithm(config, len(data.clients), data.num_classes)
    models = initial_models(executor, data, config)
    start, cached, eval_rounds, history = 0, None, [], []
    if resume:
        state = rf.load_state(out / rf.CHECKPOINT)
        if state.get("identity") != identity:
            raise FedrcError(
                f"--resume: {out / rf.CHECKPOINT} was written with another configuration or "
                "dataset; start a new run with another --out"
            )
        models = state["models"].to(device)
        algorithm.load_state_dict(state["algorithm"])
        start, eval_rounds = state["round"], state["eval_rounds"]
        history = list(state["omega_history"])
        cached = None if state["cached_losses"] is None else state["cached_losses"].to(device)
        rf.truncate_metrics(out / rf.METRICS, start)
    (out / rf.CONFIG).write_text(
        json.dumps({**config_dict(config), "data_digest": digest}, indent=2, sort_keys=True)
    )

    for round_ in range(start + 1, config.rounds + 1):
        tic = time.perf_counter()
        models, row = train_round(round_, config, algorithm, executor, models, data, cached)
        cached = None
        if round_ % config.eval_every == 0 or round_ == config.rounds:
            scores, cached = evaluate_round(algorithm, executor, models, data)
            row.update(scores)
            eval_rounds.append(round_)
            history.append(omega_table(algorithm, len(data.clients)).float())
        row = {"round": round_, **row, "seconds": time.perf_counter() - tic}
        rf.append_metrics(out / rf.METRICS, row)
        rf.write_assignments(out / rf.ASSIGNMENTS, eval_rounds, history, data.clients)
        rf.save_state(
            out / rf.CHECKPOINT,
            {
                "identity": identity,
                "round": round_,
                "models": models.cpu(),
                "algorithm": algorithm.state_dict(),
                "eval_rounds": eval_rounds,
                "omega_history": history,
                "cached_losses": None if cached is None else cached.cpu(),
            },
        )
        if on_round is not None:
            on_round(row)

    rf.save_state(
        out / rf.MODEL,
        {
            "identity": identity,
            "round": config.rounds,
            "algorithm_name": config.algorithm,
            "models": models.cpu(),
            "omega": omega_table(algorithm, len(data.clients)),
        },
    )
    return out
