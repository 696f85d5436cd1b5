"""Per-round metrics through DVCLive, when it is installed (the `dvc` extra; the core install
does not need it).

Each round's numbers go to `<run>/dvclive/` as they come: `plots/metrics/*.tsv` (one file per
metric, by round), and `metrics.json` with the latest values plus the run's best, so that DVC's
tools draw curves while a run trains (the VS Code extension) and `dvc exp show` compares runs by
their final and best numbers. The DVC pipeline declares these files (`dvc.yaml`); DVCLive is told
not to write a dvc.yaml of its own, nor to save experiments.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

FOLDER = "dvclive"
# metrics.jsonl key → DVCLive name, short so that `dvc metrics show` stays narrow
LOGGED = {
    "train_loss": "loss",
    "train_accuracy": "train",
    "local_accuracy": "local",
    "global_accuracy": "global",
    # drifting benchmarks (fedrc train's metrics rows name them)
    "step": "step",
    "next_local_accuracy": "next",
    "drifted_accuracy": "drifted",
}


class RoundLogger:
    """Feeds one run's metrics rows to DVCLive; `close()` when training stops."""

    def __init__(self, out: Path, history: list[dict[str, Any]]):
        """`history`: the rows a resumed run has logged; the folder is written afresh from them
        (rounds after the last checkpoint are gone from metrics.jsonl, so from here too)."""
        from dvclive import Live

        logging.getLogger("dvclive").setLevel(logging.ERROR)  # not its notes on Git and DVC
        clear(out)
        self.live = Live(dir=str(out / FOLDER), save_dvc_exp=False, dvcyaml=False, report=None)
        self.best: dict[str, Any] = {}
        self._best_train = -1.0
        for row in history:
            self(row)

    def _best(self, row: dict[str, Any]) -> None:
        """`best_global` over rounds, and the paper's pick: `selected_global`, the global
        accuracy at the round with the best train accuracy (eval.json has the round)."""
        if "global_accuracy" not in row:
            return
        if row["global_accuracy"] > self.best.get("best_global", -1.0):
            self.best["best_global"] = row["global_accuracy"]
        if row["train_accuracy"] > self._best_train:
            self._best_train = row["train_accuracy"]
            self.best["selected_global"] = row["global_accuracy"]

    def __call__(self, row: dict[str, Any]) -> None:
        self._best(row)
        self.live.step = row["round"]
        for key, name in LOGGED.items():
            if key in row:
                self.live.log_metric(name, row[key])
        self.live.summary.update(self.best)
        self.live.next_step()  # writes metrics.json and the .tsv files now

    def close(self) -> None:
        self.live.end()


# What DVCLive writes in its folder for fedrc (metrics and their curves, and what it would
# write with other settings): the rest of the folder is the user's.
OWN_FILES = ("metrics.json", "params.yaml", "report.html", "report.md", "dvc.yaml")
OWN_FOLDERS = ("plots/metrics", "plots/images", "plots/sklearn", "plots/custom")


def clear(out: Path) -> None:
    """Remove DVCLive's files in the run folder `out` (they describe a run being replaced),
    then the folders left empty: a file of the user's there stays, with its folders."""
    folder = out / FOLDER
    for name in OWN_FILES:
        (folder / name).unlink(missing_ok=True)
    for name in OWN_FOLDERS:
        shutil.rmtree(folder / name, ignore_errors=True)
    for empty in (folder / "plots", folder):
        with contextlib.suppress(OSError):
            empty.rmdir()


def round_logger(out: Path, history: list[dict[str, Any]]) -> RoundLogger | None:
    """A RoundLogger, or None when DVCLive is not installed."""
    try:
        import dvclive  # noqa: F401
    except ImportError:
        return None
    return RoundLogger(out, history)
