"""`fedrc info` without a folder: what can be named in a run, built-in and from plugins."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table

from pipeline.algorithms import ALGORITHMS
from pipeline.data.loaders import DATASETS
from pipeline.models import MODELS
from pipeline.plugins import Entry, Registry
from pipeline.settings import description, field_types

REGISTRIES: tuple[Registry, ...] = (ALGORITHMS, MODELS, DATASETS)


def _about(entry: Entry) -> str:
    if entry.error is not None:
        return f"[red]{entry.error}[/]"
    component = entry.component
    return getattr(component, "paper", None) or getattr(component, "summary", "")


def catalog() -> Table:
    """One line per algorithm, model and dataset: name, origin, paper or summary."""
    table = Table(title="available components (plugins: entry points fedrc.<kind>s)")
    for column in ("kind", "name", "from", "paper / what it is"):
        table.add_column(column, overflow="fold")
    for registry in REGISTRIES:
        for entry in registry.entries():
            table.add_row(registry.kind, entry.name, entry.origin, _about(entry))
    return table


def settings_of(component: Any) -> type | None:
    settings = getattr(component, "Settings", None) or getattr(component, "settings", None)
    return settings if isinstance(settings, type) else None


def find(name: str) -> tuple[Registry, Any] | None:
    """The registry and component called `name` (built-in or plugin), or None."""
    for registry in REGISTRIES:
        if name in registry.names() or ":" in name:
            return registry, registry.get(name)
    return None


def settings_table(name: str, registry: Registry, component: Any) -> Group:
    """A component's own settings: key, type, default, what it does; `--set KEY=VALUE` sets
    them."""
    settings = settings_of(component)
    about = getattr(component, "paper", None) or getattr(component, "summary", "")
    table = Table(title=f"{registry.kind} {name}: {about}")
    for column in ("setting (--set KEY=VALUE)", "type", "default", "description"):
        table.add_column(column, overflow="fold")
    fields = dataclasses.fields(settings) if settings is not None else ()
    types_ = field_types(settings) if settings is not None else {}
    defaults = settings() if settings is not None else None
    for item in fields:
        kind = getattr(types_[item.name], "__name__", None) or str(types_[item.name])
        default = repr(getattr(defaults, item.name))
        table.add_row(item.name, kind, default, description(item))
    if not fields:
        table.add_row("(none)", "", "", "")
    return Group(table)
