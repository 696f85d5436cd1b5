"""A drifting run scored step by step, from what `fedrc train` logged (docs/drift.md).

The protocol, after FedDrift (Jothimurugesan et al., AISTATS 2023), with recovery added:
- *accuracy at a step*: the local accuracy at the step's last round, on that step's test data;
- *next-step accuracy*: the models and ω at the end of step t on step t + 1's test data, before
  any round has trained on it ("train on t, test on t + 1"); its mean over steps is FedDrift's
  headline number;
- *after drift*: the next-step accuracy of the clients that drift at t + 1, beside their
  accuracy on step t's data (*before drift*);
- *rounds to recover*: rounds into step t + 1 until those clients' accuracy is back within
  RECOVERY_MARGIN of before (0: it never dropped that far; None: not within the step);
- *concept purity* per step (`concept_purity`, the matched share), and the ARI and NMI of the
  clients' clusters against their concepts (`pipeline.evaluation.agreement`), from ω at the
  step's last round; a step where every client holds one concept scores a single cluster 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.records import Manifest
from pipeline.data.time_steps import step_rounds
from pipeline.evaluation.accuracy import concept_purity
from pipeline.evaluation.agreement import cluster_agreement

RECOVERY_MARGIN = 0.01  # accuracy, not points: within 1 point of the pre-drift accuracy


def omega_at(assignments: pa.Table, round_: int) -> tuple[np.ndarray, np.ndarray] | None:
    """ω (clients, K) and each client's concept at an evaluated round, clients in id order."""
    rows = assignments.filter(pc.equal(assignments.column("round"), round_))
    if rows.num_rows == 0:
        return None
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    order = np.argsort(rows.column("client_id").to_numpy())
    omega = np.stack([rows.column(f"omega_{j}").to_numpy() for j in range(k)], 1)[order]
    return omega, rows.column("concept").to_numpy()[order]


def recovery(rows: list[dict[str, Any]], first: int, before: float, after: float, key: str):
    """Rounds from the start of the step until `key` is back within the margin of `before`."""
    if after >= before - RECOVERY_MARGIN:
        return 0
    for row in rows:
        if key in row and row[key] >= before - RECOVERY_MARGIN:
            return row["round"] - first + 1
    return None


def _mean(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def over_time(
    metrics: list[dict[str, Any]],
    assignments: pa.Table,
    manifest: Manifest,
    rounds_per_step: int,
    rounds: int,
    prefix: str = "",
) -> dict[str, Any]:
    """The per-step table and its averages (`prefix` "hard_" scores the hard predictions)."""
    steps_count = manifest.time_steps
    by_round = {r["round"]: r for r in metrics}
    schedule = np.asarray(manifest.schedule)
    steps = []
    for t in range(steps_count):
        first, last = step_rounds(t, rounds_per_step, rounds, steps_count)
        if first > rounds:  # a run stopped before this step (to be resumed)
            break
        end = by_round.get(last, {})
        entry: dict[str, Any] = {
            "step": t,
            "rounds": [first, last],
            "local_accuracy": end.get(prefix + "local_accuracy"),
            "global_accuracy": end.get(prefix + "global_accuracy"),
            "next_accuracy": end.get(f"next_{prefix}local_accuracy"),
            **clustering_at(assignments, last, manifest.at_step(t)),
            "drifted_clients": int((schedule[t] != schedule[t - 1]).sum()) if t else 0,
        }
        if entry["drifted_clients"]:
            before_last = step_rounds(t - 1, rounds_per_step, rounds, steps_count)[1]
            entry |= drift_recovery(by_round, before_last, (first, last), prefix)
        steps.append(entry)
    return {"time_steps": steps_count, "rounds_per_step": rounds_per_step, **averages(steps)}


def clustering_at(assignments: pa.Table, round_: int, at: Manifest) -> dict[str, float | None]:
    """Concept purity (the matched share), ARI and NMI of ω at an evaluated round over the
    participating clients (None each: the round was not evaluated, or one model)."""
    found = omega_at(assignments, round_)
    if found is None:
        return {"concept_purity": None, "concept_ari": None, "concept_nmi": None}
    omega, concepts = found
    part = np.asarray(at.participating)
    sizes = np.asarray([c.train_size for c in at.clients], dtype=float)
    purity = concept_purity(omega[part], concepts[part], sizes[part])
    return {"concept_purity": purity, **cluster_agreement(omega[part], concepts[part])}


def drift_recovery(
    by_round: dict[int, dict[str, Any]], before_last: int, rounds: tuple[int, int], prefix: str
) -> dict[str, Any]:
    """The drifted clients' accuracy before and after a drift, and the rounds they took to
    recover within the step's `rounds` (first, last); `before_last`: the previous step's
    last round."""
    previous = by_round.get(before_last, {})
    before = previous.get(prefix + "drifting_accuracy")
    after = previous.get(f"next_{prefix}drifted_accuracy")
    scores = {"accuracy_before_drift": before, "accuracy_after_drift": after}
    if before is None or after is None:
        return scores | {"recovery_rounds": None}
    first, last = rounds
    inside = [by_round[r] for r in range(first, last + 1) if r in by_round]
    key = prefix + "drifted_accuracy"
    return scores | {"recovery_rounds": recovery(inside, first, before, after, key)}


def averages(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The means over the steps and over the drifts, then the steps themselves."""
    drifts = [s for s in steps if s["drifted_clients"]]
    return {
        "recovery_margin": RECOVERY_MARGIN,
        "mean_local_accuracy": _mean([s["local_accuracy"] for s in steps]),
        "mean_next_accuracy": _mean([s["next_accuracy"] for s in steps]),
        "mean_accuracy_after_drift": _mean([s.get("accuracy_after_drift") for s in drifts]),
        "mean_recovery_rounds": _mean([s.get("recovery_rounds") for s in drifts]),
        "unrecovered_drifts": sum(s.get("recovery_rounds") is None for s in drifts),
        "mean_concept_purity": _mean([s["concept_purity"] for s in steps]),
        "mean_concept_ari": _mean([s["concept_ari"] for s in steps]),
        "mean_concept_nmi": _mean([s["concept_nmi"] for s in steps]),
        "steps": steps,
    }
