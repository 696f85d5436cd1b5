"""One module per algorithm, all with the verbs of `base.Algorithm`."""

from __future__ import annotations

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.cam import IFCACAM, FeSEMCAM
from pipeline.algorithms.cfl import CFL
from pipeline.algorithms.fedavg import FedAvg
from pipeline.algorithms.fedem import FedEM
from pipeline.algorithms.fedprox import FedProx
from pipeline.algorithms.fedrc import FedRC
from pipeline.algorithms.fedsoft import FedSoft
from pipeline.algorithms.fesem import FeSEM
from pipeline.algorithms.ifca import IFCA
from pipeline.config import TrainConfig

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, IFCA, CFL, FeSEM, FedEM, FedSoft, FedRC, IFCACAM, FeSEMCAM)
}


def build_algorithm(
    config: TrainConfig,
    num_clients: int,
    num_classes: int,
    head: tuple[int, int] | None = None,
) -> Algorithm:
    """`head`: where the final layer sits in a flat model (`models.layout.head_range`), for the
    variants that treat it apart (FedRC's shared body)."""
    return REGISTRY[config.algorithm](config.num_models, num_clients, num_classes, config, head)


__all__ = ["REGISTRY", "Algorithm", "build_algorithm"]
