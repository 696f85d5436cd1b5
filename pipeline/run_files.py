"""The files of a training run and how they are written and read back.

runs/<name>/
  config.json          resolved TrainConfig + the data digest
  metrics.jsonl        one JSON line per round
  assignments.parquet  ω of every client (held-out ones marked) at every evaluated round
  checkpoint.pt        the latest resumable state (`RunState`), for --resume
  checkpoint-momentum-r<N>.npy  the persistent SGD momentum of that state, where it is kept
  model.pt             the final models and ω, for eval and plot
Checkpoints hold only tensors, numbers and strings and are read with weights_only=True.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.data.records import ClientRecord
from pipeline.errors import FedrcError
from pipeline.io import atomic_file, naming, read_parquet

CONFIG = "config.json"
METRICS = "metrics.jsonl"
ASSIGNMENTS = "assignments.parquet"
CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
MOMENTUM_SNAPSHOTS = "checkpoint-momentum-r*.npy"
CHECKPOINT_FORMAT = 2  # 2: momentum in its own file, torch's RNG state
TRAIN_FILES = (CONFIG, METRICS, ASSIGNMENTS, CHECKPOINT, MODEL)


def train_outputs(out: Path) -> list[Path]:
    """The files `fedrc train` owns in a run folder (eval's and plot's are not among them)."""
    return [out / name for name in TRAIN_FILES] + sorted(out.glob(MOMENTUM_SNAPSHOTS))


def momentum_snapshot(out: Path, round_: int) -> Path:
    return out / f"checkpoint-momentum-r{round_}.npy"


def save_state(path: Path, state: dict[str, Any]) -> None:
    # Serialise in memory first: torch.save reports a full disk as an opaque RuntimeError,
    # a plain write as OSError(ENOSPC) that names the file.
    buffer = io.BytesIO()
    torch.save({**state, "format": CHECKPOINT_FORMAT}, buffer)
    with atomic_file(path) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def load_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FedrcError(f"{path}: not found")
    try:
        with warnings.catch_warnings():  # e.g. about a foreign pickle protocol: we refuse anyway
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise FedrcError(
            f"{path}: refused: it holds objects other than tensors, numbers and strings "
            "(fedrc never runs code from a checkpoint; was it crafted or written by another tool?)"
        ) from None
    except Exception as e:  # unpickling errors come in many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedrcError(
            f"{path}: damaged or not a fedrc checkpoint ({type(e).__name__}: {first[:120]})"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("format"), int):
        raise FedrcError(f"{path}: not a fedrc checkpoint")
    if state["format"] > CHECKPOINT_FORMAT:
        raise FedrcError(
            f"{path}: written by a newer fedrc (checkpoint format {state['format']}, this fedrc "
            f"reads up to {CHECKPOINT_FORMAT}); upgrade fedrc"
        )
    return state


def state_identity(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The configuration a checkpoint or model.pt was written with (TrainConfig.identity())."""
    try:
        identity = json.loads(state["identity"])
    except (KeyError, TypeError, json.JSONDecodeError):
        raise FedrcError(f"{path}: not a fedrc checkpoint (no configuration recorded)") from None
    if not isinstance(identity, dict):
        raise FedrcError(f"{path}: not a fedrc checkpoint (no configuration recorded)")
    return identity


def identity_mismatch(recorded: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """None when equal, else what differs, e.g. "algorithm fedem there, fedrc here"."""
    if recorded == wanted:
        return None
    if recorded.get("data_digest") != wanted.get("data_digest"):
        return "another dataset (the shards' hashes differ)"
    keys = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k))
    what = "; ".join(f"{k} {recorded.get(k)!r} there, {wanted.get(k)!r} here" for k in keys[:4])
    return "another configuration (" + what + (", …" if len(keys) > 4 else "") + ")"


def checkpoint_round(out: Path) -> int | None:
    """The round `checkpoint.pt` in `out` holds, or None when there is no usable checkpoint."""
    try:
        return int(load_state(out / CHECKPOINT)["round"])
    except (FedrcError, KeyError, TypeError, ValueError):
        return None


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    line = json.dumps(row, sort_keys=True) + "\n"
    with naming(path), path.open("a") as f:
        f.write(line)  # one write: a crash can tear only this last line (see read_metrics)


def read_metrics(path: Path, torn_tail_ok: bool = False) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl; with `torn_tail_ok` (resuming) an unfinished last line,
    left by a run killed while writing it, is dropped instead of refused."""
    if not path.is_file():
        raise FedrcError(f"{path}: not found (did `fedrc train` finish?)")
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("round"), int):
                raise ValueError
            rows.append(row)
        except ValueError:  # JSONDecodeError included
            if torn_tail_ok and number == len(lines) and not text.endswith("\n"):
                break
            raise FedrcError(
                f"{path}: line {number} is not a metrics row (a crashed run? continue it with "
                "`fedrc train --resume`)"
            ) from None
    return rows


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep the lines of rounds ≤ last_round (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [r for r in read_metrics(path, torn_tail_ok=True) if r["round"] <= last_round]
    with atomic_file(path) as tmp:
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))


def write_assignments(
    path: Path,
    rounds: list[int],
    history: list[torch.Tensor],
    clients: Sequence[ClientRecord],
    steps: list[int] | None = None,
) -> None:
    """Long table: one row per (evaluated round, client) with ω as columns omega_0..omega_{K-1}.
    A drifting benchmark's table also has each round's `step`, and the concept of that step."""
    if not history:
        return
    num_clients, k = history[0].shape
    omega = torch.cat(history).numpy()
    drifting = any(c.steps for c in clients)
    at = steps if drifting and steps is not None else [0] * len(rounds)
    concepts = [c.at_step(t).concept if c.steps else c.concept for t in at for c in clients]
    columns: dict[str, Any] = {
        "round": np.repeat(np.asarray(rounds, dtype=np.int32), num_clients),
        "client_id": np.tile(np.arange(num_clients, dtype=np.int32), len(rounds)),
        "participating": np.tile([c.participating for c in clients], len(rounds)),
        "concept": np.asarray(concepts).astype(np.int8),
        "style": np.tile([c.style for c in clients], len(rounds)),
    }
    if drifting:
        columns["step"] = np.repeat(np.asarray(at, dtype=np.int16), num_clients)
    for j in range(k):
        columns[f"omega_{j}"] = omega[:, j]
    with atomic_file(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


def read_assignments(path: Path) -> pa.Table:
    return read_parquet(path, "not found (did `fedrc train` finish?)")


@dataclass
class RunState:
    """Everything `--resume` needs to continue after `round` with the same numbers.

    The persistent SGD momentum, when the run keeps it, is too large for this file: it is the
    snapshot `momentum_snapshot(out, round)` beside it, and `momentum_present` says which
    (client, row) buffers that snapshot holds. Checkpoints of format 1 held the buffers
    themselves, as {client: {row: buffer}}: `legacy_momentum`.
    """

    round: int
    models: torch.Tensor
    algorithm: dict[str, Any]
    eval_rounds: list[int]
    omega_history: list[torch.Tensor]
    cached_logits: torch.Tensor | None
    rng: torch.Tensor | None = None  # torch's CPU generator (dropout); None before format 2
    momentum_present: torch.Tensor | None = None
    legacy_momentum: dict[int, dict[int, torch.Tensor]] | None = None

    def save(self, out: Path, identity: str) -> None:
        """checkpoint.pt; then the momentum snapshots of earlier rounds are removed."""
        save_state(
            out / CHECKPOINT,
            {
                "identity": identity,
                "round": self.round,
                "models": self.models.cpu(),
                "algorithm": self.algorithm,
                "eval_rounds": self.eval_rounds,
                "omega_history": self.omega_history,
                "cached_logits": None if self.cached_logits is None else self.cached_logits.cpu(),
                "rng": self.rng,
                "momentum_present": self.momentum_present,
            },
        )
        keep = momentum_snapshot(out, self.round)
        for old in out.glob(MOMENTUM_SNAPSHOTS):
            if old != keep:
                old.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> RunState:
        state = load_state(path)
        try:
            legacy = state["momentum"] if state["format"] == 1 else None
            return cls(
                round=int(state["round"]),
                models=state["models"],
                algorithm=state["algorithm"],
                eval_rounds=list(state["eval_rounds"]),
                omega_history=list(state["omega_history"]),
                cached_logits=state["cached_logits"],
                rng=state.get("rng"),
                momentum_present=state.get("momentum_present"),
                legacy_momentum=legacy or None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FedrcError(f"{path}: not a fedrc checkpoint (lacks {e})") from None


def save_model(
    out: Path,
    identity: str,
    rounds: int,
    algorithm_name: str,
    models: torch.Tensor,
    omega: torch.Tensor,
    algorithm_state: dict[str, Any],
) -> None:
    """The final models, ω and algorithm state: what eval and plot read."""
    save_state(
        out / MODEL,
        {
            "identity": identity,
            "round": rounds,
            "algorithm_name": algorithm_name,
            "models": models.cpu(),
            "omega": omega,
            "algorithm": algorithm_state,
        },
    )
