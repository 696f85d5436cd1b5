"""Flower Datasets' partitioners as fedrc's label split (`partition.partitioner`), so that a
benchmark built in Flower can be rebuilt here with every fedrc shift on top.

The partitioner is flwr-datasets' own class (the `partitioners` extra; Flower's name in snake
case, `dirichlet` → `DirichletPartitioner`, or any `module:Name`), given the training pool as a
Hugging Face dataset of its labels (column `label`), the row numbers and the natural-id columns
the source has, shuffled first with the seed as `FederatedDataset(shuffle=True, seed=…)` does.
Its arguments are `partition.partitioner_options`; `num_partitions`, `partition_by` and `seed`
default to `--clients`, `label` and `--seed` where the class takes them. Client i holds
partition i: `FederatedDataset(dataset, partitioners={"train": P(..., seed=S)}, seed=S)
.load_partition(i)` for `--seed S` (tests/flower/test_partitioners.py).
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import numpy as np
import yaml

from pipeline.common.errors import FedrcError

KEY = "partition.partitioner"
ROW = "__fedrc_row__"  # the column that carries each sample's index into the pool
NAME = re.compile(r"[a-z][a-z0-9_]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def parse_options(options: Any) -> dict[str, Any]:
    """`partitioner_options`: a mapping (params.yaml) or `KEY=VALUE,…` (the command line, each
    value read as YAML: 0.3, true, [10, 20])."""
    if options is None:
        return {}
    if isinstance(options, dict):
        return {str(k): v for k, v in options.items()}
    if not isinstance(options, str):
        raise FedrcError(f"{KEY}_options: expected KEY=VALUE,… or a mapping, got {options!r}")
    found = {}
    for item in re.split(r",(?![^\[]*\])", options):  # not the commas inside [..]
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise FedrcError(f"{KEY}_options: expected KEY=VALUE, got {item.strip()!r}")
        try:
            found[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            found[key.strip()] = text.strip()
    return found


def check_partitioner(name: str, options: Any) -> None:
    """The name's form and the options' syntax, without importing Flower."""
    if not NAME.fullmatch(name):
        raise FedrcError(
            f"{KEY}: expected a flwr-datasets partitioner in snake case (dirichlet, "
            f"pathological, …) or module:Name, got {name!r}"
        )
    parse_options(options)


def flower_partitioners() -> list[tuple[str, str, str]]:
    """(name, origin, first docstring line) of each flwr-datasets partitioner, or one row saying
    how to install them: what `fedrc info` lists."""
    from importlib import metadata

    try:
        from flwr_datasets import partitioner as flower
    except ImportError:
        return [("(flwr-datasets)", "not installed", "pip install 'fedrc[partitioners]'")]
    origin = f"flwr-datasets {metadata.version('flwr-datasets')}"
    rows = []
    for attribute in sorted(dir(flower)):
        cls = getattr(flower, attribute)
        if attribute.endswith("Partitioner") and attribute != "Partitioner":
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", attribute[: -len("Partitioner")]).lower()
            rows.append((snake, origin, (cls.__doc__ or "").strip().splitlines()[0]))
    return rows


def partitioner_class(name: str) -> type:
    """flwr-datasets' `<Name>Partitioner` for a snake-case name, else `module:Name`."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except Exception as e:  # an import may raise anything: one line
            raise FedrcError(f"{KEY}: {name} failed to load ({type(e).__name__}: {e})") from None
    try:
        from flwr_datasets import partitioner as flower
    except ImportError:
        raise FedrcError(
            f"{KEY}: {name} needs flwr-datasets; pip install 'fedrc[partitioners]'"
        ) from None
    wanted = "".join(part.capitalize() for part in name.split("_")) + "Partitioner"
    found = getattr(flower, wanted, None)
    if not isinstance(found, type):
        known = ", ".join(row[0] for row in flower_partitioners())
        raise FedrcError(f"{KEY}: flwr-datasets has no {wanted} (known: {known})")
    return found


def flower_split(
    name: str,
    options: Any,
    labels: np.ndarray,
    columns: dict[str, np.ndarray],
    clients: int,
    seed: int,
) -> list[np.ndarray]:
    """Each client's sorted indices into the pool, partition i for client i."""
    import datasets

    cls = partitioner_class(name)
    arguments = parse_options(options)
    accepted = inspect.signature(cls).parameters
    for key, value in (("num_partitions", clients), ("partition_by", "label"), ("seed", seed)):
        if key in accepted and key not in arguments:
            arguments[key] = value
    table = {"label": labels, **columns, ROW: np.arange(labels.size)}
    try:
        partitioner = cls(**arguments)
        partitioner.dataset = datasets.Dataset.from_dict(table).shuffle(seed=seed)
        count = partitioner.num_partitions
        if count != clients:
            raise FedrcError(
                f"partition.clients: {clients}, but {name} makes {count} partitions; give "
                f"--clients {count}"
            )
        parts = [np.sort(np.asarray(partitioner.load_partition(i)[ROW])) for i in range(count)]
    except FedrcError:
        raise
    except Exception as e:  # the partitioner's own checks: ValueError, TypeError, KeyError…
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise FedrcError(f"{KEY}_options: {name}: {reason}") from None
    small = min(range(count), key=lambda i: parts[i].size)
    if parts[small].size < 2:
        raise FedrcError(
            f"{KEY}: {name} gave client {small} {parts[small].size} samples (each needs a train "
            "and a test sample); change its options or --clients"
        )
    return parts
