"""The fedrc server on Flower, against a Grid in this process (`local_grid.LocalGrid`): the same
numbers as `fedrc train` for every kind of algorithm, nodes lost, nodes refused."""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from conftest import TINY_PARTITION
from flower_runs import assert_same_run, flower_config, node_configs, reference, run_config
from flwr.app import RecordDict
from local_grid import LocalGrid

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.records import read_manifest
from pipeline.flower import wire
from pipeline.flower.appconfig import Deployment
from pipeline.flower.server import NodeLost, Nodes, serve
from pipeline.run.files import METRICS, checkpoint_round, read_metrics
from pipeline.run.training import sample_clients
from pipeline.stages import partition_stage

FAST = Deployment(wait=5, timeout=30)


def grid_for(data: Path, config, nodes: int = 3) -> LocalGrid:
    configs = node_configs(data, nodes)
    return LocalGrid({101 + i: c for i, c in enumerate(configs)}, run_config(config))


@pytest.mark.parametrize(
    "algorithm",
    ["fedavg", "fedrc", "cfl", "fesem-cam", "ifca", "fedem", "stocfl", "cfl-gp", "feddrift"],
)
def test_flower_server_equals_fedrc_train(algorithm: str, tiny_data: Path, tmp_path: Path) -> None:
    """Soft (FedRC with Adam E-step and pruning, FedEM), hard (IFCA, CFL splitting, CFL-GP) and
    additive models (FeSEM-CAM): each through 3 nodes holding 5 clients each."""
    expected = reference(flower_config(tiny_data, algorithm, tmp_path / "single"))
    config = flower_config(tiny_data, algorithm, tmp_path / "flower")
    out = serve(grid_for(tiny_data, config), config, FAST, resume=False, overwrite=False)
    assert_same_run(expected, out)  # bytes_down and bytes_up too: counted alike
    # what the records measured on the wire, each round (evaluation included)
    rows = read_metrics(out / METRICS)
    assert all(r["flower_bytes_sent"] > 0 and r["flower_bytes_received"] > 0 for r in rows)


def test_flower_server_on_a_drifting_benchmark(tmp_path: Path) -> None:
    """Nodes serve their clients' rows of the round's time step: 3 steps, a round each."""
    data = tmp_path / "drift"
    partition_stage(PartitionConfig(**TINY_PARTITION, time_steps=3, drift_share=0.3, out=str(data)))
    expected = reference(flower_config(data, "fedem", tmp_path / "single"))
    config = flower_config(data, "fedem", tmp_path / "flower")
    out = serve(grid_for(data, config), config, FAST, resume=False, overwrite=False)
    assert_same_run(expected, out)
    assert [r["step"] for r in read_metrics(out / METRICS)] == [0, 1, 2]


def test_flower_server_runs_fedsoft(tiny_data: Path, tmp_path: Path) -> None:
    """FedSoft (personal models, scored on the nodes) runs to the end with fedrc train's
    numbers up to its hard E-step: a sample's arg-min model can flip on the last bit of logits
    that a node computed in another batch, so parameters agree to 1e-3, not 1e-5."""
    expected = reference(flower_config(tiny_data, "fedsoft", tmp_path / "single"))
    config = flower_config(tiny_data, "fedsoft", tmp_path / "flower")
    out = serve(grid_for(tiny_data, config), config, FAST, resume=False, overwrite=False)
    rows = [read_metrics(run / METRICS) for run in (expected, out)]
    assert [r["round"] for r in rows[1]] == [1, 2, 3]
    for a, b in zip(*rows):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-3)
        assert b["global_accuracy"] == pytest.approx(a["global_accuracy"], abs=0.05)


class DyingGrid(LocalGrid):
    """A node that stops answering after its first local-training message of round 2 (the
    client parts' `train.steps`, or the fallback's `train.fedrc`)."""

    def __init__(self, *args, victim: int) -> None:
        super().__init__(*args)
        self.victim, self.trained = victim, 0

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            if message.metadata.dst_node_id == self.victim and message.metadata.message_type in (
                wire.TRAIN,
                wire.STEPS,
            ):
                self.trained += 1
                if self.trained == 2:  # round 2: silent from now on, and gone from the SuperLink
                    self.down.add(self.victim)
        return super().push_messages(messages)


def losing_node_102(grid_class, data: Path, out: Path, rounds: int):
    """FedAvg with evaluation at the end, losing node 102 in round 2 (`continue`): the
    configuration, the metrics rows, and the clients of node 102."""
    config = flower_config(data, "fedavg", out, rounds=rounds, eval_every=rounds)
    grid = grid_class(grid_for(data, config).nodes, run_config(config), victim=102)
    deployment = Deployment(wait=5, timeout=2, on_node_loss="continue")
    serve(grid, config, deployment, resume=False, overwrite=False)
    lost = {int(c) for c in node_configs(data)[1]["fedrc-clients"].split(",")}
    return config, read_metrics(out / METRICS), lost


def test_lost_node_the_round_finishes_without_it(tiny_data: Path, tmp_path: Path) -> None:
    config, rows, lost = losing_node_102(DyingGrid, tiny_data, tmp_path / "run", rounds=3)
    assert [r["round"] for r in rows] == [1, 2, 3]
    # round 3 samples as usual, and the lost node's clients sit out as if not sampled
    sampled = sample_clients(list(range(12)), config.participation, config.seed, 3)
    assert rows[2]["clients"] == len([c for c in sampled if c not in lost]) < len(sampled)
    assert "global_accuracy" not in rows[1]  # evaluation only at the end (eval_every 3)


class RejoiningGrid(DyingGrid):
    """The lost node leaves the SuperLink (seen gone once) and comes back with its id, as a
    restarted SuperNode with a registered key does."""

    def get_node_ids(self) -> list[int]:
        ids = super().get_node_ids()
        self.down.discard(self.victim)
        return ids


def test_lost_node_that_rejoins_is_greeted_again(tiny_data: Path, tmp_path: Path) -> None:
    config, rows, lost = losing_node_102(RejoiningGrid, tiny_data, tmp_path / "run", rounds=4)
    third, fourth = (sample_clients(list(range(12)), 0.5, config.seed, r) for r in (3, 4))
    # round 3 finds it gone; round 4 finds it back and greets it
    assert rows[2]["clients"] == len([c for c in third if c not in lost]) < len(third)
    assert rows[3]["clients"] == len(fourth) and lost & set(fourth)
    assert "clients_scored" not in rows[3]  # every client scored again


def test_a_newcomer_that_cannot_join_is_ignored(tiny_data: Path, tmp_path: Path) -> None:
    """A node that appears mid-run holding another benchmark: a warning, and the run goes on."""
    other = tmp_path / "other"
    partition_stage(PartitionConfig(**{**TINY_PARTITION, "seed": 1}, out=str(other)))
    config = flower_config(tiny_data, "fedavg", tmp_path / "run", rounds=2)
    nodes = grid_for(tiny_data, config).nodes
    grid = LateGrid({**nodes, 104: {"fedrc-data": str(other)}}, run_config(config), late=104)
    out = serve(grid, config, FAST, resume=False, overwrite=False)
    assert [r["round"] for r in read_metrics(out / METRICS)] == [1, 2]
    assert grid.greeted_late  # it was asked, and refused


class LateGrid(LocalGrid):
    """Node `late` is listed only after the first local training has been sent."""

    def __init__(self, *args, late: int) -> None:
        super().__init__(*args)
        self.late, self.trained, self.greeted_late = late, False, False

    def get_node_ids(self) -> list[int]:
        return [n for n in super().get_node_ids() if n != self.late or self.trained]

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            self.trained |= message.metadata.message_type in (wire.TRAIN, wire.STEPS)
            self.greeted_late |= message.metadata.dst_node_id == self.late
        return super().push_messages(messages)


class SerialGrid(LocalGrid):
    """Each node works on one message at a time, `seconds` each, as a SuperNode does; a push
    of more than `accept` messages is refused whole (`[]`, as on an HTTP 413)."""

    def __init__(self, *args, seconds: float, accept: int = 100) -> None:
        super().__init__(*args)
        self.seconds, self.accept = seconds, accept
        self.ready: dict[str, float] = {}
        self.free: dict[int, float] = defaultdict(float)

    def push_messages(self, messages):
        messages = list(messages)
        if len(messages) > self.accept:
            return []
        ids = super().push_messages(messages)
        for message_id, message in zip(ids, messages):
            node = message.metadata.dst_node_id
            self.free[node] = max(self.free[node], time.monotonic()) + self.seconds
            self.ready[message_id] = self.free[node]
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        due = [i for i in message_ids if self.ready.get(i, now + 1) <= now]
        return super().pull_messages(due)


def test_timeout_counts_from_when_a_node_can_start_the_request(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A node holds up to two requests at once (one in work, one waiting): each may take
    almost the whole fedrc-timeout, and none is lost for the wait before it."""
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    grid = SerialGrid(grid_for(tiny_data, config).nodes, run_config(config), seconds=0.7)
    nodes = Nodes(grid, read_manifest(tiny_data), Deployment(wait=5, timeout=1.0))
    nodes.connect()  # three hellos, one per node, 0.7 s each: in time
    requests = [(102, wire.HELLO, RecordDict()) for _ in range(4)]
    assert len(list(nodes.exchange(requests, "local training"))) == 4  # 2.8 s on one node
    assert not nodes.lost


def test_a_refused_push_loses_its_nodes_once(tiny_data: Path, tmp_path: Path) -> None:
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    grid = SerialGrid(grid_for(tiny_data, config).nodes, run_config(config), seconds=0, accept=3)
    deployment = Deployment(wait=5, timeout=1.0, on_node_loss="continue")
    nodes = Nodes(grid, read_manifest(tiny_data), deployment)
    nodes.connect()
    requests = [(n, wire.HELLO, RecordDict()) for n in (101, 101, 102, 102)]
    assert list(nodes.exchange(requests, "local training")) == []
    assert nodes.lost == {101, 102} and not nodes.clients_of(101) and not nodes.clients_of(102)
    grid.accept = 1
    with pytest.raises(NodeLost, match=r"node 103 .* was lost during logits"):
        list(nodes.exchange([(103, wire.HELLO, RecordDict())] * 4, "logits"))


def test_lost_node_stops_the_run_in_one_line(tiny_data: Path, tmp_path: Path) -> None:
    config = flower_config(tiny_data, "fedavg", tmp_path / "run", rounds=3, eval_every=3)
    grid = DyingGrid(grid_for(tiny_data, config).nodes, run_config(config), victim=102)
    deployment = Deployment(wait=5, timeout=2, on_node_loss="stop")
    with pytest.raises(
        FedrcError, match=r"node 102 \(clients \[1, 4, 7, 10, 13\]\) was lost during local training"
    ) as error:
        serve(grid, config, deployment, resume=False, overwrite=False)
    assert "\n" not in str(error.value)
    out = Path(config.out)
    assert checkpoint_round(out) == 1  # round 1 is whole on disk, round 2 left nothing
    assert [r["round"] for r in read_metrics(out / METRICS)] == [1]
    assert not list(out.glob("*.tmp*"))


def test_node_with_another_benchmark_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    partition_stage(
        PartitionConfig(
            dataset="synthetic",
            clients=12,
            samples_per_client=60,
            holdout_samples=200,
            seed=1,
            out=str(other),
        )
    )
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    nodes = grid_for(tiny_data, config).nodes
    nodes[102] = {**nodes[102], "fedrc-data": str(other)}
    grid = LocalGrid(nodes, run_config(config))
    with pytest.raises(
        FedrcError, match=rf"node 102 \({other}\): its shards belong to another benchmark"
    ):
        serve(grid, config, FAST, resume=False, overwrite=False)
    assert not Path(config.out).exists()


def test_missing_clients_and_bad_node_config_are_one_line(tiny_data: Path, tmp_path: Path) -> None:
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    nodes = grid_for(tiny_data, config).nodes
    del nodes[103]
    with pytest.raises(
        FedrcError,
        match=r"fedrc-wait: after 0 s no connected node holds clients \[2, 5, 8, 11, 14\]",
    ):
        serve(LocalGrid(nodes, run_config(config)), config, Deployment(wait=0), False, False)
    nodes[103] = {"fedrc-data": str(tiny_data), "fedrc-clients": "2,99"}
    with pytest.raises(
        FedrcError, match=r"node 103: fedrc-clients: \[99\] not among the benchmark's 15 clients"
    ):
        serve(LocalGrid(nodes, run_config(config)), config, FAST, False, False)


def test_persistent_momentum_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    config = flower_config(tiny_data, "fedavg", tmp_path / "run", persistent_momentum=True)
    with pytest.raises(FedrcError, match="persistent_momentum: not available on Flower"):
        serve(grid_for(tiny_data, config), config, FAST, False, False)


def test_an_algorithm_asking_for_statistics_is_refused_in_one_line(
    tiny_data: Path, tmp_path: Path
) -> None:
    """PACFL's clients send subspace signatures (`describe`), which the nodes do not compute."""
    config = flower_config(tiny_data, "pacfl", tmp_path / "run")
    with pytest.raises(
        FedrcError, match=r"^train\.algorithm: pacfl asks clients for a statistic [^\n]*$"
    ):
        serve(grid_for(tiny_data, config), config, FAST, False, False)
    assert not (tmp_path / "run").exists()


def test_a_staged_algorithm_is_refused_in_one_line(tiny_data: Path, tmp_path: Path) -> None:
    """FedCCFA's tasks carry stages, class anchors and a request for prototypes, which the
    train message (`wire`) does not serialise: refused before anything is written."""
    config = flower_config(tiny_data, "fedccfa", tmp_path / "run")
    with pytest.raises(FedrcError, match=r"^train\.algorithm: fedccfa trains in stages [^\n]*$"):
        serve(grid_for(tiny_data, config), config, FAST, False, False)
    assert not (tmp_path / "run").exists()


def test_step_losses_are_refused_in_one_line(tiny_data: Path, tmp_path: Path) -> None:
    """FedGWC's clients send each local step's loss, which a rule records (`StepLosses`)
    and the train message does not carry."""
    config = flower_config(tiny_data, "fedgwc", tmp_path / "run")
    reason = r"sends the loss of each local step \(LocalTask\.rule\), which the Flower"
    with pytest.raises(FedrcError, match=rf"^train\.algorithm: fedgwc {reason}[^\n]*$"):
        serve(grid_for(tiny_data, config), config, FAST, False, False)
    assert not (tmp_path / "run").exists()


def test_simplex_draws_are_refused_in_one_line(tiny_data: Path, tmp_path: Path) -> None:
    """Floco's clients draw a point of the solution simplex for each batch (a rule), which
    the train message does not carry."""
    config = flower_config(tiny_data, "floco", tmp_path / "run")
    reason = r"draws a point of its solution simplex for each batch \(LocalTask\.rule\)"
    with pytest.raises(FedrcError, match=rf"^train\.algorithm: floco {reason}[^\n]*$"):
        serve(grid_for(tiny_data, config), config, FAST, False, False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algorithm", ["apfl", "pfedme"])
def test_a_personal_rule_is_refused_in_one_line(
    algorithm: str, tiny_data: Path, tmp_path: Path
) -> None:
    """APFL's and pFedMe's tasks carry a local rule that trains a personal model beside the
    global one (`LocalTask.rule`), which the train message does not carry."""
    config = flower_config(tiny_data, algorithm, tmp_path / "run")
    reason = r"trains a personal model beside the global one \(LocalTask\.rule\), which the Flower"
    with pytest.raises(FedrcError, match=rf"^train\.algorithm: {algorithm} {reason}[^\n]*$"):
        serve(grid_for(tiny_data, config), config, FAST, False, False)
    assert not (tmp_path / "run").exists()


def test_a_diverged_training_is_the_loops_line_naming_its_client(
    tiny_data: Path, tmp_path: Path
) -> None:
    with pytest.raises(FedrcError) as single:
        reference(flower_config(tiny_data, "fedavg", tmp_path / "single", lr=1e6))
    config = flower_config(tiny_data, "fedavg", tmp_path / "flower", lr=1e6)
    with pytest.raises(FedrcError) as flower:
        serve(grid_for(tiny_data, config), config, FAST, resume=False, overwrite=False)
    form = r"round 1, client \d+, model 0: local loss (nan|inf) — training diverged; lower --lr .*"
    assert re.fullmatch(form, str(single.value)), single.value
    assert re.fullmatch(form, str(flower.value)), flower.value  # the client named once


def test_a_client_two_nodes_hold_goes_to_the_later_with_a_warning(
    tiny_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    nodes = grid_for(tiny_data, config).nodes
    grid = LocalGrid({**nodes, 104: nodes[101]}, run_config(config))  # 101 restarted as 104
    registry = Nodes(grid, read_manifest(tiny_data), FAST)
    registry.connect()
    assert registry.clients_of(104) == [0, 3, 6, 9, 12] and registry.clients_of(101) == []
    assert "client 0: node 104 takes over from node 101" in caplog.text


def test_the_server_says_which_node_holds_the_held_out_clients(
    tiny_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedrc")
    config = flower_config(tiny_data, "fedavg", tmp_path / "run")
    Nodes(grid_for(tiny_data, config), read_manifest(tiny_data), FAST).connect()
    line = "held-out clients (global accuracy): 12 on node 101; 13 on node 102; 14 on node 103"
    assert [r.getMessage() for r in caplog.records].count(f"fedrc: {line}") == 1


@pytest.mark.parametrize("algorithm", ["flux", "feddaa"])
def test_flower_server_refuses_flux_in_one_line(
    algorithm: str, tiny_data: Path, tmp_path: Path
) -> None:
    """FLUX asks each client for a descriptor of its data, FedDAA for its data prototype, which
    the nodes do not compute: the server refuses it before anything starts, in one line naming
    the option."""
    config = flower_config(tiny_data, algorithm, tmp_path / "flower")
    match = rf"^train\.algorithm: {algorithm} asks clients for [^\n]*$"
    with pytest.raises(FedrcError, match=match):
        serve(grid_for(tiny_data, config), config, FAST, resume=False, overwrite=False)
    assert not (tmp_path / "flower").exists()
