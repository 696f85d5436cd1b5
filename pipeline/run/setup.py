"""What one training run holds on one place, how it is built, and where it stands.

`Run` is what the round loop works on (configuration, data, communicator, executor, algorithm,
models, momentum, client parts); `Progress` is what a checkpoint saves of the loop's own
bookkeeping. Building a run draws the K initial models from the run's seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.algorithms import ALGORITHMS, build_algorithm, num_models
from pipeline.algorithms.base import Algorithm
from pipeline.common.errors import FedrcError
from pipeline.config import TrainConfig
from pipeline.data.meaning import read_benchmark
from pipeline.data.shards import FederatedData, load_federated
from pipeline.engine import BatchedExecutor, SequentialExecutor
from pipeline.engine.rows import available_memory
from pipeline.models import GLOBAL_RNG, build_model
from pipeline.models.layout import head_range
from pipeline.places.communicate import Communicator
from pipeline.run.clients import LocalClients
from pipeline.run.momentum import MomentumStore
from pipeline.run.traffic import Traffic

# builds a run's executor from its config and data: `make_executor` runs on this process's
# device; a Flower server's runs on the SuperNodes (`pipeline.flower.server`)
ExecutorFactory = Callable[[TrainConfig, FederatedData, torch.device], SequentialExecutor]
# where the client parts of an algorithm run (`pipeline.run.clients`): here, or on Flower's nodes
ClientsFactory = Callable[[SequentialExecutor], LocalClients]


def sgd_options(config: TrainConfig) -> dict[str, Any]:
    """The local optimizer's settings (and the precision) every executor takes; `lr` is the
    first round's, which the round loop replaces when a schedule moves it."""
    return dict(
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        drop_last=config.drop_last,
        precision=config.precision,
        optimizer=config.optimizer,
        betas=(config.local_beta1, config.local_beta2),
        eps=config.local_eps,
    )


def run_model(config: TrainConfig, shape: tuple[int, int, int], classes: int) -> nn.Module:
    """The run's model: `--model`, as the algorithm adapts it (`Algorithm.adapt_model`)."""
    model = build_model(shape, classes, config.model, config.model_settings)
    cls = ALGORITHMS.get(config.algorithm)
    settings = config.algorithm_settings
    return cls.adapt_model(model, settings if settings is not None else cls.Settings())


def make_executor(
    config: TrainConfig, data: FederatedData, device: torch.device
) -> SequentialExecutor:
    """`executor: auto` is the plain loop on a CPU and the batched one on CUDA (docs/performance.md,
    *Executors and speed*);
    an algorithm whose local training only the sequential executor runs (`needs_sequential`:
    staged tasks, rules, early stopping) gets the plain loop under `auto` and refuses `batched`.
    `compile` (the batched step under torch.compile) refuses a run that the sequential one
    trains."""
    cls = ALGORITHMS.get(config.algorithm)
    sequential_only = cls.needs_sequential
    automatic = config.executor == "auto" and device.type == "cuda" and not sequential_only
    if config.compile and not (config.executor == "batched" or automatic):
        raise FedrcError(
            "train.compile: compiles the batched executor's step, and this run trains with the "
            "sequential one (executor: auto picks it on a CPU, and for the algorithms only it "
            "runs); set executor: batched"
        )
    if sequential_only and config.executor == "batched":
        raise FedrcError(
            f"train.executor: {config.algorithm} {cls.local_training}, which only the "
            "sequential executor runs; use auto or sequential"
        )
    model = run_model(config, data.manifest.image_shape, data.num_classes)
    sgd = sgd_options(config)
    batched = config.executor == "batched" or automatic
    if batched:
        return BatchedExecutor(
            model, device, **sgd, chunk_tasks=config.chunk_clients, compile=config.compile
        )
    return SequentialExecutor(model, device, **sgd)


def initial_models(
    executor: SequentialExecutor, data: FederatedData, config: TrainConfig, rows: int
) -> torch.Tensor:
    """`rows` independently initialised models, seeded: rows of an (R, P) tensor."""
    flat = []
    with GLOBAL_RNG:  # the seeded stream is this run's alone, even beside other runs' threads
        torch.manual_seed(config.seed)
        for _ in range(rows):
            model = run_model(config, data.manifest.image_shape, data.num_classes)
            executor.model.load_state_dict(model.state_dict())
            flat.append(executor.flatten())
    return torch.stack(flat)


# What a round holds, at the least, per parameter of each of the K models: the models (float32),
# their float64 sums, and the float32 copies the round and its checkpoint make. Measured on the
# CPU (`fedrc train`, K = 400): 22 bytes for IFCA, 37 for FedRC, 41 for FedEM.
BYTES_PER_PARAMETER = 24


def check_models_fit(k: int, params: int, device: torch.device) -> None:
    """Refuse, before the models are built, K models that cannot fit in memory: a run would
    otherwise fail midway in torch's allocator or be killed by the system."""
    available = available_memory(device)
    needed = k * params * BYTES_PER_PARAMETER
    if available is not None and needed > available:
        raise FedrcError(
            f"--clusters: K = {k}: the models ({k} × {params:,} parameters) need about "
            f"{needed / 2**30:.1f} GiB to train ({BYTES_PER_PARAMETER} bytes a parameter of "
            f"each model); {available / 2**30:.1f} GiB are free on {device.type}; lower "
            "--clusters or choose a smaller --model"
        )


def flat_size(model: torch.nn.Module) -> int:
    """Length of a model's flat vector: parameters and floating-point buffers (the layout of
    `SequentialExecutor.num_params`)."""
    buffers = (b for b in model.buffers() if b.is_floating_point())
    return sum(t.numel() for t in (*model.parameters(), *buffers))


def check_fits(config: TrainConfig, image_shape: tuple[int, int, int], classes: int) -> None:
    """`check_models_fit` before any data is loaded (`fedrc check`): the model built from the
    benchmark's image shape and classes on the CPU, the memory of the device the run will use
    (a GPU asked for and absent is the run's own error)."""
    gpu = config.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    model = run_model(config, image_shape, classes)
    check_models_fit(num_models(config), flat_size(model), device)


@dataclass
class Run:
    """What one training run holds on one place."""

    config: TrainConfig
    data: FederatedData
    comm: Communicator
    executor: SequentialExecutor
    algorithm: Algorithm
    models: torch.Tensor
    momentum: MomentumStore
    clients: LocalClients  # where the client parts run (`Algorithm.client_part`)
    resumed_at: int = 0  # the round of the checkpoint this run resumed from (0: it did not)
    traffic: Traffic = field(default_factory=Traffic)  # the round's message bytes, this place


@dataclass
class Progress:
    """Where the round loop stands: the last round done, the rounds evaluated so far with each
    one's ω table, and the logits of the current models that the next E-step may reuse."""

    round: int = 0
    eval_rounds: list[int] = field(default_factory=list)
    history: list[torch.Tensor] = field(default_factory=list)
    cached: torch.Tensor | None = None  # (R, N, classes) of this place's rows


def load_data(config: TrainConfig, comm: Communicator) -> FederatedData:
    """The benchmark on this place's device, each place holding its own clients' rows. Every
    step that can fail on one place only is agreed on: all places raise its error."""
    manifest = comm.agree(lambda: read_benchmark(Path(config.data)))
    comm.place_clients(manifest.participating, manifest.held_out)
    mine = (
        None
        if comm.size == 1
        else {c.client_id for c in manifest.clients if comm.owns(c.client_id)}
    )
    return comm.agree(lambda: load_federated(Path(config.data), mine)).to(comm.device)


def build_run(
    config: TrainConfig,
    data: FederatedData,
    comm: Communicator,
    out: Path | None = None,
    executor_factory: ExecutorFactory = make_executor,
    clients_factory: ClientsFactory = LocalClients,
) -> Run:
    """The executor, the algorithm, the K initial models and (with `persistent_momentum`, in
    `out`) the momentum store."""
    executor = executor_factory(config, data, comm.device)
    check_models_fit(num_models(config), executor.num_params, comm.device)
    algorithm = build_algorithm(
        config, len(data.clients), data.num_classes, head_range(executor.model)
    )
    algorithm.participants(list(data.participating))
    models = initial_models(executor, data, config, algorithm.num_rows)
    folder = out if config.persistent_momentum else None
    momentum = MomentumStore(
        folder, data.participating, algorithm.num_rows, executor.num_trainable, comm, comm.device
    )
    return Run(config, data, comm, executor, algorithm, models, momentum, clients_factory(executor))
