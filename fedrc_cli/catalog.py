"""`fedrc info` without a folder: what can be named in a run, built-in and from plugins, and how a
benchmark's clients can be drawn (fedrc's label splits, Flower's partitioners when installed).
It reads the built-ins' cards (paper or summary, settings), so only a plugin is imported."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from pipeline.algorithms import ALGORITHMS
from pipeline.common.registry import Entry, Registry
from pipeline.common.settings import description, field_types
from pipeline.data.loaders import DATASETS, PREFIX, dataset_spec
from pipeline.data.partitioners import flower_partitioners
from pipeline.models import MODELS

REGISTRIES: tuple[Registry, ...] = (ALGORITHMS, MODELS, DATASETS)
# `--label-split` (fedrc's own; docs/benchmarks.md) beside `--partitioner` (Flower's) and
# `--partition-by` (one client per value of a column)
LABEL_SPLITS = {
    "sequential_dirichlet": "the FedRC benchmark's: q ~ Dir(α · remaining class shares), client "
    "after client (--label-split)",
    "dirichlet": "each class over the clients by Dir(α · 1) (--label-split)",
    "n_class": "classes_per_client classes a client (--label-split)",
    "cluster_dirichlet": "Fed-CAM's Dir(α, α_within) over label groups (--label-split)",
    "cluster_n_class": "Fed-CAM's n-class(a, b) over label groups (--label-split)",
    "partition_by": "one client per value of a column, unseen values held out (--partition-by "
    "COLUMN)",
}


def _about(card: Any) -> str:
    return getattr(card, "paper", None) or getattr(card, "summary", "")


def _row(entry: Entry) -> str:
    return f"[red]{entry.error}[/]" if entry.error is not None else _about(entry.card)


def catalog() -> Table:
    """One line per algorithm, model and dataset: name, origin, paper or summary."""
    table = Table(title="available components (plugins: entry points fedrc.<kind>s)")
    for column in ("kind", "name", "from", "paper / what it is"):
        table.add_column(column, overflow="fold")
    for registry in REGISTRIES:
        for entry in registry.entries():
            table.add_row(registry.kind, entry.name, entry.origin, _row(entry))
    for name, summary in LABEL_SPLITS.items():
        table.add_row("partitioner", name, "built-in", summary)
    for name, origin, summary in flower_partitioners():
        use = "" if name.startswith("(") else f" (--partitioner {name})"
        table.add_row("partitioner", name, origin, escape(summary) + use)
    return table


def settings_of(card: Any) -> type | None:
    settings = getattr(card, "Settings", None) or getattr(card, "settings", None)
    return settings if isinstance(settings, type) else None


def find(name: str) -> tuple[Registry, Any] | None:
    """The registry and card of the component called `name` (built-in or plugin), or None."""
    if name.startswith(PREFIX):  # any Hugging Face dataset: the source's card
        return DATASETS, dataset_spec(name)
    for registry in REGISTRIES:
        if name in registry.names() or ":" in name:
            return registry, registry.card(name)
    return None


def settings_table(name: str, registry: Registry, card: Any) -> Group:
    """A component's own settings, from its card: key, type, default, what it does;
    `--set KEY=VALUE` sets them."""
    settings = settings_of(card)
    table = Table(title=f"{registry.kind} {name}: {_about(card)}")
    for column in ("setting (--set KEY=VALUE)", "type", "default", "description"):
        table.add_column(column, overflow="fold")
    fields = dataclasses.fields(settings) if settings is not None else ()
    types_ = field_types(settings) if settings is not None else {}
    defaults = settings() if settings is not None else None
    for item in fields:
        kind = getattr(types_[item.name], "__name__", None) or str(types_[item.name])
        default = repr(getattr(defaults, item.name))
        # a description's "[mean, std]" or a default's "[0.1, 0.3]" is text, not rich's markup
        table.add_row(item.name, escape(kind), escape(default), escape(description(item)))
    if not fields:
        table.add_row("(none)", "", "", "")
    return Group(table, *profile_lines(settings))


def profile_lines(settings: type | None) -> list[str]:
    """What each `train.profile` sets among the settings, one line a profile, and the values that
    reproduce the authors' released code where it departs from the paper."""
    profiles = getattr(settings, "profiles", None) or {}
    released = getattr(settings, "released", None) or {}
    lines = [
        f"--profile {name} sets " + ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
        for name, values in profiles.items()
        if not (released and values == released)
    ]
    if released:
        sets = " ".join(f"--set {k}={json.dumps(v)}" for k, v in released.items())
        port = "--profile released (with the reference local SGD), or " * (
            profiles.get("released") == released
        )
        lines.append(f"as the authors released it: {port}{sets}")
    return lines
