"""report.csv: one row per group with every number behind the tables, for scripts and for the
console's summary. For each column: `<stem>_mean`, `_std` (sample std), `_n`, `_ci_low`,
`_ci_high` (95 % t-interval) and `_p` (paired test against the baseline); accuracies in %."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from pipeline.outputs.contents import Contents, at_rounds, by_concept, over_time
from pipeline.outputs.groups import Group
from pipeline.outputs.statistics import Summary


def _stats(prefix: str, s: Summary) -> dict[str, Any]:
    return {f"{prefix}_mean": s.mean, f"{prefix}_std": s.std}


def summary_rows(contents: Contents) -> list[dict[str, Any]]:
    rows = []
    for group, cells in zip(contents.groups, contents.cells):
        rounds = sorted({r.rounds for r in group.runs})
        row: dict[str, Any] = {
            "label": group.label,
            "algorithm": group.config["algorithm"],
            "runs": len(group.runs),
            "seeds": " ".join(str(r.seed) for r in group.runs),
            "rounds": str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}",
            "lr": group.config["lr"],
            "best_round": " ".join(str(r.result["best_round"]) for r in group.runs),
            "models": " ".join(r.model_digest[:12] for r in group.runs),  # what was scored
            "selected": group.selected,
            "baseline": group is contents.baseline,
        }
        for stem, cell in cells.items():
            s = cell.summary
            row |= _stats(stem, s)
            row |= {f"{stem}_n": s.n, f"{stem}_ci_low": s.low, f"{stem}_ci_high": s.high}
            row[f"{stem}_p"] = cell.p
        for mark, s in zip(contents.rounds, at_rounds(group, contents.rounds)):
            row |= _stats(f"global_round{mark}", s)
        concepts = contents.manifest.concepts
        for concept, s in zip(concepts, by_concept(group, concepts)):
            row |= _stats(f"global_{concept}", s)
        row |= over_time_row(group)
        numbers = contents.paper(group)
        (local, local_std), (global_, global_std) = numbers or ((None, None), (None, None))
        row |= {
            "paper_row": group.base if numbers else "",
            "paper_local": local,
            "paper_local_std": local_std,
            "paper_global": global_,
            "paper_global_std": global_std,
        }
        rows.append(row)
    return rows


def over_time_row(group: Group) -> dict[str, Any]:
    cells = over_time(group)
    if cells is None:
        return {}
    row: dict[str, Any] = {}
    for stem in ("steps_local", "steps_next", "after_drift", "recovery", "steps_purity"):
        row |= _stats(stem, cells[stem])
    row |= _stats("steps_ari", cells["steps_ari"])
    row["unrecovered"] = cells["unrecovered"]
    for step, s in enumerate(cells["next_steps"]):
        row |= _stats(f"next_step{step}", s)
    return row


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows, every key a column (a row without one: empty)."""
    names = list(dict.fromkeys(key for row in rows for key in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in names})
