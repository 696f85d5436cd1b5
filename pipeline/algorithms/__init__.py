"""One module per algorithm, all with the verbs of `base.Algorithm`; `ALGORITHMS` finds them by
name, built-in (in the order of the FedRC paper's Table 1, then Fed-CAM) or from a plugin.

Each built-in algorithm has a card here: its name, title, paper and settings (`settings.py`),
which `fedrc info` reads without importing torch, and the class it describes, imported when a
run uses it. The class takes the card's fields with `@described(name)`, so they are written
once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.algorithms import settings as own
from pipeline.common.registry import Registry
from pipeline.common.settings import Settings
from pipeline.config import TrainConfig

if TYPE_CHECKING:
    from pipeline.algorithms.base import Algorithm

A = TypeVar("A", bound=type)


@dataclass(frozen=True)
class AlgorithmCard:
    """A built-in algorithm as `fedrc info` shows it, and where its class is."""

    name: str  # the registry name, as in `--algorithm`
    title: str  # as printed in reports and figures
    paper: str  # the citation `fedrc info` shows
    Settings: type[Settings]  # the algorithm's own options
    target: str  # its class, `module:Class` in this package

    def load(self) -> type[Algorithm]:
        module, _, attribute = self.target.partition(":")
        cls: type[Algorithm] = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
        return cls


CAM_PAPER = "Ma et al., NeurIPS 2023"
FEDDRIFT_PAPER = "Jothimurugesan et al., AISTATS 2023"
BUILT_IN: dict[str, AlgorithmCard] = {
    card.name: card
    for card in (
        AlgorithmCard(
            "fedavg", "FedAvg", "McMahan et al., AISTATS 2017", Settings, "fedavg:FedAvg"
        ),
        AlgorithmCard(
            "fedprox", "FedProx", "Li et al., MLSys 2020", own.ProximalSettings, "fedprox:FedProx"
        ),
        AlgorithmCard(
            "ifca", "IFCA", "Ghosh et al., NeurIPS 2020", own.ZeroEmptySettings, "ifca:IFCA"
        ),
        AlgorithmCard("cfl", "CFL", "Sattler et al., IEEE TNNLS 2021", own.CFLSettings, "cfl:CFL"),
        AlgorithmCard(
            "fesem", "FeSEM", "Long et al., World Wide Web 2023", own.FeSEMSettings, "fesem:FeSEM"
        ),
        AlgorithmCard(
            "fedem", "FedEM", "Marfoq et al., NeurIPS 2021", own.EStepSettings, "fedem:FedEM"
        ),
        AlgorithmCard(
            "fedsoft",
            "FedSoft",
            "Ruan & Joe-Wong, AAAI 2022",
            own.FedSoftSettings,
            "fedsoft:FedSoft",
        ),
        AlgorithmCard("fedrc", "FedRC", "Guo et al., ICML 2024", own.FedRCSettings, "fedrc:FedRC"),
        AlgorithmCard("ifca-cam", "IFCA-CAM", CAM_PAPER, own.CAMSettings, "cam:IFCACAM"),
        AlgorithmCard("fesem-cam", "FeSEM-CAM", CAM_PAPER, own.FeSEMCAMSettings, "cam:FeSEMCAM"),
        # the clustered-FL methods of 2023-2025
        AlgorithmCard(
            "pacfl", "PACFL", "Vahidian et al., AAAI 2023", own.PACFLSettings, "pacfl:PACFL"
        ),
        AlgorithmCard(
            "cfl-gp", "CFL-GP", "Kim, Kim & de Veciana, ICML 2024", own.CFLGPSettings, "cflgp:CFLGP"
        ),
        AlgorithmCard(
            "stocfl",
            "StoCFL",
            "Zeng et al., arXiv:2303.00897, 2023",
            own.StoCFLSettings,
            "stocfl:StoCFL",
        ),
        AlgorithmCard(
            "feddrift", "FedDrift", FEDDRIFT_PAPER, own.FedDriftSettings, "feddrift:FedDrift"
        ),
        AlgorithmCard(
            "feddrift-eager",
            "FedDrift-Eager",
            FEDDRIFT_PAPER,
            own.FedDriftEagerSettings,
            "feddrift:FedDriftEager",
        ),
        AlgorithmCard(
            "flux", "FLUX", "Fenoglio et al., NeurIPS 2025", own.FLUXSettings, "flux:FLUX"
        ),
        AlgorithmCard(
            "fedccfa",
            "FedCCFA",
            "Chen et al., NeurIPS 2024",
            own.FedCCFASettings,
            "fedccfa:FedCCFA",
        ),
        # the personalized baselines of FLUX's comparison (NeurIPS 2020)
        AlgorithmCard(
            "apfl",
            "APFL",
            "Deng, Kamani & Mahdavi, arXiv:2003.13461, 2020",
            own.APFLSettings,
            "apfl:APFL",
        ),
        AlgorithmCard(
            "pfedme",
            "pFedMe",
            "Dinh, Tran & Nguyen, NeurIPS 2020",
            own.PFedMeSettings,
            "pfedme:PFedMe",
        ),
        # clustering by the clients' losses (ICML 2025)
        AlgorithmCard(
            "fedgwc",
            "FedGWC",
            "Licciardi, Leo, Fanì, Caputo & Ciccone, ICML 2025",
            own.FedGWCSettings,
            "fedgwc:FedGWC",
        ),
        # dynamic clustering that tells real drift apart from P(x) and P(y) drift (2025)
        AlgorithmCard(
            "feddaa",
            "FedDAA",
            "Peng & Tang, arXiv:2506.21054, 2025",
            own.FedDAASettings,
            "feddaa:FedDAA",
        ),
        # regions of a shared solution simplex (NeurIPS 2024)
        AlgorithmCard(
            "floco",
            "Floco",
            "Grinwald, Wiesner & Nakajima, NeurIPS 2024",
            own.FlocoSettings,
            "floco:Floco",
        ),
        # drift-adaptive learning rates and server optimizers (issue 43)
        AlgorithmCard(
            "adaptive-fedavg",
            "Adaptive-FedAvg",
            "Canonaco et al., IJCNN 2021",
            own.AdaptiveFedAvgSettings,
            "adaptive_fedavg:AdaptiveFedAvg",
        ),
        AlgorithmCard(
            "flash", "Flash", "Panchal et al., ICML 2023", own.FlashSettings, "flash:Flash"
        ),
    )
}


def described(name: str) -> Callable[[A], A]:
    """Decorate a built-in algorithm's class: its `name`, `title`, `paper` and `Settings` are
    its card's."""
    card = BUILT_IN[name]

    def describe(cls: A) -> A:
        cls.name, cls.title, cls.paper = card.name, card.title, card.paper
        cls.Settings = card.Settings
        return cls

    return describe


def _not_an_algorithm(obj: Any) -> str | None:
    from pipeline.algorithms.base import Algorithm  # torch: only a plugin is checked

    if isinstance(obj, type) and issubclass(obj, Algorithm):
        missing = [a for a in ("name", "title", "paper") if not hasattr(obj, a)]
        return f"{obj.__name__} lacks {', '.join(missing)}" if missing else None
    return f"{obj!r} is not a subclass of pipeline.plugin.Algorithm"


ALGORITHMS = Registry(
    "algorithm", "--algorithm", lambda: BUILT_IN, _not_an_algorithm, AlgorithmCard.load
)


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


__all__ = ["ALGORITHMS", "BUILT_IN", "AlgorithmCard", "build_algorithm", "described", "num_models"]
