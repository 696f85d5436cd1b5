"""The Flower app folder that `fedrc flower app` writes: a pyproject.toml naming fedrc's
ServerApp and ClientApp, with the run's resolved `train:` configuration in its run config, so
that `flwr run` trains what `fedrc train` would with the same params.yaml."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.algorithms import ALGORITHMS
from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_file
from pipeline.config import TrainConfig, config_dict

ON_NODE_LOSS = ("continue", "stop")


@dataclass(frozen=True)
class Deployment:
    """How the server treats its nodes (run config keys `fedrc-wait`, `fedrc-timeout`,
    `fedrc-on-node-loss`)."""

    wait: float = 300.0  # seconds to wait at the start for nodes holding every client
    timeout: float = 600.0  # seconds a node may take to answer one request
    on_node_loss: str = "continue"  # a node lost in local training: finish without it, or stop

    def __post_init__(self) -> None:
        if not (0 <= self.wait < math.inf and 0 < self.timeout < math.inf):
            raise FedrcError("fedrc-wait must be >= 0 and fedrc-timeout > 0 (finite seconds)")
        if self.on_node_loss not in ON_NODE_LOSS:
            raise FedrcError(
                f"fedrc-on-node-loss: expected one of {ON_NODE_LOSS}, got {self.on_node_loss!r}"
            )


def check_config(config: TrainConfig) -> None:
    """What `fedrc train` allows but a deployment cannot do."""
    if config.persistent_momentum:
        raise FedrcError(
            "persistent_momentum: not available on Flower (each client's momentum would have "
            "to stay on its node); set train.persistent_momentum: false"
        )
    cls = ALGORITHMS.get(config.algorithm)
    if cls.own_training:
        raise FedrcError(
            f"train.algorithm: {config.algorithm} {cls.local_training}, which the Flower "
            "messages do not carry yet; run it with fedrc train or torchrun"
        )
    if ALGORITHMS.get(config.algorithm).describes:
        raise FedrcError(
            f"train.algorithm: {config.algorithm} asks clients for a statistic of their data, "
            "which the nodes do not compute yet; run it with fedrc train or torchrun"
        )


def run_settings(values: Mapping[str, Any]) -> tuple[Deployment, bool, bool]:
    """The deployment, resume and overwrite from a run config (`--run-config` may override
    any key with any TOML value, so each is checked)."""

    def seconds(key: str, default: float) -> float:
        value = values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FedrcError(f"{key}: expected a number of seconds, got {value!r}")
        return float(value)

    def flag(key: str) -> bool:
        value = values.get(key, False)
        if not isinstance(value, bool):
            raise FedrcError(f"{key}: expected true or false, got {value!r}")
        return value

    deployment = Deployment(
        wait=seconds("fedrc-wait", Deployment.wait),
        timeout=seconds("fedrc-timeout", Deployment.timeout),
        on_node_loss=str(values.get("fedrc-on-node-loss", Deployment.on_node_loss)),
    )
    return deployment, flag("fedrc-resume"), flag("fedrc-overwrite")


def train_config_from_json(text: str) -> TrainConfig:
    from pipeline.run.resolve import from_values  # torch, which `fedrc flower app --help` skips

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
