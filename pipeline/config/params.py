"""A stage's configuration in three layers: the dataclass defaults, the stage's section of
params.yaml, then the CLI options that were given. The resolved configuration is written beside
the stage's output (`config.json`), so every artifact says how it was made.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.common import strict_yaml
from pipeline.common.errors import FedrcError, brief
from pipeline.common.reading import read_text, unreadable
from pipeline.common.settings import (
    coerce,
    did_you_mean,
    field_types,
    float_problem,
    path_problem,
)
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
    """The parsed params file; an absent default file means 'all defaults'. Every way the file
    can fail (not a regular file, unreadable, not UTF-8, bad YAML with its line, a key twice,
    aliases without bound, a section that is not a mapping) is one line naming it."""
    option = "--params: " if path is not None else ""
    if path is None:
        default = Path("params.yaml")
        if not os.path.lexists(default):
            return {}
        path = default
    reason = unreadable(path)
    if reason == "not found":
        raise FedrcError(f"--params: file not found: {path}")
    if reason is not None:
        raise FedrcError(f"{option}{path}: {reason}")
    text = read_text(path)
    try:
        data = strict_yaml.load(text)
    except strict_yaml.DuplicateKey as e:
        raise FedrcError(f"{path}: {e}; YAML would keep only the last, so remove one") from None
    except (strict_yaml.TooBig, strict_yaml.TooDeep) as e:
        raise FedrcError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise FedrcError(f"{path}: not valid YAML: {strict_yaml.where(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FedrcError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    sections = list(SECTIONS.values())
    for key in data:  # other top-level keys are allowed (dvc.yaml reads `algorithms`), typos not
        near = difflib.get_close_matches(str(key), sections, n=1, cutoff=0.75)
        if key not in sections and near:
            raise FedrcError(f"{path}: unknown section {key!r} (did you mean {near[0]!r}?)")
    for name in sections:
        section(data, name, f"{path}: ")
    return data


def section(params: dict[str, Any], name: str, where: str = "") -> dict[str, Any]:
    """The section `name` of `params`: a mapping, {} when absent or empty (`train:` alone);
    anything else (`train: false`, `train: []`, `train: 0`) is refused, not read as empty."""
    return mapping(params.get(name), name, where)


def mapping(value: Any, key: str, where: str = "") -> dict[str, Any]:
    """`value` of the dotted `key` as a mapping: None (absent, or a key without a value) is
    empty; anything but a mapping is one line naming the key."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FedrcError(f"{where}{key}: expected a mapping, got {brief(value)}")
    return value


def checked_values(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` checked against `cls`'s field types; an unknown key names the known ones."""
    types_ = field_types(cls)
    for key in values:
        if key not in types_:
            known = ", ".join(sorted(types_))
            hint = did_you_mean(str(key), list(types_))
            raise FedrcError(f"{where}.{key}: unknown key{hint} (known: {known})")
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
    refuse_unusable(config, name)
    config.validate()
    return config


def refuse_unusable(config: Any, name: str) -> None:
    """What passes a field's type but no use of it: inf, nan or beyond float32 in a float
    field (most range checks let them by), an empty path or one with a control character."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, float):
            problem = float_problem(value)
        elif item.metadata.get("path") and isinstance(value, str):
            problem = path_problem(value)
        else:
            continue
        if problem is not None:
            raise FedrcError(f"{name}.{item.name}: expected {problem}, got {brief(value)}")
