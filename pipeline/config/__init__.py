"""One typed dataclass per params.yaml section and how a stage builds its configuration from
them: `sections` (train, eval, plot), the data's `partition` section, and `params` (reading the
file, layering defaults < params.yaml < options). The names a stage needs, in one place.
"""

from pipeline.common.settings import config_dict
from pipeline.config.params import (
    SECTIONS,
    build_config,
    checked_values,
    mapping,
    read_params,
    refuse_unusable,
    section,
)
from pipeline.config.sections import (
    DEVICES,
    EXECUTORS,
    PRECISIONS,
    PROFILES,
    RESUMABLE,
    EvalConfig,
    PlotConfig,
    TrainConfig,
)
from pipeline.data.partition_config import LABEL_SPLITS, SHIFTS, PartitionConfig

__all__ = [
    "DEVICES",
    "EXECUTORS",
    "LABEL_SPLITS",
    "PRECISIONS",
    "PROFILES",
    "RESUMABLE",
    "SECTIONS",
    "SHIFTS",
    "EvalConfig",
    "PartitionConfig",
    "PlotConfig",
    "TrainConfig",
    "build_config",
    "checked_values",
    "config_dict",
    "mapping",
    "read_params",
    "refuse_unusable",
    "section",
]
