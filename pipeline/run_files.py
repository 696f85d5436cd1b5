"""The files of a training run and how they are written and read back.

runs/<name>/
  config.json          resolved TrainConfig + the data digest
  metrics.jsonl        one JSON line per round
  assignments.parquet  ω of every client (held-out ones marked) at every evaluated round
  checkpoint.pt        the latest state, for --resume
  model.pt             the final models and ω, for eval and plot
Checkpoints hold only tensors, numbers and strings and are read with weights_only=True.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.errors import FedrcError
from pipeline.io import atomic_file, read_parquet

CONFIG = "config.json"
METRICS = "metrics.jsonl"
ASSIGNMENTS = "assignments.parquet"
CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
CHECKPOINT_FORMAT = 1
TRAIN_FILES = (CONFIG, METRICS, ASSIGNMENTS, CHECKPOINT, MODEL)


def save_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_file(path) as tmp:
        torch.save({**state, "format": CHECKPOINT_FORMAT}, tmp)


def load_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FedrcError(f"{path}: not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedrcError(f"{path}: not a readable fedrc checkpoint ({first[:200]})") from None
    if not isinstance(state, dict) or "format" not in state:
        raise FedrcError(f"{path}: not a fedrc checkpoint")
    if state["format"] > CHECKPOINT_FORMAT:
        raise FedrcError(f"{path}: written by a newer fedrc (format {state['format']})")
    return state


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FedrcError(f"{path}: not found (did `fedrc train` finish?)")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise FedrcError(f"{path}: line {number} is not JSON") from None
    return rows


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep the lines of rounds ≤ last_round (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r["round"] <= last_round]
    with atomic_file(path) as tmp:
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))


def write_assignments(
    path: Path, rounds: list[int], history: list[torch.Tensor], clients: list[dict[str, Any]]
) -> None:
    """Long table: one row per (evaluated round, client) with ω as columns omega_0..omega_{K-1}."""
    if not history:
        return
    num_clients, k = history[0].shape
    omega = torch.cat(history).numpy()
    columns: dict[str, Any] = {
        "round": np.repeat(np.asarray(rounds, dtype=np.int32), num_clients),
        "client_id": np.tile(np.arange(num_clients, dtype=np.int32), len(rounds)),
        "participating": np.tile([c["participating"] for c in clients], len(rounds)),
        "concept": np.tile([c["concept"] for c in clients], len(rounds)).astype(np.int8),
        "style": np.tile([c["style"] for c in clients], len(rounds)),
    }
    for j in range(k):
        columns[f"omega_{j}"] = omega[:, j]
    with atomic_file(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


def read_assignments(path: Path) -> pa.Table:
    return read_parquet(path, "not found (did `fedrc train` finish?)")
