"""A 2-process torchrun (gloo, CPU) computes the single-process run's numbers.

Each case trains the tiny synthetic benchmark once in this process and once with
`torchrun --nproc-per-node 2 -m fedrc_cli train`, and compares metrics.jsonl (all but
`seconds`) and model.pt. Every algorithm's contributions are all-reduced; CFL (splitting) also
shares its members' updates (`Algorithm.shared_rows`) with every rank, one row at a time. A
distributed run stopped after round 2 and resumed with torchrun (FedRC with persistent momentum,
gathered into the checkpoint's snapshot) ends where the uninterrupted single-process run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_metrics_close

from pipeline.data.shards import load_federated
from pipeline.places import distributed
from pipeline.places.communicate import owners
from pipeline.run.files import METRICS, MODEL, read_metrics
from pipeline.run.resolve import train_config
from pipeline.run.training import run_training

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(
    rounds=3, local_epochs=2, batch_size=16, lr=0.05, clusters=2, participation=0.5,
    eval_every=1, device="cpu",
)  # fmt: skip
CASES = {
    "fedavg": {},
    "cfl": {"cfl": {"cfl_eps1": 10.0, "cfl_eps2": 0.01}},  # splits in round 1
    "stocfl": {"stocfl": {"tau": 0.1}},  # ψ rows shared; merges in round 1
    "pacfl": {},  # signatures computed on the rank holding the client, newcomers in rounds 2–3
    "cfl-gp": {},  # clusters in rounds 1 and 3; round 3 adds the criterion model's trainings
    "feddrift": {"clusters": 4, "feddrift": {"init": "per-client"}},  # drift: test_feddrift
    "flux": {"flux": {"cluster_round": 2}},  # statistics gathered from both ranks
    "fedccfa": {"fedccfa": {"align_after": 1}},  # classifier rows + prototypes shared rows
    # personal models (and APFL's α_i) kept on every rank through shared rows
    "apfl": {"apfl": {"adaptive": True}},
    "pfedme": {"pfedme": {"personal_lr": 0.02}},
    "fedgwc": {"fedgwc": {"eps": 10.0}},  # step losses summed over ranks; a split in round 2
    "feddaa": {"feddaa": {"cluster_round": 2}},  # every client's prototype, from both ranks
    "floco": {"floco": {"endpoints": 3, "tau": 2}},  # every rank's pseudo-gradients projected
    # issue 43's optimizers: the rate each place computes, the server's moments, early stops
    "adaptive-fedavg": {},  # the round's lr from the server state, the same on both ranks
    "flash": {"local_epochs": 4, "flash": {"gamma": 0.05}},  # clients stop early on their rank
    "ifca": {  # FedYogi per cluster, local AdamW, a step schedule
        "server_opt": "yogi",
        "server_lr": 0.01,
        "optimizer": "adamw",
        "lr": 0.01,
        "weight_decay": 0.01,
        "lr_schedule": "step",
        "lr_step_rounds": 1,
        "lr_gamma": 0.5,
    },
}  # FedRC: test_resume_distributed_run


def torchrun(
    tmp: Path, data: Path, out: Path, values: dict, *flags: str
) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node 2 -m fedrc_cli train` with `values` from a params file."""
    params = tmp / f"params-{out.name}.json"  # JSON is YAML
    params.write_text(json.dumps({"train": values}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"),
        *("-m", "fedrc_cli", "train", "--params", str(params)),
        *("--data", str(data), "--out", str(out), *flags),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def single(data: Path, out: Path, values: dict) -> Path:
    """The same configuration as the params file gives `fedrc train` (profiles included), on
    one thread like each torchrun worker: a multi-threaded convolution sums in another order,
    and CFL's split amplifies that past 1e-5 within three rounds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_training(train_config({"train": values}, {"data": str(data), "out": str(out)}))
    finally:
        torch.set_num_threads(threads)


def assert_same_run(expected: Path, got: Path, exact: bool) -> None:
    """Losses and parameters to 1e-5; an accuracy may differ by one prediction on a tie."""
    rows = [read_metrics(run / METRICS) for run in (expected, got)]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
    if exact:
        assert rows[0] == rows[1]
    assert_metrics_close(*rows, loss_tolerance=1e-5)
    models = [torch.load(run / MODEL, weights_only=True) for run in (expected, got)]
    torch.testing.assert_close(models[1]["models"], models[0]["models"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(models[1]["omega"], models[0]["omega"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_two_processes_equal_one(algorithm: str, tiny_data: Path, tmp_path: Path) -> None:
    values = {**BASE, "algorithm": algorithm, **CASES[algorithm]}
    expected = single(tiny_data, tmp_path / "single", values)
    done = torchrun(tmp_path, tiny_data, tmp_path / "two", values)
    # exact up to the order of float sums; on this CPU the numbers come out bit for bit
    assert_same_run(expected, tmp_path / "two", exact=False)
    assert done.stdout.count("round 3/3") == 1  # rank 0 alone prints
    if algorithm == "cfl":
        assert read_metrics(expected / METRICS)[-1]["active_models"] == 2  # it did split


def test_resume_distributed_run(tiny_data: Path, tmp_path: Path) -> None:
    """FedRC (Adam E-step, adaptive K) with the authors' settings (persistent momentum, kept by
    each client's rank and gathered into the checkpoint): 2 rounds, resume to 3, both with
    torchrun, equal the single-process 3 rounds."""
    values = {
        **BASE, "algorithm": "fedrc", "profile": "reference",
        "fedrc": {"estep": "adam", "prune_threshold": 0.05},
    }  # fmt: skip
    expected = single(tiny_data, tmp_path / "single", values)
    half = tmp_path / "half"
    torchrun(tmp_path, tiny_data, half, {**values, "rounds": 2})
    torchrun(tmp_path, tiny_data, half, values, "--resume")
    assert_same_run(expected, half, exact=False)
    # the checkpoint holds every client's momentum, as a single-process one does
    state = torch.load(half / "checkpoint.pt", weights_only=True)
    reference = torch.load(expected / "checkpoint.pt", weights_only=True)
    assert torch.equal(state["momentum_present"], reference["momentum_present"])
    assert bool(state["momentum_present"].any())
    buffers = [np.load(run / "checkpoint-momentum-r3.npy") for run in (half, expected)]
    np.testing.assert_allclose(buffers[0], buffers[1], atol=1e-5, rtol=1e-5)
    assert not list(half.glob(".momentum-*")) and not list(half.glob("checkpoint-momentum-r2*"))


def test_refused_run_ends_every_rank(tiny_data: Path, tmp_path: Path) -> None:
    """--out already holds a run: rank 0's one-line error ends both ranks (no hang)."""
    values = {**BASE, "algorithm": "fedavg", "rounds": 1}
    single(tiny_data, tmp_path / "taken", values)
    with pytest.raises(AssertionError, match="already holds a run"):
        torchrun(tmp_path, tiny_data, tmp_path / "taken", values)


def test_each_rank_loads_its_own_clients(tiny_data: Path) -> None:
    whole = load_federated(tiny_data)
    owner = owners(whole.participating, whole.held_out, 2)
    assert sorted(owner) == list(range(len(whole.clients)))
    shares = [{c for c, r in owner.items() if r == rank} for rank in (0, 1)]
    assert shares[0].isdisjoint(shares[1])
    part = load_federated(tiny_data, shares[1])
    assert part.loaded == sorted(shares[1])
    assert part.images.shape[0] == sum(
        whole.test_slices[c].stop - whole.train_slices[c].start for c in shares[1]
    )
    for client in shares[1]:
        rows, full = part.train_slices[client], whole.train_slices[client]
        assert torch.equal(part.images[rows], whole.images[full])
    for client in shares[0]:
        assert part.train_slices[client].stop == part.train_slices[client].start


def test_without_torchrun_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.launched()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not distributed.launched()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.launched()
