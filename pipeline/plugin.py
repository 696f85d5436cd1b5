"""What a plugin imports: one module for an algorithm, a model or a dataset of your own.

    from pipeline.plugin import Algorithm, LocalTask, Settings, require, setting

Everything a plugin needs is named here, and these names stay where they are when fedrc's
internals move; docs/plugins.md walks through a plugin package that imports only from here and
names every export. Every built-in algorithm is here as a base to build on, with its client
part where it has one (`FedAvg` and `FedAvgStep`, `IFCA` and `IFCAStep`, …): a subclass that
overrides only server-side verbs (`aggregate`, `end_round`) keeps its parent's client part in
one process, under torchrun and on Flower. A mixture built on FedEM also finds FedRC's variants
here, each a settings dataclass with a step part and/or an algorithm part to list among its
bases: the Adam E-step (`EStepSettings`, `AdamEStep`), adaptive K (`AdaptiveKSettings`,
`AdaptiveKStep`, `AdaptiveK`), hard training (`HardTrainSettings`, `HardTrainStep`), table
noise (`TableNoiseSettings`, `TableNoise`) and the shared body (`SharedBodySettings`,
`SharedBody`).
"""

from __future__ import annotations

from pipeline.algorithms.adam_estep import AdamEStep
from pipeline.algorithms.adaptive_fedavg import AdaptiveFedAvg
from pipeline.algorithms.adaptive_k import AdaptiveK, AdaptiveKStep
from pipeline.algorithms.apfl import APFL, APFLRule
from pipeline.algorithms.base import Algorithm, HardClustering
from pipeline.algorithms.cam import IFCACAM, FeSEMCAM
from pipeline.algorithms.cfl import CFL, CFLStep
from pipeline.algorithms.cflgp import CFLGP, CFLGPStep
from pipeline.algorithms.client import (
    ClientOutcome,
    ClientStep,
    ClusterStep,
    HardStep,
    Memory,
    Rows,
    Upload,
    hard_gamma,
    lowest_loss,
    mean_omega,
    one_hot,
    per_sample_losses,
    soft_tasks,
)
from pipeline.algorithms.fedavg import FedAvg, FedAvgStep
from pipeline.algorithms.fedccfa import FedCCFA
from pipeline.algorithms.feddaa import FedDAA
from pipeline.algorithms.feddrift import FedDrift, FedDriftEager, FedDriftStep
from pipeline.algorithms.fedem import FedEM, FedEMStep
from pipeline.algorithms.fedgwc import FedGWC, FedGWCStep
from pipeline.algorithms.fedprox import FedProx, FedProxStep
from pipeline.algorithms.fedrc import FedRC, FedRCStep
from pipeline.algorithms.fedsoft import FedSoft
from pipeline.algorithms.fesem import FeSEM
from pipeline.algorithms.flash import Flash, FlashStep
from pipeline.algorithms.floco import Floco, FlocoRule, SimplexLinear
from pipeline.algorithms.flux import FLUX
from pipeline.algorithms.hard_train import HardTrainStep
from pipeline.algorithms.ifca import IFCA, IFCAStep
from pipeline.algorithms.pacfl import PACFL
from pipeline.algorithms.personal import PersonalModels
from pipeline.algorithms.pfedme import PFedMe, PFedMeRule
from pipeline.algorithms.settings import (
    AdaptiveKSettings,
    EStepSettings,
    HardTrainSettings,
    SharedBodySettings,
    TableNoiseSettings,
)
from pipeline.algorithms.shared_body import SharedBody
from pipeline.algorithms.stocfl import StoCFL, StoCFLStep
from pipeline.algorithms.table_noise import TableNoise
from pipeline.common.errors import FedrcError
from pipeline.common.settings import Settings, positive, require, setting
from pipeline.data.loaders import DatasetSpec, RawDataset
from pipeline.engine.rows import RowStore
from pipeline.engine.rules import LocalRule, Net, StepLosses
from pipeline.engine.task import LocalResult, LocalTask, Stage
from pipeline.models import ModelSpec

__all__ = [
    "APFL",
    "CFL",
    "CFLGP",
    "FLUX",
    "IFCA",
    "IFCACAM",
    "PACFL",
    "APFLRule",
    "AdamEStep",
    "AdaptiveFedAvg",
    "AdaptiveK",
    "AdaptiveKSettings",
    "AdaptiveKStep",
    "Algorithm",
    "CFLGPStep",
    "CFLStep",
    "ClientOutcome",
    "ClientStep",
    "ClusterStep",
    "DatasetSpec",
    "EStepSettings",
    "FeSEM",
    "FeSEMCAM",
    "FedAvg",
    "FedAvgStep",
    "FedCCFA",
    "FedDAA",
    "FedDrift",
    "FedDriftEager",
    "FedDriftStep",
    "FedEM",
    "FedEMStep",
    "FedGWC",
    "FedGWCStep",
    "FedProx",
    "FedProxStep",
    "FedRC",
    "FedRCStep",
    "FedSoft",
    "FedrcError",
    "Flash",
    "FlashStep",
    "Floco",
    "FlocoRule",
    "HardClustering",
    "HardStep",
    "HardTrainSettings",
    "HardTrainStep",
    "IFCAStep",
    "LocalResult",
    "LocalRule",
    "LocalTask",
    "Memory",
    "ModelSpec",
    "Net",
    "PFedMe",
    "PFedMeRule",
    "PersonalModels",
    "RawDataset",
    "RowStore",
    "Rows",
    "Settings",
    "SharedBody",
    "SharedBodySettings",
    "SimplexLinear",
    "Stage",
    "StepLosses",
    "StoCFL",
    "StoCFLStep",
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
