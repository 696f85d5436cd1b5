"""docs/authors-check.md's table: next-step accuracy per stream and algorithm (mean ± std over
seeds, from each stream's `fedrc report`), beside the oracle's ceiling. Run from the repository
root after `dvc repro experiments/streams/dvc.yaml`: `python experiments/streams/table.py`
(or give the folder holding `<stream>/report.csv`, e.g. the committed results)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
from ceiling import CLIENTS, STREAMS, agreement, ceiling

from pipeline.data.drift import preset_schedule

HERE = Path(__file__).resolve().parent
ORDER = ("fedavg", "ifca", "feddrift", "feddrift-eager")


def rows(report: Path) -> dict[str, dict[str, str]]:
    """The report's rows by algorithm, checked for the columns the table reads."""
    if not report.is_file():
        raise SystemExit(f"{report}: no report; run `dvc repro experiments/streams/dvc.yaml`")
    with report.open() as f:
        table = {row["algorithm"]: row for row in csv.DictReader(f)}
    for algorithm, row in table.items():
        for key in ("runs", "steps_next_mean", "steps_next_std", "steps_local_mean"):
            if not row.get(key):
                raise SystemExit(f"{report}: {algorithm} has no {key}")
    return table


def cell(row: dict[str, str] | None) -> str:
    if row is None:
        return "–"
    mean, std = float(row["steps_next_mean"]), float(row["steps_next_std"])
    return f"{mean / 100:.3f} ± {std / 100:.3f}"


def main(folder: Path) -> None:
    schedule = preset_schedule("feddrift-a", CLIENTS)
    reports = {s: rows(folder / s / "report.csv") for s in STREAMS}
    print("| stream | " + " | ".join(ORDER) + " | ceiling |")
    print("|---" * (len(ORDER) + 2) + "|")
    for stream, table in reports.items():
        top = ceiling(agreement(stream, 0, 1), schedule)
        cells = [cell(table.get(a)) for a in ORDER]
        print(f"| {stream} | " + " | ".join(cells) + f" | {top:.3f} |")
    print("\nlocal accuracy at a step's last round, range over algorithms:")
    for stream, table in reports.items():
        local = [float(row["steps_local_mean"]) / 100 for row in table.values()]
        print(f"  {stream}: {np.min(local):.3f}–{np.max(local):.3f}")


if __name__ == "__main__":  # run as a script, this folder is on sys.path (for `ceiling`)
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "report")
