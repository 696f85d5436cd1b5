"""assignments.parquet: every client's ω at every evaluated round, written by `fedrc train`
and read by eval (a drifting run), plot and report; and what makes a table of ω sense.

One row per (evaluated round, client), in that order: `round`, `client_id`, `participating`,
`concept`, `style` (`step` on a drifting benchmark), then ω as `omega_0`..`omega_{K-1}`. The
file names the run that wrote it (`run_id` of its identity, in the Parquet metadata), so a run
folder holding another run's file (even of another benchmark) is refused, and so is a table
whose rounds, clients or ω do not fit the run: ω is a mixture per client, each weight in
[0, 1], each row summing to 1 (`Algorithm.predict_weights`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.common.errors import FedrcError, first_few
from pipeline.common.io import read_parquet
from pipeline.data.records import ClientRecord

COLUMNS = ("round", "client_id", "participating", "concept", "style")
RUN_KEY = b"fedrc.run"  # the Parquet metadata key of the writer's `run_id`
OMEGA_SUM = 1e-3  # ω rows sum to 1 up to float32 rounding (1e-7 measured); an edit shows


def run_id(identity: str) -> str:
    """A short name for a run's identity (its configuration and its benchmark's hash, as
    JSON): what the files a run derives record, so that it recognises its own."""
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def write_assignments(
    path: Path,
    rounds: list[int],
    history: list[torch.Tensor],
    clients: Sequence[ClientRecord],
    steps: list[int] | None,
    identity: str,
) -> None:
    """The long table of the module's docstring, into `path` (the caller makes it atomic). A
    drifting benchmark's table has each round's `step`, and the concept of that step."""
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
    table = pa.table(columns).replace_schema_metadata({RUN_KEY: run_id(identity).encode()})
    pq.write_table(table, path)


def read_assignments(
    path: Path,
    identity: str | None = None,
    clients: int | None = None,
    rounds: Sequence[int] | None = None,
    models: int | None = None,
) -> pa.Table:
    """The table, checked (`assignments_problem`) against the run's `identity`, its number of
    `clients`, its evaluated `rounds` and its K `models` where given; a FedrcError naming the
    file if not."""
    table = read_parquet(path, "not found (did `fedrc train` finish?)")
    problem = assignments_problem(table, identity, clients, rounds, models)
    if problem is not None:
        raise FedrcError(f"{path}: {problem}")
    return table


def assignments_problem(
    table: pa.Table,
    identity: str | None,
    clients: int | None,
    rounds: Sequence[int] | None,
    models: int | None = None,
) -> str | None:
    """What is wrong with an assignments table, or None: its columns (an ω per model),
    which run wrote it, one block of the clients 0..N-1 per evaluated round (rounds
    increasing), and ω."""
    names = table.column_names
    k = sum(name.startswith("omega_") for name in names)
    expected = [*COLUMNS, *(["step"] if "step" in names else []), *(f"omega_{j}" for j in range(k))]
    if names != expected or k == 0:
        return f"columns {first_few(names, 8)}, expected {', '.join(COLUMNS)}[, step], omega_0.."
    if models is not None and k != models:
        return f"ω for {k} models (omega_0..omega_{k - 1}), the run has K = {models}"
    recorded = (table.schema.metadata or {}).get(RUN_KEY)  # files before it: not named
    if identity is not None and recorded is not None and recorded.decode() != run_id(identity):
        return "written by another run (its run id differs from config.json's); train it again"
    try:
        round_of = table.column("round").to_numpy().astype(np.int64)
        client_of = table.column("client_id").to_numpy().astype(np.int64)
        omega = np.stack([table.column(f"omega_{j}").to_numpy() for j in range(k)], 1)
    except (pa.ArrowException, TypeError, ValueError) as e:
        return f"a column of the wrong type or with nulls ({str(e).splitlines()[0][:80]})"
    problem = _blocks(round_of, client_of, clients, rounds)
    if problem is None and (problem := omega_problem(omega.astype(np.float64))) is not None:
        problem = f"ω: {problem}"
    return problem


def _blocks(
    round_of: np.ndarray,
    client_of: np.ndarray,
    clients: int | None,
    rounds: Sequence[int] | None,
) -> str | None:
    """One block of rows per round, rounds increasing, each block the clients 0..N-1."""
    starts = np.flatnonzero(np.r_[True, round_of[1:] != round_of[:-1]]) if len(round_of) else []
    seen = [int(round_of[s]) for s in starts]
    if seen != sorted(set(seen)):
        return f"rounds {first_few([str(r) for r in seen], 6)} not in increasing blocks"
    if rounds is not None and seen != list(rounds):
        evaluated = first_few([str(r) for r in rounds], 6)
        return f"ω for rounds {first_few([str(r) for r in seen], 6)}, the run evaluated {evaluated}"
    n = clients if clients is not None else (len(round_of) // max(len(seen), 1))
    if len(round_of) != n * len(seen) or not (client_of == np.tile(np.arange(n), len(seen))).all():
        return f"not one row per client 0..{n - 1} at each round (truncated or edited?)"
    return None


def omega_problem(omega: np.ndarray) -> str | None:
    """What makes a (clients × K) table not a set of mixtures (each row in [0, 1], summing
    to 1: `Algorithm.predict_weights`), or None."""
    if omega.ndim != 2 or omega.shape[1] < 1:
        return f"expected a table of clients × K, got shape {omega.shape}"
    if not np.isfinite(omega).all():
        return "holds NaN or infinite values"
    low, high = float(omega.min(initial=0.0)), float(omega.max(initial=0.0))
    if low < -1e-6 or high > 1 + 1e-6:
        return f"a weight outside [0, 1] ({low if low < 0 else high:.4g}): not a mixture"
    sums = omega.sum(axis=1)
    worst = int(np.abs(sums - 1).argmax()) if len(sums) else 0
    if len(sums) and abs(sums[worst] - 1) > OMEGA_SUM:
        return f"row {worst} sums to {sums[worst]:.4g}, not 1: not a mixture"
    return None
