"""A paper's published numbers, and whether a benchmark is the one they were measured on.

The numbers are shown beside a report's rows only on that paper's benchmark, decided from the
benchmark's manifest (dataset, clients, shifts, label split, concepts, no drift) and each
group's training (model, K): beside another benchmark they would invite a comparison that
means nothing. `fedrc report --paper show` puts them beside a reduced-scale reproduction
anyway, with a line saying how the benchmark differs; `--paper hide` leaves them out.
"""

from __future__ import annotations

from typing import Any

from pipeline.data.records import Manifest

# Guo et al., "Tackling Diverse Distribution Shifts Challenge in Federated Learning by Robust
# Clustering" (FedRC), ICML 2024, Table 1, FashionMNIST (CNN) columns: 300 clients, K = 3, mean
# local / global test accuracy (%) ± std at the round with the best train accuracy; FedRC-FT
# after fine-tuning. (label → ((local, ±), (global, ±)))
PAPER_TABLE1_FMNIST: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "FedAvg": ((42.12, 0.33), (34.35, 0.92)),
    "IFCA": ((47.90, 0.60), (31.30, 2.69)),
    "CFL(3)": ((41.77, 0.40), (33.53, 0.35)),
    "FeSEM": ((60.99, 1.01), (47.63, 0.99)),
    "FedEM": ((56.64, 2.14), (28.08, 0.92)),
    "FedRC": ((66.51, 2.39), (59.00, 4.91)),
    "CFL": ((42.47, 0.02), (32.37, 0.09)),
    "FedSoft": ((91.35, 0.04), (19.88, 0.50)),
    "FedRC-FT": ((91.02, 0.26), (62.37, 1.09)),
}
PAPER_SOURCE = "Guo et al., ICML 2024, Table 1 (FashionMNIST, CNN, 300 clients, K = 3)"
# the partition settings of Table 1's benchmark (docs/protocol.md §4), as a manifest records them
PAPER_BENCHMARK: dict[str, Any] = {
    "dataset": "fmnist",
    "clients": 300,
    "shifts": ["label", "feature", "concept"],
    "label_split": "sequential_dirichlet",
    "alpha": 1.0,
    "concepts": ["identity", "reverse", "shift"],
}
PAPER_TRAINING = {"model": "cnn", "clusters": 3}


def benchmark_differences(manifest: Manifest) -> list[str]:
    """How the benchmark differs from Table 1's ("clients 40, not 300"); [] when it is it."""
    found = {**manifest.config, "dataset": manifest.dataset}
    differ = [
        f"{key} {_shown(found.get(key))}, not {_shown(value)}"
        for key, value in PAPER_BENCHMARK.items()
        if _normal(found.get(key)) != _normal(value)
    ]
    if manifest.time_steps > 1:
        differ.append(f"{manifest.time_steps} time steps (drift), not 1")
    return differ


def training_differences(config: dict[str, Any]) -> list[str]:
    """How a group's training differs from Table 1's (model, K)."""
    return [
        f"{key} {config.get(key)}, not {value}"
        for key, value in PAPER_TRAINING.items()
        if config.get(key) != value
    ]


def _normal(value: Any) -> Any:
    return sorted(value) if isinstance(value, list) else value


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def paper_numbers(label: str) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Table 1's ((local, ±), (global, ±)) of a row label, or None."""
    return PAPER_TABLE1_FMNIST.get(label)
