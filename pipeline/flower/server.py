"""The fedrc server on Flower: fedrc's round loop, with the clients' samples on SuperNodes.

The ServerApp runs `pipeline.run.training.train_run` unchanged. Two things differ from one process:

- its `FederatedData` holds global row ids where images would be (`server_data`): labels and
  the benchmark's layout come from the manifest and the nodes' hellos, pixels never leave a node;
- for an algorithm with a client part, its `RemoteClients` sends each client's `ClientStep`
  to the node holding it, which runs the client's E-step, local trainings and evaluation there
  and sends back what the algorithm's paper sends (ω_i, FedRC's label tables, …), the trained
  models, and per-client accuracies: labels, logits and γ stay on the nodes;
- for any other algorithm (the fallback), its executor (`RemoteExecutor`) answers `logits` and
  `stream` by asking the nodes that hold those rows (`Nodes.exchange`), and the server runs the
  E-step from the logits and the labels the nodes sent in their hellos.

The algorithm's server part (aggregation, its state) runs here, exactly as in `fedrc train`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message, RecordDict

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.base import Algorithm
from pipeline.common.errors import FedrcError
from pipeline.config import TrainConfig
from pipeline.data.meaning import read_benchmark
from pipeline.data.records import Manifest
from pipeline.data.shards import FederatedData, client_spans, over_steps
from pipeline.engine import SequentialExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.engine.task import Job, LocalResult, LocalTask
from pipeline.flower import wire
from pipeline.flower.appconfig import Deployment, check_config
from pipeline.places.communicate import Communicator
from pipeline.run.clients import ClientWork, LocalClients, receive_held_out, score_tables
from pipeline.run.files import checkpoint_round
from pipeline.run.setup import run_model, sgd_options
from pipeline.run.training import train_run

log = logging.getLogger("fedrc.flower")
WINDOW = 2  # requests in flight per node: one being worked on, one waiting in the SuperLink
MESSAGE_TASKS = 12  # local trainings per message (K = 3: four clients of a node)


class NodeLost(FedrcError):
    """A node stopped answering where the run cannot go on without it (one line)."""


class Nodes:
    """The run's SuperNodes, the clients each holds, and request / reply with time limits."""

    def __init__(self, grid, manifest: Manifest, deployment: Deployment) -> None:
        self.grid, self.manifest, self.deployment = grid, manifest, deployment
        self.holder: dict[int, int] = {}  # client → node id
        self.labels: dict[int, torch.Tensor] = {}  # client → labels of its rows
        self.greeted: set[int] = set()  # nodes asked what they hold since they last joined
        self.lost: set[int] = set()  # nodes ignored until they leave the SuperLink and rejoin
        self.traffic = {"sent": 0, "received": 0}  # bytes of records, both ways

    def clients_of(self, node: int) -> list[int]:
        return [c for c, n in self.holder.items() if n == node]

    def connected(self) -> set[int]:
        """The nodes online and not lost. A node that left the SuperLink is forgotten, so when
        it rejoins (a restart keeps the id of a registered key) it is greeted again."""
        online = set(self.grid.get_node_ids())
        self.lost &= online
        self.greeted &= online
        return online - self.lost

    def greet(self, nodes: Iterable[int]) -> None:
        """Ask new nodes what they hold; refuse one that holds another benchmark. A client
        that two nodes hold (a node restarted under a new id) goes to the one greeted last."""
        requests = [(node, wire.HELLO, RecordDict()) for node in nodes]
        for (node, *_), content in self.exchange(requests, "hello"):
            hello = wire.read_hello(content)
            if hello.content_hash != self.manifest.content_hash:
                raise FedrcError(
                    f"node {node} ({hello.where}): its shards belong to another benchmark "
                    f"(content hash {hello.content_hash[:12]}, this run's is "
                    f"{self.manifest.content_hash[:12]})"
                )
            offset = 0
            for client in hello.clients:
                if self.holder.get(client, node) != node:
                    log.warning(
                        "client %d: node %d takes over from node %d",
                        client,
                        node,
                        self.holder[client],
                    )
                size = self.manifest.clients[client].size
                if hello.labels is not None:
                    self.labels[client] = hello.labels[offset : offset + size]
                self.holder[client] = node
                offset += size
            self.greeted.add(node)

    def connect(self) -> None:
        """Wait (`fedrc-wait` seconds) until the connected nodes hold every client."""
        deadline = time.monotonic() + self.deployment.wait
        everyone = set(range(len(self.manifest.clients)))
        while True:
            new = self.connected() - self.greeted
            if new:
                self.greet(sorted(new))
            missing = everyone - set(self.holder)
            if not missing:
                log.info("fedrc: %s", self.held_out_line())
                return
            if time.monotonic() > deadline:
                raise FedrcError(
                    f"fedrc-wait: after {self.deployment.wait:g} s no connected node holds "
                    f"clients {sorted(missing)[:10]}{' …' if len(missing) > 10 else ''} "
                    f"({len(self.connected())} node(s) connected)"
                )
            time.sleep(0.5)

    def held_out_line(self) -> str:
        """Where the held-out clients are, whose accuracy is the global accuracy: with
        explicit `fedrc-clients`, some node must list them, and this says which one does."""
        where: dict[int, list[int]] = defaultdict(list)
        for client in self.manifest.held_out:
            where[self.holder[client]].append(client)
        nodes = (f"{', '.join(map(str, c))} on node {n}" for n, c in sorted(where.items()))
        return f"held-out clients (global accuracy): {'; '.join(nodes)}"

    def refresh(self) -> None:
        """Forget nodes that left; greet nodes that (re)joined. A newcomer that cannot say what
        it holds (an error, no answer, another benchmark) is ignored with a warning until it
        leaves and rejoins: the run goes on with the nodes it has."""
        online = self.connected()
        for client, node in list(self.holder.items()):
            if node not in online:
                del self.holder[client]
        for node in sorted(online - self.greeted):
            try:
                self.greet([node])
            except FedrcError as e:
                log.warning("%s; node %d is ignored until it rejoins", e, node)
                self.lost.add(node)

    def exchange(
        self, requests: list[tuple[int, str, RecordDict]], phase: str
    ) -> Iterator[tuple[tuple[int, str, RecordDict], RecordDict]]:
        """Each (node, message type, content) request with its reply's content, as replies
        arrive, at most `WINDOW` in flight per node. A node that answers with an error or not
        within `fedrc-timeout` seconds is lost: in local training with `fedrc-on-node-loss:
        continue` its remaining requests are dropped, otherwise the run stops with one line."""
        ex = Exchange(requests, phase)
        for index, (node, *_) in enumerate(requests):
            ex.queues[node].append(index)
        pause = 0.01
        while ex.queues or ex.pending:
            self._push(ex)
            replies = list(self.grid.pull_messages(list(ex.pending))) if ex.pending else []
            for reply in replies:
                answered = self._answered(ex, reply)
                if answered is not None:
                    yield answered
            self._expire(ex)
            pause = 0.01 if replies else min(pause * 2, 0.5)
            if not replies:
                time.sleep(pause)

    def _push(self, ex: Exchange) -> None:
        """Send each node's next requests while it has fewer than `WINDOW` in flight."""
        outgoing = []
        for node, queue in list(ex.queues.items()):
            while queue and ex.busy[node] < WINDOW:
                outgoing.append(queue.pop(0))
                ex.busy[node] += 1
            if not queue:
                del ex.queues[node]
        if not outgoing:
            return
        messages = []
        for index in outgoing:
            node, kind, content = ex.requests[index]
            self.traffic["sent"] += record_bytes(content)
            messages.append(Message(content, dst_node_id=node, message_type=kind))
        ids = list(self.grid.push_messages(messages))
        ids += [None] * (len(outgoing) - len(ids))  # a push refused whole returns []
        deadline = time.monotonic() + self.deployment.timeout
        refused = []
        for index, message_id in zip(outgoing, ids):
            if message_id is None:
                refused.append(ex.requests[index][0])
            else:
                ex.pending[message_id] = (index, deadline)
        for node in dict.fromkeys(refused):  # each node once, all its ids known
            self.lose(ex, node, "the SuperLink refused the message")

    def _answered(
        self, ex: Exchange, reply: Message
    ) -> tuple[tuple[int, str, RecordDict], RecordDict] | None:
        """The request a reply answers with its content; None when the reply is an error (its
        node is lost)."""
        index, _ = ex.pending.pop(reply.metadata.reply_to_message_id)
        node = ex.requests[index][0]
        ex.busy[node] -= 1
        # a node works on one message at a time: the clock of its next one starts now
        restart = time.monotonic() + self.deployment.timeout
        for message_id, (other, _) in ex.pending.items():
            if ex.requests[other][0] == node:
                ex.pending[message_id] = (other, restart)
        if reply.has_error():
            self.lose(ex, node, reply.error.reason)
            return None
        self.traffic["received"] += record_bytes(reply.content)
        error = wire.failed(reply.content)
        if error is not None and error[1] is None:  # a diverged training: the loop's
            raise FedrcError(f"node {node}: {error[0]}")
        return ex.requests[index], reply.content

    def _expire(self, ex: Exchange) -> None:
        """Lose the nodes whose request went unanswered past its deadline."""
        now = time.monotonic()
        for message_id, (index, deadline) in list(ex.pending.items()):
            if now > deadline and message_id in ex.pending:
                node = ex.requests[index][0]
                reason = f"no answer within fedrc-timeout ({self.deployment.timeout:g} s)"
                self.lose(ex, node, reason)

    def lose(self, ex: Exchange, node: int, reason: str) -> None:
        """Stop with one line, or (local training, `continue`) forget the node and drop its
        requests still queued or in flight."""
        clients = self.clients_of(node)
        shown = f"{clients[:10]}{' …' if len(clients) > 10 else ''}"
        line = f"node {node} (clients {shown}) was lost during {ex.phase}: {reason}"
        if ex.phase != "local training" or self.deployment.on_node_loss == "stop":
            raise NodeLost(line)
        log.warning("%s; the round finishes without it", line)
        self.lost.add(node)
        ex.queues.pop(node, None)
        for message_id, (index, _) in list(ex.pending.items()):
            if ex.requests[index][0] == node:
                del ex.pending[message_id]
        for client in clients:
            del self.holder[client]


@dataclass
class Exchange:
    """One `Nodes.exchange`: its requests, phase, the indices still to send per node, the
    message ids in flight (→ request, deadline) and how many each node has in flight."""

    requests: list[tuple[int, str, RecordDict]]
    phase: str
    queues: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[str, tuple[int, float]] = field(default_factory=dict)
    busy: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def record_bytes(content: RecordDict) -> int:
    """Bytes of a message's arrays and scalars as Flower counts them."""
    return sum(record.count_bytes() for record in content.values())


class FlowerPlace(Communicator):
    """The server: the only place, holding every client through the connected nodes."""

    def __init__(self, nodes: Nodes) -> None:
        super().__init__(torch.device("cpu"))
        self.nodes = nodes
        self.counted = dict(nodes.traffic)  # the greetings before round 1 are not a round's

    def measured_bytes(self) -> dict[str, int]:
        """The bytes of records sent to and received from the nodes since the last call."""
        now = dict(self.nodes.traffic)
        measured = {f"flower_bytes_{k}": now[k] - self.counted[k] for k in now}
        self.counted = now
        return measured

    def present(self, clients: list[int]) -> list[int]:
        self.nodes.refresh()
        return [c for c in clients if c in self.nodes.holder]


def server_data(manifest: Manifest, labels: dict[int, torch.Tensor]) -> FederatedData:
    """The benchmark as the server sees it (at step 0 of a drifting one): `images` holds each
    row's global id; `labels` are −1 where the nodes kept them (an algorithm with a client
    part never reads them here)."""
    spans = client_spans(manifest)
    rows = torch.arange(sum(c.size for c in manifest.clients))
    unknown = [torch.full((c.size,), -1, dtype=torch.int64) for c in manifest.clients]
    ordered = torch.cat([labels.get(c, unknown[c]) for c in range(len(manifest.clients))])
    ordered = ordered.to(torch.int64)
    train, test = [s[0][0] for s in spans], [s[0][1] for s in spans]
    return over_steps(FederatedData(rows, ordered, train, test, manifest, rows, rows), spans)


class RemoteExecutor(SequentialExecutor):
    """An executor whose samples live on the nodes: its `images` are global row ids.

    The model it holds serves only for the layout (initial models, parameter counts)."""

    def __init__(self, config: TrainConfig, manifest: Manifest, nodes: Nodes) -> None:
        model = run_model(config, manifest.image_shape, manifest.num_classes)
        super().__init__(model, torch.device("cpu"), **sgd_options(config))
        self.nodes = nodes
        self.row_client = wire.global_layout(manifest)[1]

    def logits(self, models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Logits on global rows `images`, each node computing those of the rows it holds."""
        rows = images
        if rows.numel() == 0:
            return torch.zeros(models.shape[0], 0, 0)
        clients = self.row_client[rows]
        positions: dict[int, list[torch.Tensor]] = defaultdict(list)  # node id → positions
        for client in clients.unique().tolist():
            node = self.nodes.holder.get(client)
            if node is None:
                raise NodeLost(f"client {client}: no connected node holds it")
            positions[node].append(torch.nonzero(clients == client).squeeze(1))
        where = {node: torch.cat(parts) for node, parts in positions.items()}
        requests = [
            (n, wire.LOGITS, wire.logits_request(models, rows[p])) for n, p in where.items()
        ]
        out = None
        for (node, *_), content in self.nodes.exchange(requests, "logits"):
            part = wire.read_logits(content)
            if out is None:
                out = part.new_empty((models.shape[0], rows.numel(), part.shape[-1]))
            out[:, where[node]] = part
        return out

    def stream(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, LocalResult]]:
        """Each node trains its clients' tasks, up to `MESSAGE_TASKS` in one message (a
        message costs a ClientApp start on the node); results are yielded as replies come."""
        by_node: dict[int, list[list[Job]]] = defaultdict(list)
        for job in jobs:
            batches = by_node[self.nodes.holder[job[0].client]]
            if not batches or len(batches[-1]) == MESSAGE_TASKS:
                batches.append([])
            batches[-1].append(job)
        batches = [(node, batch) for node, batch_list in by_node.items() for batch in batch_list]
        requests = [
            (
                node,
                wire.TRAIN,
                wire.train_request([wire.TrainJob(t, r, s) for t, r, _, s in batch], self.lr),
            )
            for node, batch in batches
        ]
        batch_of = {id(request[2]): batch for request, (_, batch) in zip(requests, batches)}
        for request, content in self.nodes.exchange(requests, "local training"):
            batch = batch_of[id(request[2])]
            error = wire.failed(content)
            if error is not None:
                raise NonFiniteLoss(error[0], job=batch[error[1]])
            yield from zip(batch, wire.read_train_reply(content))


class RemoteClients(LocalClients):
    """The client parts of a round on the nodes holding the clients (`wire.STEPS`,
    `wire.SCORES`): the server sends steps and models, the nodes send uploads, trained models
    and accuracies."""

    executor: RemoteExecutor

    def by_node(self, clients: list[int], per_message: int) -> dict[int, list[list[int]]]:
        """Each node's clients, `per_message` in a message."""
        out: dict[int, list[list[int]]] = defaultdict(list)
        for client in clients:
            node = self.executor.nodes.holder.get(client)
            if node is None:
                raise NodeLost(f"client {client}: no connected node holds it")
            batches = out[node]
            if not batches or len(batches[-1]) == per_message:
                batches.append([])
            batches[-1].append(client)
        return out

    def train(self, work: ClientWork) -> Iterator[tuple[Job, LocalResult]]:
        data, models = work.data, work.models
        requests = []
        per_message = max(1, MESSAGE_TASKS // models.shape[0])  # local trainings a message
        for node, batches in self.by_node(list(work.steps), per_message).items():
            for batch in batches:
                parts = [
                    (c, work.steps[c], data.images[data.train_slices[c]], work.seeds[c])
                    for c in batch
                ]
                request = wire.steps_request(models, parts, self.executor.lr)
                requests.append((node, wire.STEPS, request))
        for _, content in self.executor.nodes.exchange(requests, "local training"):
            error = wire.failed(content)
            if error is not None:  # a diverged training (`exchange` raised any other error)
                client, model = wire.diverged_task(content)
                task = LocalTask(model, models[model], torch.empty(0))
                task.client = client
                raise NonFiniteLoss(error[0], job=(task,))
            uploads, results = wire.read_steps_reply(content, models)
            work.outcomes.update({c: (upload, None) for c, upload in uploads.items()})
            for task, result in results:
                yield (task,), result

    def evaluate(
        self,
        algorithm: Algorithm,
        models: torch.Tensor,
        data: FederatedData,
        comm: Communicator,
        groups: dict[str, list[int]] | None = None,
    ) -> tuple[dict[str, Any], None, bool]:
        """`LocalClients.evaluate` on the nodes: no logits come back (None)."""
        present = comm.present(list(range(len(data.clients))))
        omega, held = algorithm.omega_table(), set(data.held_out)
        requests = []
        for node, (clients,) in self.by_node(present, max(1, len(present))).items():
            jobs = []
            for client in clients:
                train, test = data.train_slices[client], data.test_slices[client]
                job = wire.ScoreJob(
                    client, data.images[train.start : test.stop], train.stop - train.start
                )
                if client in held:
                    job.step = algorithm.client_step(client)
                else:
                    job.omega = omega[client]
                jobs.append(job)
            requests.append((node, wire.SCORES, wire.scores_request(models, jobs)))
        accuracy, omegas, finite = {}, {}, True
        for _, content in self.executor.nodes.exchange(requests, "evaluation"):
            scored, fitted, ok = wire.read_scores_reply(content)
            accuracy.update(scored)
            omegas.update(fitted)
            finite = finite and ok
        receive_held_out(algorithm, comm, omegas)
        return score_tables(data, comm, accuracy, groups), None, finite


def remote_executor(nodes: Nodes):
    """An `ExecutorFactory` for `train_run`."""

    def factory(config: TrainConfig, data: FederatedData, device: torch.device) -> RemoteExecutor:
        return RemoteExecutor(config, data.benchmark, nodes)

    return factory


def serve(grid, config: TrainConfig, deployment: Deployment, resume: bool, overwrite: bool) -> Path:
    """The whole run, from the ServerApp: nodes, data, fedrc's training loop."""
    check_config(config)
    manifest = read_benchmark(Path(config.data))
    if not build_algorithm(config, len(manifest.clients), manifest.num_classes).client_part:
        log.warning(
            "fedrc: %s has no client part: every node sends its clients' labels and per-sample "
            "logits here for the E-step; a ClientStep keeps them on the node (docs/plugins.md)",
            config.algorithm,
        )
    nodes = Nodes(grid, manifest, deployment)
    nodes.connect()
    data = server_data(manifest, nodes.labels)
    place = FlowerPlace(nodes)

    def report(row: dict) -> None:
        """One line a round in the ServerApp's log (`flwr run --stream`, `flwr log`): the
        row's numbers, among them the bytes of records sent to and received from the nodes in
        that round (`flower_bytes_sent`, `flower_bytes_received`; metrics.jsonl has them too)."""
        numbers = {k: v for k, v in row.items() if isinstance(v, int | float)}
        log.info("fedrc round %s", json.dumps(numbers))

    try:
        return train_run(
            config, place, resume, overwrite, report, data, remote_executor(nodes), RemoteClients
        )
    except NodeLost as e:
        done = checkpoint_round(Path(config.out))
        if done is None:
            raise
        raise NodeLost(
            f"{e}; rounds 1–{done} are saved: run again with fedrc-resume=true to continue"
        ) from None
