"""A stage's configuration in three layers: the dataclass defaults, the stage's section of
params.yaml, then the CLI options that were given. The resolved configuration is written beside
the stage's output (`config.json`), so every artifact says how it was made.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.common import strict_yaml
from pipeline.common.errors import FedrcError
from pipeline.common.settings import coerce, field_types
from pipeline.config.sections import EvalConfig, PlotConfig, TrainConfig
from pipeline.data.partition_config import PartitionConfig

Config = TypeVar("Config", PartitionConfig, TrainConfig, EvalConfig, PlotConfig)
SECTIONS: dict[type, str] = {
    PartitionConfig: "partition",
    TrainConfig: "train",
    EvalConfig: "eval",
    PlotConfig: "plot",
}


def read_params(path: Path | None) -> dict[str, Any]:
    """The parsed params file; an absent default file means 'all defaults'."""
    if path is None:
        default = Path("params.yaml")
        if not default.exists():
            return {}
        path = default
    if not path.is_file():
        raise FedrcError(f"--params: file not found: {path}")
    try:
        data = strict_yaml.load(path.read_text()) or {}
    except strict_yaml.DuplicateKey as e:
        raise FedrcError(f"{path}: {e}; YAML would keep only the last, so remove one") from None
    except yaml.YAMLError as e:
        raise FedrcError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise FedrcError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    sections = list(SECTIONS.values())
    for key in data:  # other top-level keys are allowed (dvc.yaml reads `algorithms`), typos not
        near = difflib.get_close_matches(str(key), sections, n=1, cutoff=0.75)
        if key not in sections and near:
            raise FedrcError(f"{path}: unknown section {key!r} (did you mean {near[0]!r}?)")
    return data


def section(params: dict[str, Any], name: str) -> dict[str, Any]:
    raw = params.get(name) or {}
    if not isinstance(raw, dict):
        raise FedrcError(f"{name}: expected a mapping, got {raw!r}")
    return raw


def checked_values(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` checked against `cls`'s field types; an unknown key names the known ones."""
    types_ = field_types(cls)
    for key in values:
        if key not in types_:
            known = ", ".join(sorted(types_))
            raise FedrcError(f"{where}.{key}: unknown key (known: {known})")
    return {key: coerce(f"{where}.{key}", value, types_[key]) for key, value in values.items()}


def build_config(
    cls: type[Config], params: dict[str, Any], overrides: dict[str, Any] | None = None
) -> Config:
    """Defaults, then params.yaml's section, then the CLI overrides that are not None.
    (`fedrc train`'s configuration, which has per-algorithm settings: `pipeline.run.resolve`.)"""
    name = SECTIONS[cls]
    values = checked_values(cls, section(params, name), name)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    config = cls(**values)
    refuse_non_finite(config, name)
    config.validate()
    return config


def refuse_non_finite(config: Any, name: str) -> None:
    """inf and nan pass most range checks: refuse them for every float field."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise FedrcError(f"{name}.{item.name}: expected a finite number, got {value!r}")
