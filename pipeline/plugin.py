"""What a plugin imports: one module for an algorithm, a model or a dataset of your own.

    from pipeline.plugin import Algorithm, LocalTask, Settings, require, setting

Everything a plugin needs is named here, and these names stay where they are when fedrc's
internals move; docs/plugins.md walks through a plugin package that imports only from here and
names every export. A mixture built on FedEM also finds FedRC's variants here, each a settings
dataclass with a step part and/or an algorithm part to list among its bases: the Adam E-step
(`EStepSettings`, `AdamEStep`), adaptive K (`AdaptiveKSettings`, `AdaptiveKStep`,
`AdaptiveK`), hard training (`HardTrainSettings`, `HardTrainStep`), table noise
(`TableNoiseSettings`, `TableNoise`) and the shared body (`SharedBodySettings`, `SharedBody`).
"""

from __future__ import annotations

from pipeline.algorithms.adam_estep import AdamEStep
from pipeline.algorithms.adaptive_k import AdaptiveK, AdaptiveKStep
from pipeline.algorithms.base import Algorithm, HardClustering
from pipeline.algorithms.client import (
    ClientStep,
    Upload,
    hard_gamma,
    lowest_loss,
    mean_omega,
    one_hot,
    per_sample_losses,
    soft_tasks,
)
from pipeline.algorithms.fedem import FedEM, FedEMStep
from pipeline.algorithms.hard_train import HardTrainStep
from pipeline.algorithms.settings import (
    AdaptiveKSettings,
    EStepSettings,
    HardTrainSettings,
    SharedBodySettings,
    TableNoiseSettings,
)
from pipeline.algorithms.shared_body import SharedBody
from pipeline.algorithms.table_noise import TableNoise
from pipeline.common.errors import FedrcError
from pipeline.common.settings import Settings, positive, require, setting
from pipeline.data.loaders import DatasetSpec, RawDataset
from pipeline.engine.rows import RowStore
from pipeline.engine.task import LocalResult, LocalTask, Stage
from pipeline.models import ModelSpec

__all__ = [
    "AdamEStep",
    "AdaptiveK",
    "AdaptiveKSettings",
    "AdaptiveKStep",
    "Algorithm",
    "ClientStep",
    "DatasetSpec",
    "EStepSettings",
    "FedEM",
    "FedEMStep",
    "FedrcError",
    "HardClustering",
    "HardTrainSettings",
    "HardTrainStep",
    "LocalResult",
    "LocalTask",
    "ModelSpec",
    "RawDataset",
    "RowStore",
    "Settings",
    "SharedBody",
    "SharedBodySettings",
    "Stage",
    "TableNoise",
    "TableNoiseSettings",
    "Upload",
    "hard_gamma",
    "lowest_loss",
    "mean_omega",
    "one_hot",
    "per_sample_losses",
    "positive",
    "require",
    "setting",
    "soft_tasks",
]
