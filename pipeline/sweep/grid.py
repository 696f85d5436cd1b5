"""A sweep's grid: algorithms × seeds × any train setting, and the runs (points) it names.

An axis is a key of the train section and its values: a shared option (`algorithm`, `seed`,
`lr`, `clusters`, `data`, …) or an algorithm's or model's own setting, `<component>.<key>` or a
bare key. The points are the product of the axes, except that an axis of a component's setting
multiplies only the points whose algorithm or model has it (FedAvg is not trained twice for two
values of FedRC's E-step). A point's configuration is built as `fedrc train` builds one, its
axes' values given as options (above params.yaml and `per_algorithm`).

Each point is one ordinary run folder, `<sweep>/<name>/`, named by what varies: the algorithm,
then `key=value` for each other axis with more than one value, then `s<seed>` when the seed
varies (`fedavg-s0`, `fedrc-lr=0.01-estep=adam-s2`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.algorithms import ALGORITHMS
from pipeline.common import strict_yaml
from pipeline.common.errors import FedrcError
from pipeline.common.settings import coerce, field_types
from pipeline.config import TrainConfig, section
from pipeline.models import MODELS
from pipeline.run.resolve import DEFAULTS, SHARED, train_config

SECTION = "sweep"
SECTION_KEYS = ("out", "grid")
DEFAULT_OUT = "runs/sweep"
SHARED_TYPES = field_types(TrainConfig)
NAMED_FIRST, NAMED_LAST = "algorithm", "seed"


@dataclass(frozen=True)
class Axis:
    """One key of the grid and its values; `where` is how errors name it."""

    key: str
    values: tuple[Any, ...]
    where: str

    @property
    def shared(self) -> bool:
        return self.key in SHARED

    @property
    def bare(self) -> str:
        return self.key.rpartition(".")[2]


@dataclass(frozen=True)
class Point:
    """One run of the grid: its folder's name, its configuration, and its value on each axis
    that applies to it."""

    name: str
    config: TrainConfig
    values: dict[str, Any]


def parse_axis(item: str) -> Axis:
    """`--grid KEY=V1,V2,…` → an Axis (each value read as YAML reads it: 0.1, true, adam)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FedrcError(f"--grid {item}: expected KEY=V1,V2,…, for example --grid lr=0.01,0.1")
    values = [_scalar(part.strip(), f"--grid {key}") for part in text.split(",")]
    if not text.strip() or any(v == "" for v in values):
        raise FedrcError(f"--grid {item}: expected values separated by commas")
    return Axis(key, tuple(values), f"--grid {key}")


def _scalar(text: str, where: str) -> Any:
    try:
        value = strict_yaml.load(text) if text else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list)):
        raise FedrcError(f"{where}: {text!r}: give plain values (lists go in params.yaml)")
    return value


def sweep_section(params: dict[str, Any]) -> tuple[list[Axis], str | None]:
    """params.yaml's `sweep:` section: its grid's axes and its `out` (None when not given)."""
    raw = section(params, SECTION)
    for key in raw:
        if key not in SECTION_KEYS:
            raise FedrcError(f"{SECTION}.{key}: unknown key (known: {', '.join(SECTION_KEYS)})")
    out = raw.get("out")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise FedrcError(f"{SECTION}.out: expected a folder name, got {out!r}")
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise FedrcError(f"{SECTION}.grid: expected a mapping of keys to values, got {grid!r}")
    axes = []
    for key, values in grid.items():
        where = f"{SECTION}.grid.{key}"
        listed = values if isinstance(values, list) else [values]
        if not listed:
            raise FedrcError(f"{where}: expected a value or a list of values, got []")
        axes.append(Axis(str(key), tuple(listed), where))
    return axes, out


def merged(from_file: list[Axis], given: list[Axis]) -> list[Axis]:
    """The file's axes, each replaced by a --grid of the same key; new keys added in order."""
    seen: set[str] = set()
    for axis in given:
        if axis.key in seen:
            raise FedrcError(f"--grid {axis.key}: given twice; give its values in one --grid")
        seen.add(axis.key)
    by_key = {a.key: a for a in given}
    return [by_key.pop(a.key, a) for a in from_file] + list(by_key.values())


def grid_points(params: dict[str, Any], axes: list[Axis], folder: Path) -> list[Point]:
    """Every point of the grid, each a run in `folder`, algorithm by algorithm and the seed
    innermost; an axis, a value or a point's configuration that is not valid is one
    FedrcError naming it."""
    axes = [_checked(axis) for axis in axes]
    order = sorted(axes, key=lambda a: (a.key != NAMED_FIRST, a.key == NAMED_LAST))
    shared = [a for a in order if a.shared and a.key != NAMED_LAST]
    settings = [a for a in order if not a.shared]
    seeds = [a for a in order if a.key == NAMED_LAST]
    varying = {a.key for a in axes if len(a.values) > 1}
    train = section(params, "train")
    points: list[Point] = []
    used: set[str] = set()
    for combo in itertools.product(*(a.values for a in shared)):
        options = dict(zip((a.key for a in shared), combo))
        algorithm = str(options.get("algorithm", train.get("algorithm", DEFAULTS.algorithm)))
        model = str(options.get("model", train.get("model", DEFAULTS.model)))
        owned = [a for a in settings if _applies(a, algorithm, model)]
        used.update(a.key for a in owned)
        for values in itertools.product(*(a.values for a in owned), *(a.values for a in seeds)):
            chosen = {**options, **dict(zip((a.key for a in [*owned, *seeds]), values))}
            name = point_name(algorithm, [a for a in order if a.key in chosen], chosen, varying)
            shared_values = {k: v for k, v in chosen.items() if k in SHARED}
            folder_options = {**shared_values, "out": str(folder / name)}
            config = _config(params, folder_options, owned, values[: len(owned)], name)
            points.append(Point(name, config, chosen))
    for axis in settings:
        if axis.key not in used:
            known = ", ".join(k for k in SHARED if k != "out")
            raise FedrcError(
                f"{axis.where}: neither a train option ({known}) nor a setting of the grid's "
                "algorithms or models (`fedrc info NAME` lists them)"
            )
    _refuse_shared_names(points)
    return points


def _checked(axis: Axis) -> Axis:
    """An axis with its values checked against the key's type; duplicates refused."""
    if axis.key in ("out", "settings"):
        raise FedrcError(f"{axis.where}: a sweep names each point's folder; give the sweep's --out")
    values = axis.values
    if axis.shared:
        values = tuple(coerce(axis.where, v, SHARED_TYPES[axis.key]) for v in values)
    registry = {"algorithm": ALGORITHMS, "model": MODELS}.get(axis.key)
    for value in values if registry is not None else ():
        registry.get(value, axis.where)  # an unknown name, or a plugin that fails to import
    for i, value in enumerate(values):
        if value in values[:i]:
            raise FedrcError(f"{axis.where}: {value!r} given twice")
    return dataclasses.replace(axis, values=values)


def _applies(axis: Axis, algorithm: str, model: str) -> bool:
    """Whether a setting's axis multiplies a point of this algorithm and model."""
    component, _, bare = axis.key.rpartition(".")
    if component:
        return component in (algorithm, model)
    owners = [ALGORITHMS.get(algorithm, "--grid algorithm").Settings]
    owners.append(MODELS.get(model, "--grid model").settings)
    return any(bare in field_types(cls) for cls in owners)


def _config(
    params: dict[str, Any],
    options: dict[str, Any],
    owned: list[Axis],
    values: tuple[Any, ...],
    name: str,
) -> TrainConfig:
    sets = [f"{a.key}={json.dumps(v)}" for a, v in zip(owned, values)]
    try:
        return train_config(params, options, sets)
    except FedrcError as e:
        raise FedrcError(f"sweep point {name}: {e}") from None


def point_name(algorithm: str, axes: list[Axis], values: dict[str, Any], varying: set[str]) -> str:
    """The algorithm, then `key=value` for each other varying axis, then `s<seed>`."""
    parts = [algorithm]
    for axis in axes:
        if axis.key in varying and axis.key not in (NAMED_FIRST, NAMED_LAST):
            value = values[axis.key]
            shown = Path(value).name if axis.key == "data" else _text(value)
            parts.append(f"{axis.bare}={shown}")
    if NAMED_LAST in varying:
        parts.append(f"s{values[NAMED_LAST]}")
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", "-".join(parts)).lstrip("._")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _refuse_shared_names(points: list[Point]) -> None:
    seen: dict[str, Point] = {}
    for point in points:
        if point.name in seen:
            raise FedrcError(
                f"--grid: two points would share the folder {point.name} "
                f"({seen[point.name].values} and {point.values}); give values that differ in "
                "their text"
            )
        seen[point.name] = point


def read_grid(
    params: dict[str, Any], given: list[str], out: str | None
) -> tuple[Path, list[Point]]:
    """The sweep's folder and points: params.yaml's `sweep:` section, each `--grid KEY=…` in
    `given` replacing or adding an axis, `out` (if given) its folder."""
    from_file, file_out = sweep_section(params)
    axes = merged(from_file, [parse_axis(item) for item in given])
    folder = Path(out or file_out or DEFAULT_OUT)
    return folder, grid_points(params, axes, folder)
