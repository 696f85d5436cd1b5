"""The columns a report can show (`fedrc report --columns`): where each value comes from, how
it is written and which way is better.

A value is read per run (one seed) and summarised over a group's seeds. FedRC-FT's fine-tuning
changes only its last-round scores; a column that reads the models before fine-tuning (the
best-train and maximum rounds) is empty on its row rather than showing un-fine-tuned numbers
beside the paper's fine-tuned ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.common.errors import FedrcError
from pipeline.outputs.runs import METRICS, Run


@dataclass(frozen=True)
class Column:
    stem: str  # its name in --columns and the CSV's `<stem>_mean`, `<stem>_std`, …
    title: str  # its header in report.md and report.tex
    read: Callable[[Run], float | None]
    scale: float = 100.0  # 100: a share in eval.json, shown in %
    digits: int = 2
    better: int = 1  # +1 higher is better, −1 lower, 0 neither (no best marked)
    finetuned: bool = True  # False: its value is the models' before FedRC-FT's fine-tuning
    what: str = ""  # one line for report.md's legend and `fedrc report --help`


def _result(key: str) -> Callable[[Run], float | None]:
    return lambda run: run.result.get(key)


def _logged(*keys: str) -> Callable[[Run], float | None]:
    """The mean over rounds of the sum of `keys` in metrics.jsonl (None where a key is absent:
    a run logged before fedrc recorded it)."""

    def read(run: Run) -> float | None:
        means = [run.mean_of(key) for key in keys]
        return None if None in means else sum(means)

    return read


def _accuracy(stem: str, title: str, what: str, finetuned: bool = True) -> Column:
    return Column(stem, title, _result(METRICS[stem]), finetuned=finetuned, what=what)


def _share(stem: str, title: str, what: str, better: int = 1) -> Column:
    return Column(stem, title, _result(METRICS[stem]), 1.0, 3, better, what=what)


COLUMNS = {
    column.stem: column
    for column in (
        _accuracy("train", "train (best-train)", "train accuracy at that round", False),
        _accuracy(
            "local",
            "local (best-train)",
            "participating clients, at the round with the best train accuracy (the paper's "
            "selection, primary)",
            False,
        ),
        _accuracy("global", "global (best-train)", "held-out clients, same round", False),
        _accuracy("final_local", "local (last)", "participating clients, last round"),
        _accuracy("final_global", "global (last)", "held-out clients, last round"),
        _accuracy(
            "max_global",
            "global (max, optimistic)",
            "the best held-out accuracy over rounds, chosen on the test data itself (the "
            "authors' parser's rule): optimistic",
            False,
        ),
        _accuracy(
            "unlabeled_global",
            "global (last, unlabeled)",
            "held-out clients assigned without their labels, last round",
        ),
        _share(
            "purity",
            "matched share",
            "share of the ω-mass in the cluster matched one to one with its concept "
            "(eval.json's concept_purity)",
        ),
        _share("ari", "ARI", "adjusted Rand index of the clients' clusters vs their concepts"),
        _share("nmi", "NMI", "normalised mutual information of the same"),
        _share(
            "label_purity",
            "label purity",
            "share of each label in its main cluster (high: clusters follow the labels)",
            0,
        ),
        Column(
            "local_std",
            "client std (last)",
            _result(METRICS["local_std"]),
            better=-1,
            what="spread of the participating clients' accuracies (std over clients, last round)",
        ),
        _accuracy(
            "local_worst10",
            "worst 10 % (last)",
            "mean accuracy of the worst 10 % of participating clients, last round",
        ),
        Column(
            "megabytes",
            "MB / round",
            _logged("bytes_down", "bytes_up"),
            1e-6,
            better=-1,
            what="bytes of the training messages per round, both ways (metrics.jsonl)",
        ),
        Column(
            "seconds",
            "s / round",
            _logged("seconds"),
            1.0,
            better=-1,
            what="wall seconds per round on the machine that ran it",
        ),
        Column(
            "minutes",
            "wall (min)",
            lambda run: sum(r.get("seconds", 0.0) for r in run.log) / 60,
            1.0,
            1,
            -1,
            what="the run's training wall time, every round (evaluation rounds included)",
        ),
    )
}
DEFAULT = ("local", "global", "final_local", "final_global", "max_global", "purity", "ari")
COSTS = ("local_std", "local_worst10", "nmi", "megabytes", "seconds", "minutes")  # 2nd table


def choose(names: list[str] | None, runs: list[Run]) -> list[Column]:
    """The columns named by `--columns`, checked; None: the default ones, with the unlabeled
    global accuracy after the last-round ones when a run was scored so."""
    if names is None:
        unlabeled = any(r.result.get(METRICS["unlabeled_global"]) is not None for r in runs)
        names = list(DEFAULT)
        if unlabeled:
            names.insert(names.index("final_global") + 1, "unlabeled_global")
    unknown = [name for name in names if name not in COLUMNS]
    if unknown or not names:
        given = unknown[0] if unknown else "(nothing)"
        raise FedrcError(f"--columns: unknown column '{given}'; choose from {', '.join(COLUMNS)}")
    return [COLUMNS[name] for name in dict.fromkeys(names)]
