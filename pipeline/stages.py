"""The four stage functions the CLI calls. Each reads only the previous stage's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import run_files as rf
from pipeline.config import EvalConfig, PartitionConfig, PlotConfig, TrainConfig
from pipeline.data.benchmark import write_benchmark
from pipeline.data.loaders import load_dataset
from pipeline.data.shards import data_digest, load_federated, read_manifest
from pipeline.engine import SequentialExecutor
from pipeline.errors import FedrcError
from pipeline.evaluate import all_logits, concept_purity, score_clients, summarize
from pipeline.io import write_json
from pipeline.models import build_model
from pipeline.training import resolve_device, run_training

__all__ = ["eval_stage", "partition_stage", "plot_stage", "run_training", "train_stage"]


def partition_stage(config: PartitionConfig) -> dict[str, Any]:
    """Build the benchmark and write it to `config.out` in one atomic step; returns the manifest."""
    return write_benchmark(config, load_dataset(config.dataset, config.data_root))


def train_stage(config: TrainConfig, **kwargs: Any) -> Path:
    return run_training(config, **kwargs)


def run_config(run: Path) -> TrainConfig:
    path = run / rf.CONFIG
    if not path.is_file():
        raise FedrcError(f"--run: {path} not found (is {run} a `fedrc train` output?)")
    try:
        values = json.loads(path.read_text())
        values.pop("data_digest", None)
        return TrainConfig(**values)
    except (json.JSONDecodeError, TypeError) as e:
        raise FedrcError(f"{path}: not a fedrc run configuration ({e})") from None


def _at(row: dict[str, Any], prefix: str) -> dict[str, Any]:
    keys = ("train_accuracy", "local_accuracy", "global_accuracy", "global_accuracy_by_concept")
    return {k: row[prefix + k] for k in keys}


def eval_stage(config: EvalConfig) -> dict[str, Any]:
    """eval.json: accuracies at the best-train round and the last round, purity; per client."""
    run = Path(config.run)
    train_config = run_config(run)
    final = rf.load_state(run / rf.MODEL)
    data = load_federated(Path(train_config.data))
    if json.loads(final["identity"])["data_digest"] != data_digest(data.manifest):
        raise FedrcError(f"--run: {run} was trained on other data than {train_config.data}")
    prefix = "hard_" if config.hard else ""
    evaluated = [r for r in rf.read_metrics(run / rf.METRICS) if "train_accuracy" in r]
    if not evaluated:
        raise FedrcError(f"{run / rf.METRICS}: no evaluated round")
    best = max(evaluated, key=lambda r: r[prefix + "train_accuracy"])
    top = max(evaluated, key=lambda r: r[prefix + "global_accuracy"])

    # Score the final models afresh: the numbers a user gets from model.pt, not from the log.
    device = resolve_device("auto")
    shape = tuple(data.manifest["image_shape"])
    executor = SequentialExecutor(
        build_model(shape, data.num_classes),
        device,
        lr=1.0,
        momentum=0.0,
        weight_decay=0.0,
        batch_size=1,
        local_epochs=1,
        drop_last=False,
    )
    data = data.to(device)
    logits = all_logits(executor, final["models"].to(device), data)
    scores = score_clients(logits, data, final["omega"], hard=config.hard)
    final_summary = summarize(data, scores)

    part = np.asarray(data.participating)
    omega = final["omega"].numpy()
    concepts = np.asarray([c["concept"] for c in data.clients])
    sizes = np.asarray([c["train_size"] for c in data.clients], dtype=float)
    result = {
        "algorithm": train_config.algorithm,
        "prediction": "hard" if config.hard else "soft",
        "best_round": best["round"],
        **_at(best, prefix),
        "final_round": final["round"],
        **{f"final_{k}": v for k, v in final_summary.items()},
        "max_global_accuracy": top[prefix + "global_accuracy"],
        "max_global_round": top["round"],
        "concept_purity": concept_purity(omega[part], concepts[part], sizes[part]),
    }
    clients = [
        {
            **{k: c[k] for k in ("client_id", "participating", "concept", "style", "severity")},
            "train_accuracy": s["train"],
            "test_accuracy": s["test"],
            "omega": [round(float(w), 6) for w in omega[i]],
        }
        for i, (c, s) in enumerate(zip(data.clients, scores))
    ]
    write_json(run / "eval.json", result)
    write_json(run / "eval_clients.json", clients)
    return result


def plot_stage(config: PlotConfig) -> list[Path]:
    from pipeline.plots import draw_all  # matplotlib is imported only when plotting

    run = Path(config.run)
    train_config = run_config(run)
    manifest = read_manifest(Path(train_config.data))
    metrics = rf.read_metrics(run / rf.METRICS)
    assignments = rf.read_assignments(run / rf.ASSIGNMENTS)
    return draw_all(run / "plots", metrics, assignments, manifest, config.dpi)
