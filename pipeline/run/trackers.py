"""The per-round numbers in the trackers researchers read: TensorBoard, Weights & Biases and
MLflow (`fedrc train --log tensorboard,wandb,mlflow`, several at once; each an optional extra).

Every tracker gets each metrics.jsonl row as it is written, at the row's round: its numbers, a
mapping such as `global_accuracy_by_concept` as `global_accuracy_by_concept/<concept>`; and the
run's configuration (config.json) once. A resumed run opens a new tracker run and first replays
the rows its metrics.jsonl kept, so the newest tracker run holds every round once, as
DVCLive's folder does (`pipeline.run.live`).

- `tensorboard`: event files in `<run>/tensorboard/`, written afresh (`tensorboard --logdir
  runs`); the configuration as the text entry `config`.
- `wandb`: a W&B run in `<run>/wandb/`, project `fedrc` (or $WANDB_PROJECT), named after the run
  folder, the configuration as its config; offline with WANDB_MODE=offline (`wandb sync` later).
- `mlflow`: an MLflow run named after the run folder, in experiment `fedrc` (or
  $MLFLOW_EXPERIMENT_NAME) of MLflow's tracking store ($MLFLOW_TRACKING_URI, else MLflow's
  default), the configuration flattened into its params.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from pipeline.common.errors import FedrcError

# name (`TrainConfig.log`) → (the module it needs, the extra that installs it)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
FOLDERS = ("tensorboard", "wandb")  # what the trackers write in a run folder
PROJECT = "fedrc"  # W&B project and MLflow experiment, unless the environment names another


class Tracker(Protocol):
    def __call__(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def numbers(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A metrics row's numbers by name (nested mappings joined with '/'), without `round`."""
    found: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(numbers(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and name != "round":
            found[name] = float(value)
    return found


def flat_config(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The configuration as `key` or `component/key` → its value as text (MLflow params)."""
    found: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            found.update(flat_config(value, f"{prefix}{key}/"))
        else:
            found[f"{prefix}{key}"] = json.dumps(value) if not isinstance(value, str) else value
    return found


def require_trackers(names: list[str]) -> None:
    """Each named tracker's package is installed: else one line naming its extra, before the
    run folder is touched."""
    for name in names:
        module, extra = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise FedrcError(
                f"--log {name}: {module} is not installed; pip install 'fedrc[{extra}]'"
            )


class TensorBoard:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        shutil.rmtree(out / "tensorboard", ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        text = json.dumps(config, indent=2, sort_keys=True)
        self.writer.add_text("config", f"```json\n{text}\n```", 0)

    def __call__(self, row: dict[str, Any]) -> None:
        for name, value in numbers(row).items():
            self.writer.add_scalar(name, value, row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            dir=str(out),
            name=out.resolve().name,
            config=config,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def __call__(self, row: dict[str, Any]) -> None:
        self.run.log(numbers(row), step=row["round"])

    def close(self) -> None:
        self.run.finish()


class MLflow:
    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=out.resolve().name).info.run_id
        params = [Param(k, v) for k, v in sorted(flat_config(config).items())]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def __call__(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, row["round"]) for k, v in numbers(row).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


OPENERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


def open_trackers(
    names: list[str], out: Path, config: dict[str, Any], history: list[dict[str, Any]]
) -> list[Tracker]:
    """The trackers `names`, each given the configuration and then the rows in `history`."""
    trackers: list[Tracker] = [OPENERS[name](out, config) for name in names]
    for row in history:
        for tracker in trackers:
            tracker(row)
    return trackers
