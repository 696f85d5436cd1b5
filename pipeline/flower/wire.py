"""What travels between the fedrc server and its SuperNodes, as Flower records.

For an algorithm with a client part (`Algorithm.client_part`: FedAvg, FedProx, IFCA, CFL,
FeSEM, FedEM, FedRC, StoCFL, CFL-GP, FedDrift, FedDrift-Eager) a node answers:

- `query.hello`     → its benchmark's content hash and its client ids
- `train.steps`     models (R, P) and, per client, its `ClientStep` (the server state its E-step
                    needs), its global training rows and batch seed → per client its upload
                    (ω_i, FedRC's label table, …) and per local training the model row, its
                    weight N_i, the trained parameters and the loss sum. γ, losses, logits and
                    labels stay on the node; so does a client's memory (FedRC's Adam moments),
                    in the node's Flower state for the run (`Context.state`). A scoring step
                    (`Algorithm.score_steps`: FedDrift's K mean losses) travels the same way
                    and trains nothing
- `evaluate.scores` models and, per client, its global rows, the size of its training part and
                    its ω (a held-out client: its `ClientStep`) → per client four accuracies
                    (soft and hard, training and test part), a held-out client's ω, and whether
                    every logit was finite

For any other algorithm (the fallback: its E-step runs on the server) a node answers:

- `query.hello`     → as above, plus the labels of its clients' rows
- `query.logits`    models (R, P) and global row ids → logits (R, n, classes) on those rows
- `train.fedrc`     local trainings (`LocalTask`s) of the node's clients → trained models, loss
                    sums

Tensors travel as an `ArrayRecord` (NumPy's own format, dtype and shape kept, so the numbers
arrive bit for bit), scalars as a `ConfigRecord`. A flat vector that several tasks start from
or are pulled towards (usually the K global models) is sent once per message.

Rows are named by their position in the whole benchmark (`global_layout`: clients in manifest
order, each client's rows one block, as `load_federated` lays them out: training rows then test
rows, step after step in a drifting benchmark), so the server can address any sample without
holding a pixel.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from pipeline.algorithms.client import ClientStep
from pipeline.data.records import Manifest
from pipeline.engine.task import LocalResult, LocalTask

HELLO, LOGITS, TRAIN = "query.hello", "query.logits", "train.fedrc"
STEPS, SCORES = "train.steps", "evaluate.scores"


def global_layout(manifest: Manifest) -> tuple[list[slice], torch.Tensor]:
    """Every client's block of rows in the whole benchmark, and each row's client."""
    blocks, owner, offset = [], [], 0
    for client in manifest.clients:
        blocks.append(slice(offset, offset + client.size))
        owner.append(np.full(client.size, client.client_id))
        offset += client.size
    return blocks, torch.from_numpy(np.concatenate(owner).astype(np.int64))


def arrays(**tensors: torch.Tensor) -> ArrayRecord:
    record = ArrayRecord()
    for name, tensor in tensors.items():
        record[name] = Array(tensor.detach().cpu().contiguous().numpy())
    return record


def tensor(record: ArrayRecord, name: str) -> torch.Tensor:
    return torch.from_numpy(record[name].numpy())


def failure(message: str, job: int | None = None, client: int = -1, model: int = -1) -> RecordDict:
    """A node's one-line error; `job`: the position, in the request, of the local training
    whose loss was not finite (the run stops with the loop's divergence message); in a
    `train.steps` reply, its `client` and `model` name it."""
    values = {"message": message, "job": -1 if job is None else job}
    values.update({"client": client, "model": model})
    return RecordDict({"failure": ConfigRecord(values)})


def failed(content: RecordDict) -> tuple[str, int | None] | None:
    """(message, diverged job or None) when the reply is a node's error line, else None."""
    status = content.config_records.get("failure")
    if status is None:
        return None
    job = int(status["job"])
    return str(status["message"]), None if job < 0 else job


def diverged_task(content: RecordDict) -> tuple[int, int]:
    """(client, model) of the local training a failed `train.steps` reply names."""
    status = content.config_records["failure"]
    return int(status["client"]), int(status["model"])


# --- hello -----------------------------------------------------------------------------------
def hello_reply(
    content_hash: str, clients: list[int], labels: torch.Tensor | None, where: str
) -> RecordDict:
    """`labels`: the node's clients' rows in the benchmark's global order, concatenated; only
    for an algorithm without a client part (None: the labels stay on the node)."""
    data = {"clients": torch.tensor(clients, dtype=torch.int64)}
    if labels is not None:
        data["labels"] = labels
    return RecordDict(
        {
            "data": arrays(**data),
            "node": ConfigRecord({"content_hash": content_hash, "where": where}),
        }
    )


@dataclass
class Hello:
    content_hash: str
    where: str  # the node's data folder, for messages
    clients: list[int]
    labels: torch.Tensor | None


def read_hello(content: RecordDict) -> Hello:
    node, data = content.config_records["node"], content.array_records["data"]
    return Hello(
        str(node["content_hash"]),
        str(node["where"]),
        tensor(data, "clients").tolist(),
        tensor(data, "labels") if "labels" in data else None,
    )


# --- client steps ----------------------------------------------------------------------------
def put_step(tensors: dict, config: dict, prefix: str, step: ClientStep) -> None:
    """A step's fields under `prefix`: tensors as arrays, the rest as config values."""
    for name, value in step.values().items():
        target = tensors if isinstance(value, torch.Tensor) else config
        target[f"{prefix}{name}"] = value


def take_step(record: ArrayRecord, config: ConfigRecord, prefix: str, step_class: type[ClientStep]):
    """The step `put_step` wrote under `prefix`, as this node's `step_class`."""
    values = {}
    for f in fields(step_class):
        key = f"{prefix}{f.name}"
        values[f.name] = tensor(record, key) if key in record else config[key]
    return step_class(**values)


def steps_request(
    models: torch.Tensor, clients: list[tuple[int, ClientStep, torch.Tensor, int]], lr: float
) -> RecordDict:
    """Per client: its step, its global training rows and its batches' seed; the round's
    local learning rate."""
    tensors, config = {"models": models}, {"clients": len(clients), "lr": float(lr)}
    for i, (client, step, rows, seed) in enumerate(clients):
        tensors[f"{i}.rows"] = rows
        config.update({f"{i}.client": client, f"{i}.seed": int(seed)})
        put_step(tensors, config, f"{i}.step.", step)
    return RecordDict({"request": arrays(**tensors), "config": ConfigRecord(config)})


def read_steps_request(content: RecordDict, step_class: type[ClientStep]):
    """(models, [(client, step, rows, seed)], lr)."""
    record, config = content.array_records["request"], content.config_records["config"]
    clients = []
    for i in range(int(config["clients"])):
        step = take_step(record, config, f"{i}.step.", step_class)
        rows = tensor(record, f"{i}.rows")
        clients.append((int(config[f"{i}.client"]), step, rows, int(config[f"{i}.seed"])))
    return tensor(record, "models"), clients, float(config["lr"])


def steps_reply(
    uploads: dict[int, dict[str, torch.Tensor]], results: list[tuple[LocalTask, LocalResult]]
) -> RecordDict:
    """Each client's upload, and each local training's row, weight, parameters and loss sum."""
    tensors = {
        f"up.{c}.{name}": value for c, upload in uploads.items() for name, value in upload.items()
    }
    config: dict[str, int | float | str] = {"uploads": ",".join(str(c) for c in uploads)}
    config["tasks"] = len(results)
    for j, (task, result) in enumerate(results):
        tensors[f"{j}.params"] = result.params
        config.update(
            {
                f"{j}.client": task.client,
                f"{j}.model": task.model,
                f"{j}.weight": float(task.weight),
                f"{j}.loss": float(result.loss_sum),
            }
        )
    return RecordDict({"results": arrays(**tensors), "config": ConfigRecord(config)})


def read_steps_reply(content: RecordDict, models: torch.Tensor):
    """({client: upload}, [(task, result)]); a task carries no per-sample weights (they stay on
    the node): what the server folds is its row, client and weight."""
    record, config = content.array_records["results"], content.config_records["config"]
    uploads: dict[int, dict[str, torch.Tensor]] = {}
    for client in (int(c) for c in str(config["uploads"]).split(",") if c):
        prefix = f"up.{client}."
        uploads[client] = {
            key[len(prefix) :]: tensor(record, key) for key in record if key.startswith(prefix)
        }
    results = []
    for j in range(int(config["tasks"])):
        model = int(config[f"{j}.model"])
        task = LocalTask(model, models[model], torch.empty(0), float(config[f"{j}.weight"]))
        task.client = int(config[f"{j}.client"])
        result = LocalResult(tensor(record, f"{j}.params"), float(config[f"{j}.loss"]), None)
        results.append((task, result))
    return uploads, results


# --- evaluation with client parts ------------------------------------------------------------
@dataclass
class ScoreJob:
    """One client's evaluation on its node: all its rows (training part first), the size of
    its training part, and its ω, or for a held-out client the step that fits it."""

    client: int
    rows: torch.Tensor
    train: int
    omega: torch.Tensor | None = None
    step: ClientStep | None = None


def scores_request(models: torch.Tensor, jobs: list[ScoreJob]) -> RecordDict:
    tensors, config = {"models": models}, {"clients": len(jobs)}
    for i, job in enumerate(jobs):
        tensors[f"{i}.rows"] = job.rows
        config.update({f"{i}.client": job.client, f"{i}.train": job.train})
        if job.step is not None:
            put_step(tensors, config, f"{i}.step.", job.step)
        else:
            tensors[f"{i}.omega"] = job.omega
    return RecordDict({"request": arrays(**tensors), "config": ConfigRecord(config)})


def read_scores_request(content: RecordDict, step_class: type[ClientStep] | None):
    record, config = content.array_records["request"], content.config_records["config"]
    jobs = []
    for i in range(int(config["clients"])):
        job = ScoreJob(
            int(config[f"{i}.client"]), tensor(record, f"{i}.rows"), int(config[f"{i}.train"])
        )
        if f"{i}.omega" in record:
            job.omega = tensor(record, f"{i}.omega")
        else:
            job.step = take_step(record, config, f"{i}.step.", step_class)
        jobs.append(job)
    return tensor(record, "models"), jobs


def scores_reply(
    accuracy: dict[int, torch.Tensor], omegas: dict[int, torch.Tensor], finite: bool
) -> RecordDict:
    """Per client its (2, 2) accuracies; per held-out client its ω; whether logits were finite."""
    tensors = {f"accuracy.{c}": a for c, a in accuracy.items()}
    tensors.update({f"omega.{c}": w for c, w in omegas.items()})
    return RecordDict({"scores": arrays(**tensors), "config": ConfigRecord({"finite": finite})})


def read_scores_reply(content: RecordDict):
    """({client: accuracies}, {held-out client: ω}, finite)."""
    record = content.array_records["scores"]
    parts: dict[str, dict[int, torch.Tensor]] = {"accuracy": {}, "omega": {}}
    for key in record:
        kind, client = key.split(".")
        parts[kind][int(client)] = tensor(record, key)
    return parts["accuracy"], parts["omega"], bool(content.config_records["config"]["finite"])


# --- logits ----------------------------------------------------------------------------------
def logits_request(models: torch.Tensor, rows: torch.Tensor) -> RecordDict:
    return RecordDict({"request": arrays(models=models, rows=rows)})


def read_logits_request(content: RecordDict) -> tuple[torch.Tensor, torch.Tensor]:
    record = content.array_records["request"]
    return tensor(record, "models"), tensor(record, "rows")


def logits_reply(logits: torch.Tensor) -> RecordDict:
    return RecordDict({"logits": arrays(logits=logits)})


def read_logits(content: RecordDict) -> torch.Tensor:
    return tensor(content.array_records["logits"], "logits")


# --- local training --------------------------------------------------------------------------
@dataclass
class TrainJob:
    """One local training as the node runs it: the task, the global rows, the batch seed."""

    task: LocalTask
    rows: torch.Tensor
    seed: int


def train_request(jobs: list[TrainJob], lr: float) -> RecordDict:
    """The tasks (a vector two tasks share travels once) and the round's learning rate."""
    vectors: dict[tuple[int, int, int], int] = {}  # (storage, offset, length) → position
    tensors: dict[str, torch.Tensor] = {}
    config: dict[str, int | float | str] = {"tasks": len(jobs), "lr": float(lr)}

    def shared(vector: torch.Tensor | None) -> int:
        if vector is None:
            return -1
        key = (vector.untyped_storage().data_ptr(), vector.storage_offset(), vector.numel())
        if key not in vectors:
            vectors[key] = len(vectors)
            tensors[f"vector.{vectors[key]}"] = vector
        return vectors[key]

    for i, job in enumerate(jobs):
        task = job.task
        if task.momentum is not None:
            raise ValueError("persistent momentum does not travel to Flower nodes")
        tensors[f"{i}.weights"] = task.weights
        tensors[f"{i}.rows"] = job.rows
        if task.offset is not None:
            tensors[f"{i}.offset"] = task.offset
        config.update(
            {
                f"{i}.client": task.client,
                f"{i}.model": task.model,
                f"{i}.start": shared(task.start),
                f"{i}.anchor": shared(task.anchor),
                f"{i}.mu": float(task.mu),
                f"{i}.weight": float(task.weight),
                f"{i}.seed": int(job.seed),
                f"{i}.stop_gain": float(task.stop_gain),
            }
        )
    return RecordDict({"tasks": arrays(**tensors), "config": ConfigRecord(config)})


def read_train_request(content: RecordDict) -> tuple[list[TrainJob], float]:
    """The tasks and the round's learning rate."""
    record, config = content.array_records["tasks"], content.config_records["config"]

    def vector(position: int) -> torch.Tensor | None:
        return None if position < 0 else tensor(record, f"vector.{position}")

    jobs = []
    for i in range(int(config["tasks"])):
        offset = tensor(record, f"{i}.offset") if f"{i}.offset" in record else None
        task = LocalTask(
            model=int(config[f"{i}.model"]),
            start=vector(int(config[f"{i}.start"])),
            weights=tensor(record, f"{i}.weights"),
            weight=float(config[f"{i}.weight"]),
            anchor=vector(int(config[f"{i}.anchor"])),
            mu=float(config[f"{i}.mu"]),
            offset=offset,
            stop_gain=float(config[f"{i}.stop_gain"]),
        )
        task.client = int(config[f"{i}.client"])
        jobs.append(TrainJob(task, tensor(record, f"{i}.rows"), int(config[f"{i}.seed"])))
    return jobs, float(config["lr"])


def train_reply(results: list[LocalResult]) -> RecordDict:
    return RecordDict(
        {
            "params": arrays(**{str(i): r.params for i, r in enumerate(results)}),
            "losses": ConfigRecord({str(i): float(r.loss_sum) for i, r in enumerate(results)}),
        }
    )


def read_train_reply(content: RecordDict) -> list[LocalResult]:
    params, losses = content.array_records["params"], content.config_records["losses"]
    return [
        LocalResult(tensor(params, str(i)), float(losses[str(i)]), None) for i in range(len(losses))
    ]
