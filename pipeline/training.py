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

from pipeline import distributed
from pipeline import run_files as rf
from pipeline.algorithms import Algorithm, build_algorithm
from pipeline.checks import require_finite
from pipeline.config import TrainConfig, config_dict
from pipeline.data.shards import FederatedData, data_digest, load_federated
from pipeline.engine import BatchedExecutor, LocalResult, LocalTask, SequentialExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.errors import FedrcError
from pipeline.evaluate import evaluate_round, omega_table, per_sample_losses
from pipeline.io import write_json
from pipeline.models import build_model
from pipeline.models.layout import head_range

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


def make_executor(config: TrainConfig, data: FederatedData, device: torch.device):
    """`executor: auto` is the plain loop on a CPU and the batched one on CUDA (DESIGN.md 3)."""
    shape = tuple(data.manifest["image_shape"])
    model = build_model(shape, data.num_classes, config.model, config.pretrained, config.norm)
    sgd = dict(
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        drop_last=config.drop_last,
    )
    batched = config.executor == "batched" or (config.executor == "auto" and device.type == "cuda")
    if batched:
        return BatchedExecutor(
            model, device, **sgd, chunk_tasks=config.chunk_clients, precision=config.precision
        )
    return SequentialExecutor(model, device, **sgd)


def initial_models(
    executor: SequentialExecutor, data: FederatedData, config: TrainConfig, rows: int
) -> torch.Tensor:
    """`rows` independently initialised models, seeded: rows of an (R, P) tensor."""
    torch.manual_seed(config.seed)
    shape = tuple(data.manifest["image_shape"])
    flat = []
    for _ in range(rows):
        model = build_model(shape, data.num_classes, config.model, config.pretrained, config.norm)
        executor.model.load_state_dict(model.state_dict())
        flat.append(executor.flatten())
    return torch.stack(flat)


class MomentumStore:
    """Each (client, row)'s SGD momentum across rounds (the authors' code)."""

    def __init__(self, enabled: bool, size: int) -> None:
        self.enabled, self.size = enabled, size
        self.buffers: dict[int, dict[int, torch.Tensor]] = {}

    def attach(self, client: int, task: LocalTask, device: torch.device) -> None:
        if self.enabled:
            saved = self.buffers.get(client, {}).get(task.model)
            task.momentum = (
                torch.zeros(self.size, device=device) if saved is None else saved.to(device)
            )

    def keep(self, client: int, task: LocalTask, result: LocalResult) -> None:
        if self.enabled and result.momentum is not None:
            self.buffers.setdefault(client, {})[task.model] = result.momentum.cpu()


def train_round(
    round_: int,
    config: TrainConfig,
    algorithm: Algorithm,
    executor: SequentialExecutor,
    models: torch.Tensor,
    data: FederatedData,
    cached_logits: torch.Tensor | None,
    momentum: MomentumStore,
) -> tuple[torch.Tensor, dict[str, Any]]:
    sampled = sample_clients(data.participating, config.participation, config.seed, round_)
    algorithm.begin_round(models)
    # Every client's E-step first (Alg. 1 line 5): a client's assignment depends only on the
    # models received, so collecting all tasks before training gives the per-client numbers.
    jobs, owners = [], []
    for client in sampled:
        rows = data.train_slices[client]
        x, y = data.images[rows], data.labels[rows]
        # After an evaluation round the logits of these models on these samples are known.
        raw = executor.logits(models, x) if cached_logits is None else cached_logits[:, rows]
        losses = per_sample_losses(algorithm.combine_logits(raw), y)
        gamma = algorithm.assign(client, losses, y)  # E-step / assignment (Alg. 1 line 5)
        for task in algorithm.local_tasks(client, gamma.detach(), models, raw):
            momentum.attach(client, task, models.device)
            jobs.append((task, x, y, local_seed(config.seed, round_, client)))
            owners.append(client)
    try:
        results = executor.train_many(jobs)  # local training (Alg. 1 lines 6-7), batched or not
    except NonFiniteLoss as e:
        client, task = owners[e.index], jobs[e.index][0]
        raise FedrcError(
            f"round {round_}, client {client}, model {task.model}: {e} — training "
            f"diverged; lower --lr (now {config.lr})"
        ) from None
    loss_sum = 0.0
    for client, (task, _, y, _), result in zip(owners, jobs, results):
        momentum.keep(client, task, result)
        algorithm.receive(client, task, result, y.numel())
        loss_sum += result.loss_sum
    seen = sum(data.train_slices[c].stop - data.train_slices[c].start for c in sampled)
    seen *= config.local_epochs
    models = algorithm.aggregate(models)  # e.g. θ_k ← Σ_i N_i θ_ik / Σ_i N_i
    algorithm.end_round()
    row = {"train_loss": loss_sum / max(seen, 1), "clients": len(sampled)}
    return models, {**row, **algorithm.round_info()}


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


def checked_state(out: Path, wanted: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint to resume, refused when written with another configuration."""
    state = rf.load_state(out / rf.CHECKPOINT)
    other = rf.identity_mismatch(rf.state_identity(out / rf.CHECKPOINT, state), wanted)
    if other is not None:
        raise FedrcError(
            f"--resume: {out / rf.CHECKPOINT} was written with {other}; "
            "start a new run with another --out"
        )
    return state


def build_run(
    config: TrainConfig, data: FederatedData, device: torch.device
) -> tuple[SequentialExecutor, Algorithm, torch.Tensor, MomentumStore]:
    """What one training run holds, for the single-process and the sharded loop alike: the
    executor, the algorithm, the K initial models and the momentum store."""
    executor = make_executor(config, data, device)
    algorithm = build_algorithm(
        config, len(data.clients), data.num_classes, head_range(executor.model)
    )
    models = initial_models(executor, data, config, algorithm.num_rows)
    return (
        executor,
        algorithm,
        models,
        MomentumStore(config.persistent_momentum, executor.num_trainable),
    )


def run_training(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    on_round: RoundCallback | None = None,
) -> Path:
    if distributed.launched():  # torchrun with several processes: the clients are sharded
        from pipeline.sharded import run_sharded

        return run_sharded(config, resume=resume, overwrite=overwrite, on_round=on_round)
    device = resolve_device(config.device)
    data = load_federated(Path(config.data)).to(device)
    out = Path(config.out)
    prepare_run_dir(out, resume, overwrite)
    digest = data_digest(data.manifest)
    wanted = {**config.identity(), "data_digest": digest}
    identity = json.dumps(wanted, sort_keys=True)

    executor, algorithm, models, momentum = build_run(config, data, device)
    start, cached, eval_rounds, history = 0, None, [], []
    if resume:
        state = checked_state(out, wanted)
        models = state["models"].to(device)
        algorithm.load_state_dict(state["algorithm"])
        start, eval_rounds = state["round"], state["eval_rounds"]
        history = list(state["omega_history"])
        momentum.buffers = state["momentum"]
        cached = None if state["cached_logits"] is None else state["cached_logits"].to(device)
        rf.truncate_metrics(out / rf.METRICS, start)
    write_json(out / rf.CONFIG, {**config_dict(config), "data_digest": digest})

    for round_ in range(start + 1, config.rounds + 1):
        tic = time.perf_counter()
        models, row = train_round(
            round_, config, algorithm, executor, models, data, cached, momentum
        )
        cached = None
        if round_ % config.eval_every == 0 or round_ == config.rounds:
            scores, cached = evaluate_round(algorithm, executor, models, data)
            require_finite(f"round {round_}: evaluation", scores, cached, config.lr)
            row.update(scores)
            eval_rounds.append(round_)
            history.append(omega_table(algorithm, len(data.clients)).float())
        row = {"round": round_, **row, "seconds": time.perf_counter() - tic}
        rf.append_metrics(out / rf.METRICS, row)
        rf.write_assignments(out / rf.ASSIGNMENTS, eval_rounds, history, data.clients)
        if round_ % config.checkpoint_every == 0 or round_ == config.rounds:
            rf.save_checkpoint(
                out,
                identity,
                round_,
                models,
                algorithm.state_dict(),
                eval_rounds,
                history,
                momentum.buffers,
                cached,
            )
        if on_round is not None:
            on_round(row)

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
