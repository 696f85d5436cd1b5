"""Data stays where it is: for every algorithm that runs on Flower, every message a node sends
holds only models, ω, label-count tables, per-model scores and scalars, never a per-sample value
(labels, logits, γ, losses), in its arrays or in its config records; and the run still gives
`fedrc train`'s numbers. An algorithm whose E-step falls back to the server fails here: its
nodes answer logits and send their labels."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from conftest import TINY_PARTITION
from flower_runs import assert_same_run, flower_config, node_configs, reference, run_config
from local_grid import LocalGrid

from pipeline.algorithms import BUILT_IN, num_models
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.records import read_manifest
from pipeline.flower import wire
from pipeline.flower.appconfig import Deployment, check_config
from pipeline.flower.server import serve
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage


def accepted(algorithm: str) -> bool:
    """Whether a Flower deployment takes the algorithm (`check_config` refuses in one line)."""
    try:
        check_config(make_config(algorithm=algorithm))
    except FedrcError:
        return False
    return True


ON_FLOWER = [name for name in BUILT_IN if accepted(name)]
# accepted, but without a client part: their nodes send labels and logits
FALLBACK = {"fedsoft", "ifca-cam", "fesem-cam"}
# what each client part sends up besides its trained models
UPLOADS = {
    "fedrc": {"omega", "table", "size"},
    "feddrift": {"omega", "scores"},
    "feddrift-eager": {"omega", "scores"},
}
# settings that make the three rounds reach each rule's every branch
SETTINGS = {
    "stocfl": {"tau": 0.1},  # clusters merge in round 1 and get models from round 2
    "feddrift": {"clusters": 4, "init": "per-client"},
}
SCALARS = (bool, int, float, str)


class RecordingGrid(LocalGrid):
    """Every reply a node sends: (node, message type, content)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sent: list[tuple[int, str, object]] = []

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        for reply in replies:
            self.sent.append(
                (reply.metadata.src_node_id, reply.metadata.message_type, reply.content)
            )
        return replies


def per_sample_lengths(data: Path) -> set[int]:
    """Every length a per-sample tensor of a client, or of a node's clients, could have, at
    any time step."""
    manifest = read_manifest(data)
    lengths = set()
    for step in range(manifest.time_steps):
        clients = manifest.at_step(step).clients
        for client in clients:
            lengths |= {client.size, client.train_size, client.size - client.train_size}
        for config in node_configs(data):
            held = [int(c) for c in config["fedrc-clients"].split(",")]
            lengths.add(sum(clients[c].size for c in held))
            lengths.add(sum(clients[c].train_size for c in held))
    return lengths


def config_keys(kind: str, values: dict) -> set[str]:
    """The keys a node's config record of this message type may hold: its ids and counts."""
    if kind == wire.HELLO:
        return {"content_hash", "where"}
    if kind == wire.SCORES:
        return {"finite"}
    if kind == wire.STEPS:
        fields = ("client", "model", "weight", "loss")
        return {"uploads", "tasks"} | {f"{j}.{f}" for j in range(values["tasks"]) for f in fields}
    return set()


def check_run(data: Path, algorithm: str, tmp_path: Path) -> set[str]:
    """The algorithm through 3 nodes: no reply holds a per-sample value (`check_messages`), and
    the run has `fedrc train`'s numbers. Returns the names of the uploads."""
    sets = SETTINGS.get(algorithm, {})
    config = flower_config(data, algorithm, tmp_path / "flower", **sets)
    grid = RecordingGrid({101 + i: c for i, c in enumerate(node_configs(data))}, run_config(config))
    out = serve(grid, config, Deployment(wait=5, timeout=30), resume=False, overwrite=False)
    uploads = check_messages(grid, data, num_models(config))
    assert_same_run(reference(flower_config(data, algorithm, tmp_path / "single", **sets)), out)
    return uploads


def check_messages(grid: RecordingGrid, data: Path, k: int) -> set[str]:
    """Assert that no reply of the K-model run holds a per-sample value; returns the names of
    the uploads."""
    kinds = {kind for _, kind, _ in grid.sent}
    assert kinds == {wire.HELLO, wire.STEPS, wire.SCORES}, kinds  # no logits, no tasks
    forbidden = per_sample_lengths(data)
    classes, uploads = read_manifest(data).num_classes, set()
    for node, kind, content in grid.sent:
        assert wire.failed(content) is None
        for record in content.array_records.values():
            for name in record:
                shape = tuple(record[name].shape)
                assert not forbidden & set(shape), (node, kind, name, shape)
                if kind == wire.HELLO:
                    assert name == "clients" and len(shape) == 1  # its client ids, no labels
                elif kind == wire.SCORES:
                    assert shape in {(2, 2), (k,)}, (name, shape)  # accuracies, a held-out ω
                elif name.startswith("up."):  # ω, K scores or loss sums, a label table, N_i
                    assert shape in {(k,), (k, classes), ()}, (name, shape)
                    uploads.add(name.split(".", 2)[2])
                else:
                    assert name.endswith(".params") and len(shape) == 1, (name, shape)
        for record in content.config_records.values():
            assert set(record) <= config_keys(kind, record), (node, kind, sorted(record))
            for name, value in record.items():
                assert isinstance(value, SCALARS), (node, kind, name, type(value))
                if name == "uploads":  # the ids of the clients whose uploads follow
                    assert all(part.isdigit() for part in value.split(",") if part), value
    return uploads


def expected(algorithm: str) -> object:
    """The test's case for `algorithm`: one without a client part must fail it (strict: once
    it has one, it leaves `FALLBACK`)."""
    marks = []
    if algorithm in FALLBACK:
        reason = "no client part: its E-step runs on the server (docs/flower.md, The fallback)"
        marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason))
    return pytest.param(algorithm, marks=marks)


def test_flower_refuses_only_statistics_staged_training_and_rules() -> None:
    refused = {"pacfl", "flux", "fedccfa", "apfl", "pfedme", "fedgwc", "feddaa", "floco"}
    assert set(BUILT_IN) - set(ON_FLOWER) == refused


@pytest.mark.parametrize("algorithm", [expected(a) for a in ON_FLOWER])
def test_nodes_send_no_per_sample_value(algorithm: str, tiny_data: Path, tmp_path: Path) -> None:
    assert check_run(tiny_data, algorithm, tmp_path) == UPLOADS.get(algorithm, {"omega"})


def message_shapes(grid: RecordingGrid) -> list[tuple]:
    """What the nodes sent, without the numbers: each reply's type, its arrays' names and
    shapes and its config records' keys, in order."""
    return [
        (
            node,
            kind,
            sorted(
                (name, tuple(record[name].shape))
                for record in content.array_records.values()
                for name in record
            ),
            sorted(key for record in content.config_records.values() for key in record),
        )
        for node, kind, content in grid.sent
    ]


@pytest.mark.parametrize(
    ("parent", "plugin"),
    [("fedavg", "server_momentum:FedAvgM"), ("ifca", "server_momentum:IFCAM")],
)
def test_a_plugin_on_a_built_in_sends_what_its_parent_sends(
    parent: str, plugin: str, tiny_data: Path, tmp_path: Path
) -> None:
    """Server momentum overrides `aggregate` only (tests/server_momentum.py): its nodes send
    exactly the messages of its parent's, with no per-sample value, and its Flower run has its
    `fedrc train` numbers."""
    sent = {}
    for algorithm in (parent, plugin):
        config = flower_config(tiny_data, algorithm, tmp_path / algorithm.replace(":", "-"))
        grid = RecordingGrid(
            {101 + i: c for i, c in enumerate(node_configs(tiny_data))}, run_config(config)
        )
        out = serve(grid, config, Deployment(wait=5, timeout=30), resume=False, overwrite=False)
        assert check_messages(grid, tiny_data, num_models(config)) == {"omega"}
        sent[algorithm] = message_shapes(grid)
        single = flower_config(
            tiny_data, algorithm, tmp_path / "single" / algorithm.replace(":", "-")
        )
        assert_same_run(reference(single), out)
    assert sent[plugin] == sent[parent]


@pytest.fixture(scope="module")
def drifting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("drift") / "data"
    partition_stage(PartitionConfig(**TINY_PARTITION, time_steps=3, drift_share=0.3, out=str(data)))
    return data


@pytest.mark.parametrize("algorithm", ["feddrift", "feddrift-eager"])
def test_drift_checks_and_merges_send_per_model_scores_only(
    algorithm: str, drifting: Path, tmp_path: Path
) -> None:
    """On a drifting benchmark each step opens with a scoring pass: K mean losses a client,
    and while FedDrift's merge is due, K loss sums and N_i."""
    merges = {"sums", "size"} if algorithm == "feddrift" else set()
    assert check_run(drifting, algorithm, tmp_path) == UPLOADS[algorithm] | merges


@pytest.mark.parametrize("algorithm", ["ifca", "fedsoft"])
def test_the_rounds_rate_and_the_optimizers_reach_the_nodes(
    algorithm: str, tiny_data: Path, tmp_path: Path
) -> None:
    """FedAdam on the server, AdamW on the nodes, a rate halved every round: the Flower run has
    `fedrc train`'s numbers, through a client part (IFCA: the rate in the steps request) and
    through the fallback (FedSoft: in each training request)."""
    values = dict(server_opt="adam", server_lr=0.01, optimizer="adamw", weight_decay=0.01,
                  lr_schedule="step", lr_step_rounds=1, lr_gamma=0.5)  # fmt: skip
    config = flower_config(tiny_data, algorithm, tmp_path / "flower", **values)
    grid = RecordingGrid({101 + i: c for i, c in enumerate(node_configs(tiny_data))},
                         run_config(config))  # fmt: skip
    out = serve(grid, config, Deployment(wait=5, timeout=30), resume=False, overwrite=False)
    single = flower_config(tiny_data, algorithm, tmp_path / "single", **values)
    assert_same_run(reference(single), out)
