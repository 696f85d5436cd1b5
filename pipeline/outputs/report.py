"""Many runs → one table and one figure, next to the paper's Table 1 and Figure 3.

Runs that differ only in their seed form a group (an algorithm under one configuration); a
group's accuracies are the mean ± standard deviation over its seeds (numpy's std, ddof = 0), in
percent, at the round with the best train accuracy (the paper's model selection) and at the
last round, and at a quarter, half, three quarters and all of the rounds (is it still
climbing?). Every number comes from the runs' own files: eval.json (accuracies, purity),
metrics.jsonl (rounds run, global accuracy per evaluated round), config.json (configuration,
seed, benchmark) and assignments.parquet (ω at the last evaluated round, for the cluster maps).
An eval.json is used only while it matches its run: the model it scored (model.pt's digest,
listed in report.csv's `models`), the last round of metrics.jsonl and the benchmark
(`check_made_from`).
On a drifting benchmark a second table gives eval.json's `over_time` numbers: the mean over steps
of the local and the next-step accuracy, the drifted clients' accuracy right after their drift,
the rounds they took to recover, concept purity, and the next-step accuracy at every step.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.algorithms import ALGORITHMS, num_models
from pipeline.algorithms.base import HardClustering
from pipeline.common.errors import FedrcError, counted
from pipeline.common.io import atomic_files, remove_leftovers
from pipeline.common.reading import parse_json
from pipeline.common.run_lock import writer_lock
from pipeline.config import TrainConfig
from pipeline.data.records import MANIFEST, Manifest, read_manifest
from pipeline.data.shards import data_digest
from pipeline.run import files as rf
from pipeline.run.derived import check_made_from
from pipeline.run.resolve import from_values

# The paper's published numbers: Guo et al., "Tackling Diverse Distribution Shifts Challenge in
# Federated Learning by Robust Clustering" (FedRC), ICML 2024, Table 1, FashionMNIST (CNN)
# columns: 300 clients, K = 3, mean local / global test accuracy (%) ± std at the round with the
# best train accuracy. (label → ((local, ±), (global, ±)))
PAPER_TABLE1_FMNIST: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "FedAvg": ((42.12, 0.33), (34.35, 0.92)),
    "IFCA": ((47.90, 0.60), (31.30, 2.69)),
    "CFL(3)": ((41.77, 0.40), (33.53, 0.35)),
    "FeSEM": ((60.99, 1.01), (47.63, 0.99)),
    "FedEM": ((56.64, 2.14), (28.08, 0.92)),
    "FedRC": ((66.51, 2.39), (59.00, 4.91)),
    "CFL": ((42.47, 0.02), (32.37, 0.09)),
    "FedSoft": ((91.35, 0.04), (19.88, 0.50)),
    "FedRC-FT": ((91.02, 0.26), (62.37, 1.09)),
}
PAPER_SOURCE = "Guo et al., ICML 2024, Table 1 (FashionMNIST, CNN, 300 clients, K = 3)"
METRICS = {  # column stem → eval.json key
    "train": "train_accuracy",
    "local": "local_accuracy",
    "global": "global_accuracy",
    "final_local": "final_local_accuracy",
    "final_global": "final_global_accuracy",
    "max_global": "max_global_accuracy",
    "purity": "concept_purity",
    "label_purity": "label_purity",
    "unlabeled_global": "final_unlabeled_global_accuracy",
}
OPTIONAL = ("unlabeled_global",)  # absent from eval.json files older than it
SHARES = ("purity", "label_purity")  # in [0, 1], not accuracies
OVER_TIME = {  # column stem → eval.json's over_time key (drifting benchmarks)
    "steps_local": "mean_local_accuracy",
    "steps_next": "mean_next_accuracy",
    "after_drift": "mean_accuracy_after_drift",
}
EVAL_KEYS = ("prediction", "finetune")  # eval settings that make a different row


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    result: dict[str, Any]
    rounds: int
    global_curve: dict[int, float]  # evaluated round → soft global accuracy (metrics.jsonl)
    model_digest: str = ""  # of the model.pt that eval.json scored (checked when read)

    @property
    def seed(self) -> int:
        return int(self.config["seed"])


@dataclass
class Group:
    """Runs of one algorithm and configuration that differ only in the seed."""

    key: tuple
    runs: list[Run] = field(default_factory=list)
    label: str = ""
    paper: str | None = None
    selected: bool = True

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config

    def values(self, stem: str) -> list[float]:
        key = METRICS[stem]  # OPTIONAL ones may be absent
        return [r.result[key] for r in self.runs if r.result.get(key) is not None]


def find_runs(patterns: list[str]) -> list[Path]:
    """Run folders (with config.json and metrics.jsonl) named by globs, folders or root folders."""
    found: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = [Path(p) for p in sorted(glob.glob(pattern))]
        else:
            matches = [Path(pattern)]
            if not matches[0].exists():
                raise FedrcError(f"{pattern}: no such file or folder")
        for path in matches:
            if _is_run(path):
                found.append(path)
            elif path.is_dir():
                found += sorted(p.parent for p in path.rglob(rf.METRICS) if _is_run(p.parent))
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise FedrcError(
            f"{', '.join(patterns)}: no run folders found (a run folder holds the config.json "
            "and metrics.jsonl of `fedrc train`)"
        )
    return [Path(p) for p in unique]


def _is_run(path: Path) -> bool:
    return (path / rf.CONFIG).is_file() and (path / rf.METRICS).is_file()


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise FedrcError(f"{path.parent}: no {path.name} ({what})")
    try:
        value = parse_json(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedrcError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise FedrcError(f"{path}: expected a JSON object")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number_or_none(value: Any) -> bool:
    return value is None or _number(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _share(value: Any) -> bool:
    """An accuracy or a purity: a number in [0, 1] (NaN is not), or absent (None)."""
    return value is None or (_number(value) and 0 <= value <= 1)


def _require(path: Path, key: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        shown = f"{type(value).__name__} {value!r}"[:60]
        where = f"{path}: {key}" if key else str(path)
        raise FedrcError(f"{where}: expected {expected}, got {shown} (edited since?)")


def check_result(path: Path, result: dict[str, Any]) -> None:
    """The fields of eval.json that the report reads: present and of their types."""
    required = [key for stem, key in METRICS.items() if stem not in OPTIONAL]
    missing = [k for k in (*required, *EVAL_KEYS, "best_round") if k not in result]
    if missing:
        raise FedrcError(f"{path}: not a fedrc eval result (no {missing[0]})")
    for stem, key in METRICS.items():  # a purity is null where the run has one model
        ok = _number_or_none if stem in (*OPTIONAL, *SHARES) else _number
        value = result.get(key)
        _require(path, key, value, ok(value), "a number")
        _require(path, key, value, _share(value), "a number in [0, 1]")
    prediction, finetune = result["prediction"], result["finetune"]
    _require(path, "prediction", prediction, prediction in ("soft", "hard"), "soft or hard")
    _require(path, "finetune", finetune, isinstance(finetune, bool), "true or false")
    lr = result.get("finetune_lr")
    _require(path, "finetune_lr", lr, lr is None or (_number(lr) and lr > 0), "a positive number")
    best = result["best_round"]
    _require(path, "best_round", best, _count(best) and best >= 1, "a round")
    if "over_time" in result:
        check_over_time(path, result["over_time"])


def check_over_time(path: Path, over: Any) -> None:
    """eval.json's `over_time` (a drifting benchmark): the numbers the drift table reads."""
    _require(path, "over_time", over, isinstance(over, dict), "a mapping")
    means = [*OVER_TIME.values(), "mean_recovery_rounds", "mean_concept_purity"]
    for key in means:
        value = over.get(key)
        _require(path, f"over_time.{key}", value, _number_or_none(value), "a number or null")
    for key in ("unrecovered_drifts", "time_steps"):
        _require(path, f"over_time.{key}", over.get(key), _count(over.get(key)), "a count")
    steps = over["steps"] if isinstance(over.get("steps"), list) else None
    ok = steps is not None and len(steps) >= over["time_steps"] - 1
    _require(path, "over_time.steps", over.get("steps"), ok, "an entry per time step")
    for t, step in enumerate(steps or []):
        value = step.get("next_accuracy") if isinstance(step, dict) else step
        ok = isinstance(step, dict) and _number_or_none(value)
        _require(path, f"over_time.steps[{t}].next_accuracy", value, ok, "a number or null")


def check_clients(path: Path) -> None:
    """eval_clients.json, where it is kept: one entry per client, in order, with numbers."""
    if not path.is_file():
        return  # a copy of a run kept without it (`benchmarks/gpu_results.py`)
    try:
        clients = parse_json(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedrcError(f"{path}: not valid JSON ({e})") from None
    ok = isinstance(clients, list) and len(clients) > 0
    _require(path, "", clients, ok, "a list of one entry per client")
    for i, entry in enumerate(clients):
        ok = isinstance(entry, dict) and entry.get("client_id") == i
        _require(path, f"[{i}]", entry, ok, f"the entry of client {i}")
        for key in ("train_accuracy", "test_accuracy"):
            value = entry.get(key)
            _require(path, f"[{i}].{key}", value, _number(value), "a number")
            _require(path, f"[{i}].{key}", value, _share(value), "a number in [0, 1]")
        omega = entry.get("omega")
        ok = isinstance(omega, list) and len(omega) > 0 and all(map(_number, omega))
        _require(path, f"[{i}].omega", omega, ok, "a list of numbers")
        ok = all(map(_share, omega)) and abs(sum(omega) - 1) <= 1e-3
        _require(path, f"[{i}].omega", omega, ok, "weights in [0, 1] summing to 1")


def load_run(path: Path) -> Run:
    config = _read_json(path / rf.CONFIG, "not a `fedrc train` run")
    result = _read_json(path / "eval.json", "run `fedrc eval --run` on it first")
    check_result(path / "eval.json", result)
    check_clients(path / "eval_clients.json")
    if "data_digest" not in config or "seed" not in config or "algorithm" not in config:
        raise FedrcError(f"{path / rf.CONFIG}: not a fedrc run configuration")
    rows = rf.read_metrics(path / rf.METRICS)
    if not rows:
        raise FedrcError(f"{path / rf.METRICS}: no rounds")
    curve = {r["round"]: r["global_accuracy"] for r in rows if "global_accuracy" in r}
    last = max(r["round"] for r in rows)
    model = check_made_from(path, result, config["data_digest"], last)
    return Run(path, config, result, last, curve, model)


def _identity(run: Run) -> tuple:
    """The run's configuration apart from its seed, plus the eval settings."""
    identity = run_settings(run).identity()
    identity.pop("seed")
    identity.update({k: run.result[k] for k in EVAL_KEYS})
    identity["finetune_lr"] = own_finetune_lr(run)
    return tuple(sorted((k, json.dumps(v)) for k, v in identity.items()))


def own_finetune_lr(run: Run) -> float | None:
    """FedRC-FT's lr where it is not the run's own (eval.json's `finetune_lr`, from
    `--finetune-lr`); None for the run's lr and for results written before it was recorded."""
    lr = run.result.get("finetune_lr")
    return None if lr is None or lr == run.config.get("lr") else lr


def run_settings(run: Run) -> TrainConfig:
    values = {k: v for k, v in run.config.items() if k != "data_digest"}
    return from_values(values, str(run.path / rf.CONFIG))


def _base_label(run: Run) -> str:
    """The algorithm's title with its variant ("CFL(3)"), "-FT" when fine-tuned, " (hard)" when
    predicting with one model is not the method's own rule: a hard-clustering method (IFCA,
    CFL, FeSEM) predicts with its cluster's model, which is what its paper reports."""
    config = run_settings(run)
    algorithm = ALGORITHMS.get(config.algorithm)
    name = algorithm.label(config.algorithm_settings) + ("-FT" if run.result["finetune"] else "")
    if (lr := own_finetune_lr(run)) is not None:
        name += f" (FT lr {lr:g})"
    own_rule = issubclass(algorithm, HardClustering)
    return name + (" (hard)" if run.result["prediction"] == "hard" and not own_rule else "")


def group_runs(runs: list[Run]) -> list[Group]:
    """Groups in the order of the paper's Table 1, then by name; one benchmark for all; each
    run once (copies of one run score one model: counted as seeds, they would fake a spread)."""
    scored: dict[tuple, Path] = {}
    for run in runs:
        key = (run.model_digest, *(run.result[k] for k in EVAL_KEYS), own_finetune_lr(run))
        if key in scored:
            raise FedrcError(
                f"{run.path}: the same run as {scored[key]} (its eval.json scored the same "
                "model, evaluated alike); give each run once"
            )
        scored[key] = run.path
    first = runs[0]
    for run in runs[1:]:
        if run.config["data_digest"] != first.config["data_digest"]:
            raise FedrcError(
                f"{run.path}: trained on another benchmark than {first.path} (the shards' "
                "hashes differ); report runs of one benchmark at a time"
            )
    groups: dict[tuple, Group] = {}
    for run in runs:
        key = _identity(run)
        groups.setdefault(key, Group(key)).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: r.seed)
        seeds = [r.seed for r in group.runs]
        if len(set(seeds)) != len(seeds):
            twice = next(s for s in seeds if seeds.count(s) > 1)
            paths = [str(r.path) for r in group.runs if r.seed == twice]
            raise FedrcError(f"{paths[1]}: same configuration and seed {twice} as {paths[0]}")
        base = _base_label(group.runs[0])
        group.label = base
        group.paper = base if base in PAPER_TABLE1_FMNIST else None
    _disambiguate(list(groups.values()))
    order = list(PAPER_TABLE1_FMNIST)
    return sorted(
        groups.values(),
        key=lambda g: (order.index(g.paper) if g.paper else len(order), g.label),
    )


def _disambiguate(groups: list[Group]) -> None:
    """Groups sharing a label get the keys they differ in ("FedRC lr=0.03"); among them the
    one with the best mean train accuracy is `selected` (the paper's learning-rate rule)."""
    by_label: dict[str, list[Group]] = {}
    for group in groups:
        by_label.setdefault(group.label, []).append(group)
    for label, same in by_label.items():
        if len(same) == 1:
            continue
        dicts = [dict(g.key) for g in same]
        differ = sorted(k for k in dicts[0] if len({d.get(k) for d in dicts}) > 1)
        for group, d in zip(same, dicts):
            group.label = label + " " + " ".join(f"{k}={json.loads(d[k])}" for k in differ)
        best = max(same, key=lambda g: float(np.mean(g.values("train"))))
        for group in same:
            group.selected = group is best


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return 100 * float(np.mean(values)), 100 * float(np.std(values))


def milestones(runs: list[Run]) -> list[int]:
    """A quarter, half, three quarters and all of the longest run's rounds."""
    longest = max(r.rounds for r in runs)
    return sorted({max(1, math.ceil(longest * q / 4)) for q in range(1, 5)})


def global_at(run: Run, round_: int) -> float | None:
    """Soft global accuracy at the run's last evaluation at or before `round_`; None if the run
    stopped before `round_` or had not been evaluated by then."""
    if run.rounds < round_:
        return None
    evaluated = [r for r in run.global_curve if r <= round_]
    return run.global_curve[max(evaluated)] if evaluated else None


def summary_rows(groups: list[Group], marks: list[int]) -> list[dict[str, Any]]:
    """One row per group: mean ± std (%) over seeds of every metric, rounds, the paper's values,
    and global accuracy at the milestone rounds `marks` (only where every seed got there)."""
    rows = []
    for group in groups:
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
        }
        for stem in METRICS:
            if stem in SHARES:  # kept in [0, 1]
                values = group.values(stem)
                row[f"{stem}_mean"] = float(np.mean(values)) if values else None
                row[f"{stem}_std"] = float(np.std(values)) if values else None
                continue
            row[f"{stem}_mean"], row[f"{stem}_std"] = _stats(group.values(stem))
        for mark in marks:
            values = [global_at(r, mark) for r in group.runs]
            complete = values if None not in values else []
            row[f"global_round{mark}_mean"], row[f"global_round{mark}_std"] = _stats(complete)
        if all("over_time" in r.result for r in group.runs):
            row.update(over_time_cells(group))
        local, global_ = PAPER_TABLE1_FMNIST.get(group.paper or "", ((None, None), (None, None)))
        row["paper_row"] = group.paper or ""
        row["paper_local"], row["paper_local_std"] = local
        row["paper_global"], row["paper_global_std"] = global_
        rows.append(row)
    return rows


def over_time_cells(group: Group) -> dict[str, Any]:
    """A drifting run's numbers over seeds: accuracies in % (mean, std), rounds to recover and
    purity as they are, and the next-step accuracy at each step."""
    over = [r.result["over_time"] for r in group.runs]
    cells: dict[str, Any] = {}
    for stem, key in OVER_TIME.items():
        cells[f"{stem}_mean"], cells[f"{stem}_std"] = _stats(
            [o[key] for o in over if o[key] is not None]
        )
    for stem, key in (
        ("recovery", "mean_recovery_rounds"),
        ("steps_purity", "mean_concept_purity"),
    ):
        values = [o[key] for o in over if o[key] is not None]
        cells[f"{stem}_mean"] = float(np.mean(values)) if values else None
        cells[f"{stem}_std"] = float(np.std(values)) if values else None
    cells["unrecovered"] = sum(o["unrecovered_drifts"] for o in over)
    for step in range(over[0]["time_steps"] - 1):
        values = [o["steps"][step]["next_accuracy"] for o in over]
        complete = [v for v in values if v is not None]
        cells[f"next_step{step}_mean"], cells[f"next_step{step}_std"] = _stats(complete)
    return cells


def over_time_table(rows: list[dict[str, Any]], manifest: Manifest) -> list[str]:
    """The drift table: how each algorithm fared over the time steps."""
    if manifest.time_steps == 1 or not any("steps_next_mean" in r for r in rows):
        return []
    lines = [
        "",
        f"## Over time ({manifest.time_steps} steps)",
        "",
        "Per step, at its last round: *local* on the step's own test data, *next* on the next "
        "step's data before any round trained on it (FedDrift's protocol), *after drift* the "
        "clients that drifted, scored on their new data before any round; *recover*: rounds "
        "until those clients are back within 1 point of their accuracy before the drift "
        "(mean over drifts that recovered; the count that did not, over all seeds, in "
        "brackets); purity: concept purity, mean over steps.",
        "",
        "| algorithm | local (steps) | next (steps) | after drift | recover | purity |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "steps_next_mean" not in r:
            continue
        recover = "–" if r["recovery_mean"] is None else f"{r['recovery_mean']:.1f}"
        purity = "–" if r["steps_purity_mean"] is None else f"{r['steps_purity_mean']:.3f}"
        lines.append(
            f"| {r['label']} | {_cell(r['steps_local_mean'], r['steps_local_std'])} "
            f"| {_cell(r['steps_next_mean'], r['steps_next_std'])} "
            f"| {_cell(r['after_drift_mean'], r['after_drift_std'])} "
            f"| {recover} ({r['unrecovered']}) | {purity} |"
        )
    steps = range(manifest.time_steps - 1)
    lines += [
        "",
        "Next-step accuracy (%) at the end of each step:",
        "",
        "| algorithm | " + " | ".join(f"{t} → {t + 1}" for t in steps) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for r in rows:
        if "steps_next_mean" in r:
            cells = [_cell(r[f"next_step{t}_mean"], r[f"next_step{t}_std"]) for t in steps]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines


def find_manifest(run: Run) -> Manifest:
    """The benchmark a run was trained on: config.json's `data`, as given or relative to the
    run's parent folders (a DVC stage runs in its own folder), with the recorded hash."""
    data = Path(run.config["data"])
    candidates = [data] if data.is_absolute() else [data, *(p / data for p in run.path.parents)]
    changed = None
    for folder in candidates:
        if (folder / MANIFEST).is_file():
            manifest = read_manifest(folder)
            if data_digest(manifest) == run.config["data_digest"]:
                return manifest
            changed = changed or folder
    if changed is not None:
        raise FedrcError(
            f"{run.path}: the benchmark it was trained on, {changed}, changed since (partitioned "
            "again or edited: its content hash is not the one in config.json); retrain the run "
            "or restore that benchmark"
        )
    raise FedrcError(
        f"{run.path}: the benchmark it was trained on ({data}) was not found, relative to "
        "the current folder or the run's parent folders (the cluster maps need its manifest)"
    )


def drawn_groups(groups: list[Group]) -> list[Group]:
    """The selected groups that cluster (more than one model), one per training
    configuration: ω comes from training, so a configuration scored both soft and hard (or
    fine-tuned) would draw the same ω twice; its plainly scored group is kept, else the first."""

    def plain(group: Group) -> bool:
        result = group.runs[0].result
        return not result["finetune"] and result["prediction"] == "soft"

    chosen: dict[tuple, Group] = {}
    for group in groups:
        if not group.selected or num_models(run_settings(group.runs[0])) == 1:
            continue
        trained = tuple(item for item in group.key if item[0] not in EVAL_KEYS)
        if trained not in chosen or (plain(group) and not plain(chosen[trained])):
            chosen[trained] = group
    drawn = [id(g) for g in chosen.values()]
    return [g for g in groups if id(g) in drawn]


def concept_maps(groups: list[Group], manifest: Manifest) -> list[tuple[str, Any]]:
    """(title, (concepts with their client counts, shares)) for each of `drawn_groups`, in the
    report's order: its lowest-seed run, ω at its last evaluated round (Figure 3's concept row).
    Clusters are not aligned across seeds, so one run is drawn rather than an average."""
    from pipeline.outputs.plots import cluster_shares, final_omega, with_counts

    maps = []
    for group in drawn_groups(groups):
        run = group.runs[0]
        round_, omega = final_omega(rf.read_assignments(run.path / rf.ASSIGNMENTS))
        last_step = manifest.at_step(manifest.time_steps - 1)  # the concepts of ω's round
        concepts, shares, clients = cluster_shares(omega, last_step)["concept"]
        title = f"{group.label}, seed {run.seed}, round {round_}"
        maps.append((title, (with_counts(concepts, clients), shares)))
    return maps


def _cell(mean: float | None, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.2f} ± {std:.2f}"


def markdown(
    rows: list[dict[str, Any]], manifest: Manifest, runs: list[Run], marks: list[int]
) -> str:
    dataset = manifest.dataset
    clients = len(manifest.participating)
    lines = [
        "# Report: accuracy over seeds next to the paper's Table 1",
        "",
        f"Benchmark: {dataset}, {clients} participating clients, "
        f"content hash `{runs[0].config['data_digest'][:12]}`; {counted(len(runs), 'run')}.",
        "Accuracies in %, mean ± std over seeds (numpy std, ddof = 0), soft prediction unless "
        "marked (hard-clustering methods, IFCA, CFL, FeSEM…, are unmarked either way: one "
        "model per client is their own rule); *best-train*: at the round with the best train "
        "accuracy (the paper's model selection), *last*: at the last round. Purity: concept "
        "purity in [0, 1] (1: each concept in a cluster of its own); labels: label purity (1: "
        "each label in one cluster, 1/K: spread evenly; high when clusters follow the labels). "
        "*Unlabeled*: the held-out clients assigned without their labels (the method's "
        "label-free rule, else the model with the lowest prediction entropy).",
        f"Paper: {PAPER_SOURCE}, local / global.",
    ]
    caveat = paper_caveat(manifest)
    if caveat:
        lines.append(f"**{caveat}**")
    lines += [
        "",
        "| algorithm | seeds | rounds | lr | local (best-train) | global (best-train) "
        "| local (last) | global (last) | global (last, unlabeled) | purity | labels "
        "| paper local | paper global |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = (
            " ★"
            if r["selected"]
            and any(x["label"] != r["label"] and x["algorithm"] == r["algorithm"] for x in rows)
            else ""
        )
        lines.append(
            f"| {r['label']}{mark} | {r['seeds']} | {r['rounds']} | {r['lr']:g} "
            f"| {_cell(r['local_mean'], r['local_std'])} "
            f"| {_cell(r['global_mean'], r['global_std'])} "
            f"| {_cell(r['final_local_mean'], r['final_local_std'])} "
            f"| {_cell(r['final_global_mean'], r['final_global_std'])} "
            f"| {_cell(r['unlabeled_global_mean'], r['unlabeled_global_std'])} "
            + (f"| {r['purity_mean']:.3f} " if r["purity_mean"] is not None else "| – (one model) ")
            + (f"| {r['label_purity_mean']:.3f} " if r["label_purity_mean"] is not None else "| – ")
            + f"| {_cell(r['paper_local'], r['paper_local_std'])} "
            f"| {_cell(r['paper_global'], r['paper_global_std'])} |"
        )
    if any("★" in line for line in lines):
        lines += [
            "",
            "★: of one algorithm's configurations, the one with the best mean train "
            "accuracy (how the paper picks its learning rate).",
        ]
    return "\n".join(lines + over_time_table(rows, manifest) + progress_table(rows, marks)) + "\n"


def progress_table(rows: list[dict[str, Any]], marks: list[int]) -> list[str]:
    """Global accuracy at the milestone rounds: whether an algorithm is still climbing."""
    lines = [
        "",
        "## Global accuracy over rounds",
        "",
        "Soft global accuracy (%) at the last evaluation at or before each round, mean ± std "
        "over seeds (– where a seed stopped earlier).",
        "",
        "| algorithm | " + " | ".join(f"round {m}" for m in marks) + " |",
        "|---|" + "---|" * len(marks),
    ]
    for r in rows:
        cells = [_cell(r[f"global_round{m}_mean"], r[f"global_round{m}_std"]) for m in marks]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def draw(path: Path, rows: list[dict[str, Any]], maps: list[tuple[str, Any]], dpi: int) -> None:
    """Top: the concept rows of Figure 3 (share of each concept per cluster); bottom: global
    accuracy per group, best-train and last round, with the paper's value as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.outputs.plots import SHARE, _heatmap

    columns = max(len(maps), 1)
    layout = [[f"map{i}" for i in range(columns)], ["bars"] * columns] if maps else [["bars"]]
    fig, axes = plt.subplot_mosaic(
        layout,
        figsize=(max(4.2 * columns, 8), 8.4 if maps else 4.6),
        height_ratios=[1, 1.1] if maps else None,
        constrained_layout=True,
    )
    for i, (title, (concepts, shares)) in enumerate(maps):
        image = _heatmap(axes[f"map{i}"], shares, concepts, title)
    if maps:
        fig.colorbar(image, ax=[axes[f"map{i}"] for i in range(columns)], label=SHARE)
    ax = axes["bars"]
    x = np.arange(len(rows))
    width = 0.38
    for offset, stem, name in (
        (-width / 2, "global", "best-train round"),
        (width / 2, "final_global", "last round"),
    ):
        means = [r[f"{stem}_mean"] for r in rows]
        stds = [r[f"{stem}_std"] for r in rows]
        ax.bar(x + offset, means, width, yerr=stds, capsize=3, label=f"ours, {name}")
    paper = [(i, r["paper_global"]) for i, r in enumerate(rows) if r["paper_global"] is not None]
    if paper:
        ax.scatter(*zip(*paper), marker="D", color="black", zorder=3, label="paper, Table 1")
    ax.set_xticks(x, [r["label"] for r in rows], rotation=20, ha="right")
    ax.set(
        ylabel="global accuracy (%)",
        ylim=(0, 100),
        title="Global accuracy (held-out clients), mean ± std over seeds",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=dpi, format="png")  # a temporary name: say the format
    plt.close(fig)


def paper_caveat(manifest: Manifest) -> str | None:
    """What to say when the paper's numbers stand beside runs on another benchmark."""
    clients = len(manifest.participating)
    if manifest.dataset == "fmnist" and clients == 300 and manifest.time_steps == 1:
        return None
    return (
        f"This benchmark is {manifest.dataset} with {clients} clients, not the paper's "
        "Fashion-MNIST with 300: the paper's numbers are shown for orientation only."
    )


def check_out(out: Path) -> None:
    """Refuse an --out that is, or is inside, a benchmark or a run folder: the report would mix
    with their files, and `partition --overwrite`, `train` and `plot` replace what is there."""
    target = Path(os.path.abspath(out))
    for folder in (target, *target.parents):
        if (folder / MANIFEST).is_file():
            what = "a fedrc benchmark"
        elif _is_run(folder):
            what = "a fedrc run"
        else:
            continue
        where = "is" if folder == target else f"is inside {folder},"
        raise FedrcError(f"--out: {out} {where} {what}; choose a folder of its own for the report")


def build_report(
    patterns: list[str], out: Path, dpi: int = 120
) -> tuple[list[dict[str, Any]], str | None]:
    """Read the runs, check them, then write report.md, report.csv and report.png together;
    returns the table's rows and the caveat on the paper's numbers (None on its benchmark)."""
    check_out(out)
    runs = [load_run(p) for p in find_runs(patterns)]
    groups = group_runs(runs)
    manifest = find_manifest(runs[0])
    marks = milestones(runs)
    rows = summary_rows(groups, marks)
    maps = concept_maps(groups, manifest)
    text = markdown(rows, manifest, runs, marks)
    names = ("report.md", "report.csv", "report.png")
    with writer_lock(out, "--out", "fedrc report"):
        remove_leftovers(out, names)  # a killed report's temporary files
        with atomic_files(*(out / n for n in names)) as (md, table, figure):
            md.write_text(text)
            write_csv(table, rows)
            draw(figure, rows, maps, dpi)
    return rows, paper_caveat(manifest)
