"""A SuperNode's side: the shards of the clients it holds, and the work the server asks for.

A node learns from its node config which benchmark folder it reads and which clients it holds
(`fedrc-data`, `fedrc-clients`: "3", "0,4,7" or "all"). The server names rows by their
position in the whole benchmark (`wire.global_layout`); the node maps them onto the rows it
loaded.

For an algorithm with a client part (`Algorithm.client_part`) the node runs each of its clients'
E-steps (`ClientStep.run`), local trainings and evaluation (`pipeline.run.clients`, the code every
place runs) and sends up only the step's upload, the trained models and per-client counts; a
client's memory between E-steps stays in the node's Flower state (`Context.state`). For any
other algorithm it answers logits and local trainings, and sends its clients' labels once, in
its hello (the server runs that algorithm's E-step).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from flwr.app import RecordDict

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import Memory, client_accuracy
from pipeline.common.errors import FedrcError
from pipeline.data.meaning import read_benchmark
from pipeline.data.shards import load_federated
from pipeline.engine import SequentialExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.flower import wire
from pipeline.flower.appconfig import train_config_from_json
from pipeline.models.layout import head_range
from pipeline.run.clients import ClientWork, client_jobs, held_out_omega
from pipeline.run.training import make_executor, resolve_device


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
        manifest = read_benchmark(folder)
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

    def hello(self, send_labels: bool) -> wire.RecordDict:
        """The node's clients; their labels only when the server runs the E-step."""
        data, labels = self.data, None
        if send_labels:
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


@functools.lru_cache(maxsize=2)
def node_algorithm(config_json: str, folder: str, clients: str, device: str) -> Algorithm:
    """The run's algorithm as configured (fresh state): for its client part's class and for
    whether it has one; the server's state reaches the node only inside each step."""
    config = train_config_from_json(config_json)
    manifest = node_data(folder, clients).data.manifest
    head = head_range(node_executor(config_json, folder, clients, device).model)
    return build_algorithm(config, len(manifest.clients), manifest.num_classes, head)


def memory_key(client: int) -> str:
    return f"fedrc.memory.{client}"


def recall(state: RecordDict, client: int) -> Memory | None:
    """A client's memory from its previous E-step on this node (None: none kept)."""
    record = state.array_records.get(memory_key(client))
    return None if record is None else {name: wire.tensor(record, name) for name in record}


def answer_steps(
    node: NodeData,
    executor: SequentialExecutor,
    algorithm: Algorithm,
    content: wire.RecordDict,
    state: RecordDict,
):
    """Each client's E-step and local trainings here; up go the uploads and trained models."""
    models, clients, executor.lr = wire.read_steps_request(content, algorithm.Step)
    device, data = executor.device, node.data
    models = models.to(device)
    results = []

    def skipped(task, result) -> None:
        results.append((task, result))

    memory = {client: recall(state, client) for client, *_ in clients}
    work = ClientWork(
        data, models, {}, {}, {c: m for c, m in memory.items() if m is not None},
        algorithm.config.skip_below, algorithm.num_models, skipped=skipped,
    )  # fmt: skip

    def jobs():
        for client, step, rows, seed in clients:
            local = node.rows(rows)
            images, labels = data.images[local].to(device), data.labels[local].to(device)
            raw = executor.logits(models, images)
            yield from client_jobs(step, client, raw, images, labels, seed, work)

    try:
        for (task, *_), result in executor.stream(jobs()):
            results.append((task, result))
    except NonFiniteLoss as e:
        task = e.job[0]
        return wire.failure(str(e), job=0, client=task.client, model=task.model)
    for client, (_, kept) in work.outcomes.items():
        if kept is not None:
            state[memory_key(client)] = wire.arrays(**kept)
    for _, result in results:
        result.params = result.params.cpu()
    uploads = {c: upload for c, (upload, _) in work.outcomes.items()}
    return wire.steps_reply(uploads, results)


def answer_scores(
    node: NodeData, executor: SequentialExecutor, algorithm: Algorithm, content: wire.RecordDict
):
    """Each client's accuracies (and a held-out client's ω) from logits computed here."""
    models, jobs = wire.read_scores_request(content, algorithm.Step)
    device, data = executor.device, node.data
    models = models.to(device)
    accuracy, omegas, finite = {}, {}, True
    for job in jobs:
        local = node.rows(job.rows)
        labels = data.labels[local].to(device)
        raw = executor.logits(models, data.images[local].to(device))
        finite = finite and bool(torch.isfinite(raw).all())
        predictors = algorithm.combine_logits(raw)  # the base's: the first K rows
        omega = job.omega
        if job.step is not None:
            omega = omegas[job.client] = held_out_omega(
                job.step, predictors[:, : job.train], labels[: job.train]
            )
        accuracy[job.client] = client_accuracy(predictors, labels, job.train, omega)
    return wire.scores_reply(accuracy, omegas, finite)


def answer_logits(node: NodeData, executor: SequentialExecutor, content: wire.RecordDict):
    models, rows = wire.read_logits_request(content)
    images = node.data.images[node.rows(rows)].to(executor.device)
    return wire.logits_reply(executor.logits(models.to(executor.device), images).float().cpu())


def answer_train(node: NodeData, executor: SequentialExecutor, content: wire.RecordDict):
    """The client's tasks through the node's executor (batched on a GPU, one by one on a CPU)."""
    jobs, executor.lr = wire.read_train_request(content)
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
