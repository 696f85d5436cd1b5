"""A SuperNode's side: the shards of the clients it holds, and the work the server asks for.

A node learns from its node config which benchmark folder it reads and which clients it holds
(`fedrc-data`, `fedrc-clients`: "3", "0,4,7" or "all"). The server names rows by their
position in the whole benchmark (`wire.global_layout`); the node maps them onto the rows it
loaded.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from pipeline.data.shards import load_federated, read_manifest
from pipeline.engine import SequentialExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.errors import FedrcError
from pipeline.flower import wire
from pipeline.flower.appconfig import train_config_from_json
from pipeline.training import make_executor, resolve_device


def parse_clients(value: str, total: int) -> list[int]:
    if value.strip() == "all":
        return list(range(total))
    try:
        clients = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise FedrcError(
            f"fedrc-clients: expected client ids like '0,4,7' or 'all', got {value!r}"
        ) from None
    bad = [c for c in clients if not 0 <= c < total]
    if bad or not clients:
        raise FedrcError(
            f"fedrc-clients: {bad or value!r} not among the benchmark's {total} clients"
        )
    return clients


class NodeData:
    """The node's clients' rows, and the map from global row ids to the rows loaded here."""

    def __init__(self, folder: Path, clients: str) -> None:
        manifest = read_manifest(folder)
        self.folder = folder
        self.clients = parse_clients(clients, len(manifest.clients))
        self.data = load_federated(folder, set(self.clients))
        self.content_hash = manifest.content_hash
        self.blocks, row_client = wire.global_layout(manifest)
        self.local = torch.full((len(row_client),), -1, dtype=torch.int64)
        for client in self.clients:
            block, here = self.blocks[client], self.data.train_slices[client].start
            self.local[block] = torch.arange(here, here + block.stop - block.start)

    def rows(self, global_rows: torch.Tensor) -> torch.Tensor:
        local = self.local[global_rows]
        if bool((local < 0).any()):
            missing = int(global_rows[local < 0][0])
            raise FedrcError(f"row {missing} is not held by this node ({self.folder})")
        return local

    def hello(self) -> wire.RecordDict:
        data = self.data
        labels = torch.cat([data.labels[self.local[self.blocks[c]]] for c in self.clients])
        return wire.hello_reply(self.content_hash, self.clients, labels, str(self.folder))


@functools.lru_cache(maxsize=2)
def node_data(folder: str, clients: str) -> NodeData:
    """Loaded once per ClientApp process and node config, not once per message."""
    return NodeData(Path(folder), clients)


@functools.lru_cache(maxsize=2)
def node_executor(config_json: str, folder: str, clients: str, device: str) -> SequentialExecutor:
    config = train_config_from_json(config_json)
    data = node_data(folder, clients).data
    return make_executor(config, data, resolve_device(device))


def answer_logits(node: NodeData, executor: SequentialExecutor, content: wire.RecordDict):
    models, rows = wire.read_logits_request(content)
    images = node.data.images[node.rows(rows)].to(executor.device)
    return wire.logits_reply(executor.logits(models.to(executor.device), images).float().cpu())


def answer_train(node: NodeData, executor: SequentialExecutor, content: wire.RecordDict):
    """The client's tasks through the node's executor (batched on a GPU, one by one on a CPU)."""
    jobs = wire.read_train_request(content)
    device, work = executor.device, []
    for job in jobs:
        local, task = node.rows(job.rows), job.task
        for name in ("start", "weights", "anchor", "offset"):
            value = getattr(task, name)
            if value is not None:
                setattr(task, name, value.to(device))
        images, labels = node.data.images[local].to(device), node.data.labels[local].to(device)
        work.append((task, images, labels, job.seed))
    try:
        results = [result for _, result in executor.stream(work)]
    except NonFiniteLoss as e:
        return wire.failure(str(e), job=e.index)
    for result in results:
        result.params = result.params.cpu()
    return wire.train_reply(results)
