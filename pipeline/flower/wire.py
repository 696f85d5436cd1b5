"""What travels between the fedrc server and its SuperNodes, as Flower records.

A node answers three requests (`Message.message_type`):

- `query.hello`   → its benchmark's content hash, its client ids, and the labels of their rows
                    (the server runs the algorithm's E-step, which needs them)
- `query.logits`  models (R, P) and global row ids → logits (R, n, classes) on those rows
- `train.fedrc`   local trainings (`LocalTask`s) of the node's clients → trained models, loss sums

Tensors travel as an `ArrayRecord` (NumPy's own format, dtype and shape kept, so the numbers
arrive bit for bit), scalars as a `ConfigRecord`. A flat vector that several tasks start from
or are pulled towards (usually the K global models) is sent once per message.

Rows are named by their position in the whole benchmark (`global_layout`: clients in manifest
order, each client's rows one block, as `load_federated` lays them out: training rows then test
rows, step after step in a drifting benchmark), so the server can address any sample without
holding a pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from pipeline.data.records import Manifest
from pipeline.engine.task import LocalResult, LocalTask

HELLO, LOGITS, TRAIN = "query.hello", "query.logits", "train.fedrc"


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


def failure(message: str, job: int | None = None) -> RecordDict:
    """A node's one-line error; `job`: the position, in the request, of the local training
    whose loss was not finite (the run stops with the loop's divergence message)."""
    values = {"message": message, "job": -1 if job is None else job}
    return RecordDict({"failure": ConfigRecord(values)})


def failed(content: RecordDict) -> tuple[str, int | None] | None:
    """(message, diverged job or None) when the reply is a node's error line, else None."""
    status = content.config_records.get("failure")
    if status is None:
        return None
    job = int(status["job"])
    return str(status["message"]), None if job < 0 else job


# --- hello -----------------------------------------------------------------------------------
def hello_reply(
    content_hash: str, clients: list[int], labels: torch.Tensor, where: str
) -> RecordDict:
    """`labels`: the node's clients' rows in the benchmark's global order, concatenated."""
    return RecordDict(
        {
            "data": arrays(clients=torch.tensor(clients, dtype=torch.int64), labels=labels),
            "node": ConfigRecord({"content_hash": content_hash, "where": where}),
        }
    )


@dataclass
class Hello:
    content_hash: str
    where: str  # the node's data folder, for messages
    clients: list[int]
    labels: torch.Tensor


def read_hello(content: RecordDict) -> Hello:
    node, data = content.config_records["node"], content.array_records["data"]
    return Hello(
        str(node["content_hash"]),
        str(node["where"]),
        tensor(data, "clients").tolist(),
        tensor(data, "labels"),
    )


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


def train_request(jobs: list[TrainJob]) -> RecordDict:
    vectors: dict[tuple[int, int, int], int] = {}  # (storage, offset, length) → position
    tensors: dict[str, torch.Tensor] = {}
    config: dict[str, int | float | str] = {"tasks": len(jobs)}

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
            }
        )
    return RecordDict({"tasks": arrays(**tensors), "config": ConfigRecord(config)})


def read_train_request(content: RecordDict) -> list[TrainJob]:
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
        )
        task.client = int(config[f"{i}.client"])
        jobs.append(TrainJob(task, tensor(record, f"{i}.rows"), int(config[f"{i}.seed"])))
    return jobs


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
