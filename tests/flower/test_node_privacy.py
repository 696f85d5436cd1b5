"""Data stays where it is: with an algorithm's client part, every message a node sends holds
only models, ω, label-count tables and scalars, never a per-sample tensor (labels, logits, γ,
losses), and the run still gives `fedrc train`'s numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flower_runs import assert_same_run, flower_config, node_configs, reference, run_config
from local_grid import LocalGrid

from pipeline.data.shards import read_manifest
from pipeline.flower import wire
from pipeline.flower.appconfig import Deployment
from pipeline.flower.server import serve


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
    """Every length a per-sample tensor of a client, or of a node's clients, could have."""
    manifest = read_manifest(data)
    lengths = set()
    for client in manifest.clients:
        lengths |= {client.size, client.train_size, client.size - client.train_size}
    for config in node_configs(data):
        held = [int(c) for c in config["fedrc-clients"].split(",")]
        lengths.add(sum(manifest.clients[c].size for c in held))
    return lengths


@pytest.mark.parametrize("algorithm", ["fedrc", "ifca"])
def test_nodes_send_no_per_sample_tensor(algorithm: str, tiny_data: Path, tmp_path: Path) -> None:
    config = flower_config(tiny_data, algorithm, tmp_path / "flower", rounds=2)
    configs = node_configs(tiny_data)
    grid = RecordingGrid({101 + i: c for i, c in enumerate(configs)}, run_config(config))
    out = serve(grid, config, Deployment(wait=5, timeout=30), resume=False, overwrite=False)
    assert_same_run(
        reference(flower_config(tiny_data, algorithm, tmp_path / "single", rounds=2)), out
    )

    kinds = {kind for _, kind, _ in grid.sent}
    assert kinds == {wire.HELLO, wire.STEPS, wire.SCORES}  # no logits asked for
    forbidden = per_sample_lengths(tiny_data)
    classes, uploads = read_manifest(tiny_data).num_classes, set()
    for node, kind, content in grid.sent:
        assert wire.failed(content) is None
        for record in content.array_records.values():
            for name in record:
                shape = tuple(record[name].shape)
                assert not forbidden & set(shape), (node, kind, name, shape)
                if kind == wire.HELLO:
                    assert name == "clients" and len(shape) == 1  # its client ids, no labels
                elif kind == wire.SCORES:
                    assert shape in {(2, 2), (2,)}, (name, shape)  # accuracies, a held-out ω
                elif name.startswith("up."):  # ω (K), the label table (K, classes), N_i
                    assert shape in {(2,), (2, classes), ()}, (name, shape)
                    uploads.add(name.split(".", 2)[2])
                else:
                    assert name.endswith(".params") and len(shape) == 1, (name, shape)
    assert uploads == ({"omega", "table", "size"} if algorithm == "fedrc" else {"omega"})
