"""Did a model of a hard-clustering run (IFCA, FeSEM) go without members, so that the FedRC
authors' release (`--set zero_empty=true`, or `--profile released`) would zero it? A reader of
finished run folders, not a stage.

For each run it prints whether it zeroed such models, the rounds in which a model had no member
among the participating clients (from assignments.parquet: every evaluated round, so with
`eval_every: 1` every round), the fewest members each model had, and, where the run's model.pt
is there, which models ended dead: all zeros but the output bias, the only part of a zeroed
ReLU network that still learns (so a zeroing between two evaluated rounds shows too). Run from
the repository root:

    PYTHONPATH=. python experiments/fmnist/ifca_empty_clusters.py RUN [RUN ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.data.records import read_manifest
from pipeline.run import files as rf
from pipeline.stages import run_config


def members(run: Path) -> tuple[list[int], np.ndarray]:
    """The evaluated rounds and, per round, how many participating clients each model had
    (rounds × K): each client counts for its arg-max ω."""
    table = rf.read_assignments(run / rf.ASSIGNMENTS).to_pandas()
    table = table[table["participating"]]
    omega = [c for c in table.columns if c.startswith("omega_")]
    rounds = sorted(table["round"].unique().tolist())
    counts = np.zeros((len(rounds), len(omega)), dtype=int)
    for i, (_, part) in enumerate(table.groupby("round", sort=True)):
        chosen = part[omega].to_numpy().argmax(1)
        counts[i] = np.bincount(chosen, minlength=len(omega))
    return rounds, counts


def dead_models(run: Path, classes: int) -> list[int] | None:
    """The models of the run's model.pt that are zero but for their last `classes` numbers (the
    output bias); None without a model.pt (a GPU check keeps only its digest)."""
    if not (run / rf.MODEL).is_file():
        return None
    models = rf.load_state(run / rf.MODEL)["models"]
    return [k for k, row in enumerate(models) if not row[:-classes].any()]


def summary(run: Path) -> str:
    config = run_config(run)
    zeroing = bool(getattr(config.algorithm_settings, "zero_empty", False))
    rounds, counts = members(run)
    empty = [r for r, row in zip(rounds, counts) if (row == 0).any()]
    shown = ", ".join(map(str, empty[:10])) + (" …" if len(empty) > 10 else "")
    # Without a model.pt (a GPU check's run) the benchmark need not be on this machine either.
    has_model = (run / rf.MODEL).is_file()
    dead = dead_models(run, read_manifest(Path(config.data)).num_classes) if has_model else None
    return (
        f"{run}: {config.algorithm}, zero_empty {zeroing}; {len(rounds)} rounds read; "
        f"a model without members in {len(empty)} ({shown or 'none'}); "
        f"fewest members per model {counts.min(0).tolist()}, at the last round "
        f"{counts[-1].tolist()}; dead at the end: {'no model.pt' if dead is None else dead}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("runs", nargs="+", type=Path, help="IFCA or FeSEM run folders")
    for run in parser.parse_args().runs:
        print(summary(run))


if __name__ == "__main__":
    main()
