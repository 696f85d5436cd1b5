"""The streaming round loop: results folded as they come, per-client vectors on disk, the
persistent momentum in a file, and the resumable state (`RunState`), old format included."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.common.errors import FedrcError
from pipeline.config import TrainConfig
from pipeline.data.shards import load_federated
from pipeline.engine.rows import BLOCK, RowStore
from pipeline.places.communicate import Communicator
from pipeline.run import checkpoints, training
from pipeline.run import files as rf
from pipeline.run import momentum as momentum_module
from pipeline.run.resolve import make_config
from pipeline.stages import train_stage

CPU = torch.device("cpu")


def tiny_config(data: Path, out: Path, **extra) -> TrainConfig:
    values = dict(rounds=3, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
    return make_config(data=str(data), out=str(out), **{**values, **extra})


def test_each_result_is_folded_before_the_next_client_is_built(tiny_data: Path) -> None:
    """A round never holds more than one client's trained models (sequential executor)."""
    config = tiny_config(tiny_data, Path("unused"), algorithm="fedem")
    run = training.build_run(config, load_federated(tiny_data), Communicator(CPU))
    events = []
    tasks, fold = run.algorithm.local_tasks, run.algorithm.fold

    def logged_tasks(client, *args):
        events.append(("tasks", client))
        return tasks(client, *args)

    def logged_fold(client, task, result):
        events.append(("fold", client))
        fold(client, task, result)

    run.algorithm.local_tasks, run.algorithm.fold = logged_tasks, logged_fold
    training.train_round(1, run, None)
    clients = [c for kind, c in events if kind == "tasks"]
    assert clients == run.data.participating
    expected = [e for c in clients for e in [("tasks", c), ("fold", c), ("fold", c)]]
    assert events == expected  # K = 2 results of a client folded before the next one's tasks


def test_a_client_part_folds_each_result_before_the_next_client_runs(tiny_data: Path) -> None:
    """The same streaming with a client part: a client's E-step and tasks (`ClientStep`) are
    built only after the previous client's results are folded, and every upload is received
    after local training, in client order."""
    config = tiny_config(tiny_data, Path("unused"), algorithm="fedem")
    run = training.build_run(config, load_federated(tiny_data), Communicator(CPU))
    assert run.algorithm.client_part
    events = []
    client_step, fold, receive = (
        run.algorithm.client_step, run.algorithm.fold, run.algorithm.receive
    )  # fmt: skip

    def logged_step(client):
        step = client_step(client)
        tasks = step.local_tasks

        def logged_tasks(*args):
            events.append(("tasks", client))
            return tasks(*args)

        step.local_tasks = logged_tasks
        return step

    def logged_fold(client, task, result):
        events.append(("fold", client))
        fold(client, task, result)

    def logged_receive(client, upload):
        events.append(("receive", client))
        receive(client, upload)

    run.algorithm.client_step = logged_step
    run.algorithm.fold, run.algorithm.receive = logged_fold, logged_receive
    training.train_round(1, run, None)
    clients = [c for kind, c in events if kind == "tasks"]
    assert clients == run.data.participating
    trained = [e for c in clients for e in [("tasks", c), ("fold", c), ("fold", c)]]
    assert events == trained + [("receive", c) for c in clients]


def test_skip_below_trains_only_pairs_with_enough_omega(tiny_data: Path) -> None:
    """δ = 0.3 with K = 2: client 0 gets ω = (0.9, 0.1), client 1 ω = (0.5, 0.5). Client 0's
    model 1 is not trained but folded in as received (weight N_0 kept); the others train."""
    config = tiny_config(tiny_data, Path("unused"), algorithm="fedem", skip_below=0.3)
    run = training.build_run(config, load_federated(tiny_data), Communicator(CPU))
    clients = run.data.participating[:2]
    sizes = [run.data.clients[c].train_size for c in clients]
    gammas = {
        clients[0]: torch.tensor([[0.9, 0.1]]).expand(sizes[0], 2),
        clients[1]: torch.full((sizes[1], 2), 0.5),
    }
    raw = {c: torch.zeros(2, n, 10) for c, n in zip(clients, sizes)}
    run.algorithm.begin_round(run.models)
    jobs = list(training.local_jobs(run, 1, clients, gammas, raw))
    assert [(job[0].client, job[0].model) for job in jobs] == [
        (clients[0], 0), (clients[1], 0), (clients[1], 1),
    ]  # fmt: skip
    sums, totals = run.algorithm.contributions()
    torch.testing.assert_close(sums[1], sizes[0] * run.models[1].double())  # folded unchanged
    assert totals.tolist() == [0.0, float(sizes[0])]


def test_row_store_keeps_rows_on_disk_and_returns_them_by_key() -> None:
    store = RowStore(3)
    rows = {key: torch.arange(3.0) + 10 * key for key in (5, 1, 7)}
    for key, row in rows.items():
        store.add(key, row)
    store.add(1, torch.tensor([9.0, 9.0, 9.0]))  # replaced
    assert len(store) == 3 and store.stored_keys() == [1, 5, 7]
    torch.testing.assert_close(store.get(7), rows[7])
    torch.testing.assert_close(store.get(1), torch.tensor([9.0, 9.0, 9.0]))
    many = RowStore(2)
    for key in range(BLOCK + 3):
        many.add(key, torch.full((2,), float(key)))
    blocks = list(many.blocks())
    assert [len(keys) for keys, _ in blocks] == [BLOCK, 3]
    assert blocks[1][1][:, 0].tolist() == [BLOCK, BLOCK + 1, BLOCK + 2]
    with pytest.raises(ValueError, match="shape"):
        many.add(0, torch.zeros(3))
    many.close()


def test_a_row_store_in_memory_reads_as_one_on_disk() -> None:
    """The same rows, by key, in blocks and handed over one by one (`items`: the memory store
    lets go of them)."""
    stores = [RowStore(2), RowStore(2, CPU)]
    for store in stores:
        for key in (BLOCK + 2, *range(BLOCK + 1)):
            store.add(key, torch.full((2,), float(key)))
        store.add(3, torch.tensor([7.0, 8.0]))
    disk, memory = stores
    assert memory.stored_keys() == disk.stored_keys() and len(memory) == len(disk)
    torch.testing.assert_close(memory.get(3), disk.get(3), rtol=0, atol=0)
    for (keys, rows), (same, also) in zip(memory.blocks(), disk.blocks(), strict=True):
        assert keys == same and torch.equal(rows, also)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(memory.items(), disk.items(), strict=True))
    assert len(memory) == 0  # handed over
    with pytest.raises(ValueError, match="shape"):
        memory.add(0, torch.zeros(3))
    for store in stores:
        store.close()


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("fedsoft", {}),  # every client's personal model
        ("cfl", {"cfl_eps1": 10.0, "cfl_eps2": 0.01}),  # the updates, split by their cosines
        ("fesem-cam", {"warmup_rounds": 1}),  # K-means over the clients' models
        ("stocfl", {}),  # each new client's ψ
        ("cfl-gp", {}),  # the profiles
        ("fedccfa", {}),  # classifiers and prototypes
    ],
)
def test_a_round_s_rows_in_memory_train_as_on_disk(
    algorithm: str, extra: dict, tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round keeps its per-client rows in memory where they fit (`client_rows`; FedSoft's
    on the training device): the same models and state, to the bit, as through the file."""
    import pipeline.algorithms.fedsoft as fedsoft
    import pipeline.engine.rows as rows_module

    states = []
    for where in (None, CPU):
        for module in (rows_module, fedsoft):
            monkeypatch.setattr(module, "room_for", lambda nbytes, device, where=where: where)
        out = tmp_path / str(where)
        run = train_stage(tiny_config(tiny_data, out, algorithm=algorithm, **extra))
        states.append(rf.load_state(run / rf.MODEL))
    disk, memory = states
    assert torch.equal(memory["models"], disk["models"])
    assert torch.equal(memory["omega"], disk["omega"])
    personal = disk["algorithm"].get("personal", {})
    assert all(torch.equal(memory["algorithm"]["personal"][c], personal[c]) for c in personal)


def test_cfl_keeps_no_update_once_no_split_is_possible() -> None:
    config = make_config(algorithm="cfl", clusters=2, cfl_eps1=10.0, cfl_eps2=0.01)
    algo = build_algorithm(config, 4, 3)
    models = torch.zeros(2, 2)
    algo.begin_round(models)
    assert algo.shared_rows() is not None  # one cluster of a possible two: updates kept
    algo.clusters = 2
    algo.begin_round(models)
    assert algo.shared_rows() is None


def test_persistent_momentum_that_does_not_fit_on_disk_is_refused(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = SimpleNamespace(total=1000, used=0, free=1000)
    monkeypatch.setattr(momentum_module.shutil, "disk_usage", lambda path: small)
    config = tiny_config(tiny_data, tmp_path / "run", persistent_momentum=True)
    with pytest.raises(FedrcError) as info:
        train_stage(config)
    message = str(info.value)
    assert "\n" not in message and "persistent_momentum" in message
    assert "GB of momentum buffers" in message and "0.0 GB free" in message
    assert not (tmp_path / "run").exists()  # nothing written, not even the folder


def test_checkpoint_interval_grows_with_the_state(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(tiny_data, tmp_path, persistent_momentum=True)
    run = training.build_run(config, load_federated(tiny_data), Communicator(CPU), tmp_path)
    try:
        assert checkpoints.checkpoint_interval(config, run) == 1  # a small state: every round
        momentum_bytes = len(run.data.participating) * run.momentum.rows * run.momentum.size * 4
        monkeypatch.setattr(checkpoints, "CHECKPOINT_BUDGET", momentum_bytes // 4)
        assert checkpoints.checkpoint_interval(config, run) >= 4
        assert checkpoints.checkpoint_interval(replace(config, checkpoint_every=2), run) == 2
    finally:
        run.momentum.close()


def write_format_1(out: Path) -> None:
    """Rewrite `out`'s checkpoint as fedrc's first format wrote it: momentum as a dict of
    buffers inside checkpoint.pt, no RNG state, no snapshot file."""
    state = rf.load_state(out / rf.CHECKPOINT)
    snapshot = rf.momentum_snapshot(out, state["round"])
    buffers = np.load(snapshot)
    present = state.pop("momentum_present")
    momentum: dict[int, dict[int, torch.Tensor]] = {}
    for slot, row in present.nonzero().tolist():
        momentum.setdefault(slot, {})[row] = torch.from_numpy(buffers[slot, row].copy())
    state.pop("rng")
    snapshot.unlink()
    state.pop("format")
    state.pop("checksum")  # sealed files came later
    torch.save({**state, "momentum": momentum, "format": 1}, out / rf.CHECKPOINT)


def test_a_checkpoint_of_the_first_format_still_resumes(tiny_data: Path, tmp_path: Path) -> None:
    extra = dict(algorithm="fedrc", persistent_momentum=True, estep="adam", participation=0.5)
    full = train_stage(tiny_config(tiny_data, tmp_path / "full", **extra))
    half = tmp_path / "half"
    train_stage(tiny_config(tiny_data, half, **{**extra, "rounds": 2}))
    write_format_1(half)
    train_stage(tiny_config(tiny_data, half, **extra), resume=True)
    ours, theirs = rf.load_state(half / rf.MODEL), rf.load_state(full / rf.MODEL)
    assert torch.equal(ours["models"], theirs["models"])
    assert rf.load_state(half / rf.CHECKPOINT)["format"] == rf.CHECKPOINT_FORMAT
    assert rf.momentum_snapshot(half, 3).is_file()
    assert not list(half.glob(".momentum-*"))  # the live buffers are gone with the run


def test_resume_without_the_momentum_snapshot_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_data, tmp_path / "run", persistent_momentum=True, rounds=1)
    run = train_stage(config)
    rf.momentum_snapshot(run, 1).unlink()
    with pytest.raises(FedrcError, match=r"checkpoint-momentum-r1\.npy not found") as info:
        train_stage(replace(config, rounds=2), resume=True)
    assert "\n" not in str(info.value) and "--overwrite" in str(info.value)


def test_momentum_kept_in_memory_trains_as_the_live_file_does(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffers as a tensor in memory (on a GPU, where they fit) are the live file's numbers,
    through a checkpoint and a resume; no live file is written."""
    extra = dict(algorithm="fedrc", persistent_momentum=True, estep="adam", participation=0.5)
    on_disk = train_stage(tiny_config(tiny_data, tmp_path / "disk", **extra))
    monkeypatch.setattr(momentum_module, "memory_for", lambda device, nbytes: CPU)
    held = []
    monkeypatch.setattr(momentum_module.MomentumStore, "close", lambda self: held.append(self))
    half = tmp_path / "memory"
    train_stage(tiny_config(tiny_data, half, **{**extra, "rounds": 2}))
    train_stage(tiny_config(tiny_data, half, **extra), resume=True)
    assert len(held) == 2 and all(s.in_memory and s.path is None for s in held)
    assert not list(half.glob(".momentum-*"))
    ours, theirs = rf.load_state(half / rf.MODEL), rf.load_state(on_disk / rf.MODEL)
    assert torch.equal(ours["models"], theirs["models"])


def test_momentum_stays_on_the_disk_off_a_gpu() -> None:
    assert momentum_module.memory_for(CPU, 1) is None


def test_checkpoint_every_0_writes_none_and_the_same_model(tiny_data: Path, tmp_path: Path) -> None:
    """`checkpoint_every: 0` (the GPU check, for runs that fit in a command): no checkpoint.pt
    or momentum snapshot, not even at the end, and the numbers of a checkpointed run; extending
    such a run is one line."""
    extra = dict(algorithm="fedrc", persistent_momentum=True, rounds=2)
    never = train_stage(tiny_config(tiny_data, tmp_path / "never", checkpoint_every=0, **extra))
    every = train_stage(tiny_config(tiny_data, tmp_path / "every", checkpoint_every=1, **extra))
    assert not (never / rf.CHECKPOINT).exists() and not list(never.glob("checkpoint-momentum-*"))
    assert (every / rf.CHECKPOINT).is_file()
    assert torch.equal(
        rf.load_state(never / rf.MODEL)["models"], rf.load_state(every / rf.MODEL)["models"]
    )
    with pytest.raises(FedrcError) as info:
        train_stage(
            tiny_config(tiny_data, never, checkpoint_every=0, **{**extra, "rounds": 3}), resume=True
        )
    assert "\n" not in str(info.value)
