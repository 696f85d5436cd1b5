"""One module per algorithm, all with the verbs of `base.Algorithm`; `ALGORITHMS` finds them by
name, built-in (in the order of the FedRC paper's Table 1, then Fed-CAM) or from a plugin."""

from __future__ import annotations

from typing import Any

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.cam import IFCACAM, FeSEMCAM
from pipeline.algorithms.cfl import CFL
from pipeline.algorithms.cflgp import CFLGP
from pipeline.algorithms.fedavg import FedAvg
from pipeline.algorithms.fedccfa import FedCCFA
from pipeline.algorithms.feddrift import FedDrift, FedDriftEager
from pipeline.algorithms.fedem import FedEM
from pipeline.algorithms.fedprox import FedProx
from pipeline.algorithms.fedrc import FedRC
from pipeline.algorithms.fedsoft import FedSoft
from pipeline.algorithms.fesem import FeSEM
from pipeline.algorithms.flux import FLUX
from pipeline.algorithms.ifca import IFCA
from pipeline.algorithms.pacfl import PACFL
from pipeline.algorithms.stocfl import StoCFL
from pipeline.config import TrainConfig
from pipeline.plugins import Registry

BUILT_IN: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        *(FedAvg, FedProx, IFCA, CFL, FeSEM, FedEM, FedSoft, FedRC, IFCACAM, FeSEMCAM),
        # the clustered-FL methods of 2023-2025
        PACFL,
        CFLGP,
        StoCFL,
        FedDrift,
        FedDriftEager,
        FLUX,
        FedCCFA,
    )
}


def _not_an_algorithm(obj: Any) -> str | None:
    if isinstance(obj, type) and issubclass(obj, Algorithm):
        missing = [a for a in ("name", "title", "paper") if not hasattr(obj, a)]
        return f"{obj.__name__} lacks {', '.join(missing)}" if missing else None
    return f"{obj!r} is not a subclass of pipeline.algorithms.Algorithm"


ALGORITHMS = Registry("algorithm", "--algorithm", lambda: BUILT_IN, _not_an_algorithm)


def num_models(config: TrainConfig) -> int:
    """K, the number of predictors of a run (FedAvg: 1; CFL: its cap on clusters)."""
    cls = ALGORITHMS.get(config.algorithm)
    settings = config.algorithm_settings
    return cls.count_models(config.clusters, settings if settings is not None else cls.Settings())


def build_algorithm(
    config: TrainConfig,
    num_clients: int,
    num_classes: int,
    head: tuple[int, int] | None = None,
) -> Algorithm:
    """`head`: where the final layer sits in a flat model (`models.layout.head_range`), for the
    variants that treat it apart (FedRC's shared body)."""
    cls = ALGORITHMS.get(config.algorithm)
    return cls(num_models(config), num_clients, num_classes, config, head)


__all__ = ["ALGORITHMS", "BUILT_IN", "Algorithm", "build_algorithm", "num_models"]
