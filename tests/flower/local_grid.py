"""Flower's `Grid` in one process, for fast tests of the server loop: each pushed message is
answered at once by fedrc's ClientApp with the node config of its destination and the node's
state for the run (`Context.state`, kept between its messages), on one torch thread as a real
node."""

from __future__ import annotations

import itertools

from conftest import torch_threads
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pipeline.flower.apps import client_app


class LocalGrid:
    def __init__(self, nodes: dict[int, dict[str, str]], run_config: dict) -> None:
        self.nodes, self.run_config = nodes, run_config
        self.replies: dict[str, Message] = {}
        self.ids = itertools.count()
        self.down: set[int] = set()  # nodes that stop answering (and leave)
        # each node's Flower state for the run, kept across its messages as a SuperNode does
        self.states = {node: RecordDict() for node in nodes}
        # what a SuperLink sets in a ServerApp process before messages can be made
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    def get_node_ids(self) -> list[int]:
        return [n for n in self.nodes if n not in self.down]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            message_id = f"m{next(self.ids)}"
            message.metadata.__dict__["_message_id"] = message_id
            node = message.metadata.dst_node_id
            ids.append(message_id)
            if node in self.down:
                continue
            state = self.states.setdefault(node, RecordDict())
            context = Context(1, node, self.nodes[node], state, self.run_config)
            with torch_threads(1):  # as a SuperNode of LocalDeployment (OMP_NUM_THREADS=1)
                self.replies[message_id] = client_app(message, context)
        return ids

    def pull_messages(self, message_ids) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]
