"""The run folders a report reads, found and checked: each one's configuration, eval.json and
per-round log, read once, with every field the report uses present and of its type.

Any set of run folders will do (a sweep writes one ordinary folder per grid point). A folder
reached twice (named twice, or by a glob and a parent folder) is refused: it would count as two
seeds. An eval.json is used only while it matches its run: the model it scored (model.pt's
digest), the last round of metrics.jsonl and the benchmark (`check_made_from`).
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.reading import parse_json
from pipeline.config import TrainConfig
from pipeline.data.records import MANIFEST, Manifest, read_manifest
from pipeline.data.shards import data_digest
from pipeline.run import files as rf
from pipeline.run.derived import check_made_from
from pipeline.run.resolve import from_values

METRICS = {  # column stem → eval.json key
    "train": "train_accuracy",
    "local": "local_accuracy",
    "global": "global_accuracy",
    "final_local": "final_local_accuracy",
    "final_global": "final_global_accuracy",
    "max_global": "max_global_accuracy",
    "purity": "concept_purity",
    "label_purity": "label_purity",
    "ari": "concept_ari",
    "nmi": "concept_nmi",
    "local_std": "final_local_accuracy_std",
    "local_worst10": "final_local_accuracy_worst10",
    "unlabeled_global": "final_unlabeled_global_accuracy",
}
# absent from eval.json files older than them (or, unlabeled, from runs scored without it)
OPTIONAL = ("ari", "nmi", "local_std", "local_worst10", "unlabeled_global")
SHARES = ("purity", "label_purity", "ari", "nmi")  # in [0, 1] (ARI may go below 0), not accuracies
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
    log: list[dict[str, Any]] = field(repr=False)  # metrics.jsonl, a row a round
    model_digest: str = ""  # of the model.pt that eval.json scored (checked when read)

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    def curve(self, key: str) -> dict[int, float]:
        """Evaluated round → the logged `key` (e.g. global_accuracy)."""
        return {r["round"]: r[key] for r in self.log if key in r}

    def mean_of(self, key: str) -> float | None:
        """The mean of `key` over the rounds that logged it (seconds, bytes), or None."""
        values = [r[key] for r in self.log if key in r]
        return sum(values) / len(values) if values else None


def find_runs(patterns: list[str]) -> list[Path]:
    """Run folders (with config.json and metrics.jsonl) named by globs, folders or root
    folders; a folder reached by two patterns is refused (it would count twice)."""
    found: dict[Path, str] = {}
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = [Path(p) for p in sorted(glob.glob(pattern))]
        else:
            matches = [Path(pattern)]
            if not matches[0].exists():
                raise FedrcError(f"{pattern}: no such file or folder")
        for path in matches:
            if is_run(path):
                runs = [path]
            elif path.is_dir():
                runs = sorted(p.parent for p in path.rglob(rf.METRICS) if is_run(p.parent))
            else:
                runs = []
            for run in runs:
                key = run.resolve()
                if key in found:
                    raise FedrcError(
                        f"{run}: given twice (by {found[key]} and by {pattern}); each run "
                        "counts once: name it once"
                    )
                found[key] = pattern
    if not found:
        raise FedrcError(
            f"{', '.join(patterns)}: no run folders found (a run folder holds the config.json "
            "and metrics.jsonl of `fedrc train`)"
        )
    return list(found)


def is_run(path: Path) -> bool:
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


def _share(value: Any, low: float = 0) -> bool:
    """An accuracy or a purity: a number in [low, 1] (NaN is not), or absent (None)."""
    return value is None or (_number(value) and low <= value <= 1)


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
        low = -1 if stem == "ari" else 0  # the ARI of a clustering worse than chance
        _require(path, key, value, _share(value, low), f"a number in [{low}, 1]")
    for key in ("global_accuracy_by_concept", "final_global_accuracy_by_concept"):
        by = result.get(key, {})
        ok = isinstance(by, dict) and all(_number(v) and _share(v) for v in by.values())
        _require(path, key, by, ok, "numbers in [0, 1] by concept")
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
    for key in (*means, "mean_concept_ari"):  # the ARI is absent from older files
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
    last = max(r["round"] for r in rows)
    model = check_made_from(path, result, config["data_digest"], last)
    return Run(path, config, result, last, rows, model)


def run_settings(run: Run) -> TrainConfig:
    values = {k: v for k, v in run.config.items() if k != "data_digest"}
    return from_values(values, str(run.path / rf.CONFIG))


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
