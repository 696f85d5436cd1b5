"""The Flower app folder that `fedrc flower app` writes: a pyproject.toml naming fedrc's
ServerApp and ClientApp, with the run's resolved `train:` configuration in its run config, so
that `flwr run` trains what `fedrc train` would with the same params.yaml."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import TrainConfig, config_dict
from pipeline.errors import FedrcError
from pipeline.io import atomic_file
from pipeline.resolve import from_values

ON_NODE_LOSS = ("continue", "stop")


@dataclass(frozen=True)
class Deployment:
    """How the server treats its nodes (run config keys `fedrc-wait`, `fedrc-timeout`,
    `fedrc-on-node-loss`)."""

    wait: float = 300.0  # seconds to wait at the start for nodes holding every client
    timeout: float = 600.0  # seconds a node may take to answer one request
    on_node_loss: str = "continue"  # a node lost in local training: finish without it, or stop

    def __post_init__(self) -> None:
        if self.wait < 0 or self.timeout <= 0:
            raise FedrcError("fedrc-wait must be >= 0 and fedrc-timeout > 0 (seconds)")
        if self.on_node_loss not in ON_NODE_LOSS:
            raise FedrcError(
                f"fedrc-on-node-loss: expected one of {ON_NODE_LOSS}, got {self.on_node_loss!r}"
            )


def train_config_from_json(text: str) -> TrainConfig:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise FedrcError(f"fedrc-train: not JSON ({e})") from None
    return from_values(values, where="fedrc-train")


def pyproject(config: TrainConfig, deployment: Deployment) -> str:
    """The app's pyproject.toml: its components and run config."""
    train = json.dumps(config_dict(config), sort_keys=True)
    return f"""# Written by `fedrc flower app`; start it with `flwr run FOLDER FEDERATION --stream`.
[project]
name = "fedrc-flower-app"
version = "1.0.0"
description = "fedrc {config.algorithm} on Flower's deployment engine"
license = "MIT"
dependencies = []  # fedrc[flower] must be installed where the SuperLink and SuperNodes run

[tool.flwr.app]
publisher = "fedrc"

[tool.flwr.app.components]
serverapp = "pipeline.flower.apps:server_app"
clientapp = "pipeline.flower.apps:client_app"

[tool.flwr.app.config]
fedrc-train = {json.dumps(train)}
fedrc-resume = false
fedrc-overwrite = false
fedrc-wait = {deployment.wait}
fedrc-timeout = {deployment.timeout}
fedrc-on-node-loss = "{deployment.on_node_loss}"
"""


def write_app(folder: Path, config: TrainConfig, deployment: Deployment) -> Path:
    path = folder / "pyproject.toml"
    with atomic_file(path) as tmp:  # an app folder's old pyproject.toml stays whole on error
        tmp.write_text(pyproject(config, deployment))
    return path
