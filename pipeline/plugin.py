"""What a plugin imports: one module for an algorithm, a model or a dataset of your own.

    from pipeline.plugin import Algorithm, LocalTask, Settings, require, setting

Everything a plugin needs is named here, and these names stay where they are when fedrc's
internals move; docs/plugins.md walks through a plugin package that imports only from here.
"""

from __future__ import annotations

from pipeline.algorithms.base import Algorithm, HardClustering
from pipeline.algorithms.client import (
    ClientStep,
    hard_gamma,
    lowest_loss,
    mean_omega,
    one_hot,
    per_sample_losses,
    soft_tasks,
)
from pipeline.algorithms.fedem import FedEM, FedEMStep
from pipeline.data.loaders import DatasetSpec, RawDataset
from pipeline.engine.rows import RowStore
from pipeline.engine.task import LocalResult, LocalTask, Stage
from pipeline.errors import FedrcError
from pipeline.models import ModelSpec
from pipeline.settings import Settings, positive, require, setting

__all__ = [
    "Algorithm",
    "ClientStep",
    "DatasetSpec",
    "FedEM",
    "FedEMStep",
    "FedrcError",
    "HardClustering",
    "LocalResult",
    "LocalTask",
    "ModelSpec",
    "RawDataset",
    "RowStore",
    "Settings",
    "Stage",
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
