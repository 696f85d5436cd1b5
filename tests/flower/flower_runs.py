"""Shared by the Flower tests: one configuration, the reference run, and the comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import assert_metrics_close, torch_threads

from pipeline.config import TrainConfig, config_dict
from pipeline.run.files import METRICS, MODEL, read_metrics
from pipeline.run.resolve import make_config
from pipeline.run.training import run_training

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(
    rounds=3, local_epochs=2, batch_size=16, lr=0.05, clusters=2, participation=0.5,
    eval_every=1, device="cpu",
)  # fmt: skip
SETTINGS = {
    "fedrc": {"estep": "adam", "prune_threshold": 0.05},
    "fedsoft": {"mu": 0.01},
    # past the warm-up after round 1, so that the clusters form (the default 30 rounds: never)
    "fesem-cam": {"warmup_rounds": 1},
    "ifca-cam": {"warmup_rounds": 1},
}


def flower_config(data: Path, algorithm: str, out: Path, **values) -> TrainConfig:
    sets = SETTINGS.get(algorithm, {})
    values = {**BASE, **sets, **values}
    return make_config(data=str(data), algorithm=algorithm, out=str(out), **values)


def node_configs(data: Path, nodes: int = 3, clients: int = 15) -> list[dict[str, str]]:
    """Client i on node i mod `nodes` (participating and held-out alike)."""
    return [
        {"fedrc-data": str(data), "fedrc-clients": ",".join(map(str, range(n, clients, nodes)))}
        for n in range(nodes)
    ]


def run_config(config: TrainConfig) -> dict:
    return {"fedrc-train": json.dumps(config_dict(config))}


def reference(config: TrainConfig) -> Path:
    """`fedrc train` in this process, on one thread like each node."""
    with torch_threads(1):
        return run_training(config)


def assert_same_run(expected: Path, got: Path) -> None:
    """As tests/test_distributed.py: losses and parameters to 1e-5, an accuracy may differ
    by one prediction on a tie."""
    rows = [read_metrics(run / METRICS) for run in (expected, got)]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
        for key in ("flower_bytes_sent", "flower_bytes_received"):  # measured on Flower only
            row.pop(key, None)
    assert_metrics_close(*rows, loss_tolerance=1e-5)
    models = [torch.load(run / MODEL, weights_only=True) for run in (expected, got)]
    torch.testing.assert_close(models[1]["models"], models[0]["models"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(models[1]["omega"], models[0]["omega"], atol=1e-5, rtol=1e-5)


def fedrc(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "fedrc_cli", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def write_app(app: Path, data: Path, out: Path, algorithm: str, *extra: str) -> None:
    """`fedrc flower app` with BASE and the algorithm's SETTINGS; `extra` options last."""
    options = [f"--{k.replace('_', '-')}={v}" for k, v in BASE.items()]
    sets = [part for k, v in SETTINGS.get(algorithm, {}).items() for part in ("--set", f"{k}={v}")]
    fedrc(
        *("flower", "app", "--app", str(app), "--data", str(data), "--out", str(out)),
        *("--algorithm", algorithm, *options, *sets, *extra),
    )
