"""`fedrc train`'s configuration: the shared options plus the algorithm's and model's settings.

Later wins: built-in defaults < profile < params.yaml `train:` < `per_algorithm.<algorithm>` <
command-line options < `--set`.

The shared options (TrainConfig's fields) are given by name in each layer, the command line's
options included; an algorithm's or model's own settings sit under its name in `train:`
(`train: {fedrc: {estep: adam}}`), by name in a `per_algorithm` row, and in `--set KEY=VALUE`
(KEY bare, or `<component>.KEY` when both components have it). A profile sets shared options
(`config.PROFILES`) and the algorithm's and the model's settings (their `Settings.profiles`).

The resolved configuration, settings included, goes into the run's config.json; `from_values`
reads it back, and also the flat form of runs made before settings existed. `resumed` starts
from that file instead of the layers, and lets only what does not change the numbers change.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import yaml

from pipeline.algorithms import ALGORITHMS, BUILT_IN
from pipeline.common import strict_yaml
from pipeline.common.errors import FedrcError
from pipeline.common.settings import build_settings, coerce, did_you_mean, field_types, require
from pipeline.config import (
    PROFILES,
    RESUMABLE,
    TrainConfig,
    checked_values,
    mapping,
    refuse_unusable,
    section,
)
from pipeline.data.records import read_manifest
from pipeline.models import BUILT_IN as BUILT_IN_MODELS
from pipeline.models import MODELS

SHARED = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "settings")
DEFAULTS = TrainConfig()


@functools.cache
def _legacy_keys() -> frozenset[str]:
    """Every built-in setting's name: the flat keys of a config.json from before settings."""
    classes = [cls.Settings for cls in BUILT_IN.values()]
    classes += [spec.settings for spec in BUILT_IN_MODELS.values()]
    return frozenset(key for cls in classes for key in field_types(cls))


class _Collected:
    """Settings values for the run's algorithm and model, each key routed to its owner."""

    def __init__(self, algorithm: str, model: str, options: tuple[str, str] = ("", "")):
        """`options`: how errors name where the algorithm and the model were given."""
        self.classes = {
            algorithm: ALGORITHMS.get(algorithm, options[0] or None).Settings,
            model: MODELS.get(model, options[1] or None).settings,
        }
        self.algorithm, self.model = algorithm, model
        self.values: dict[str, dict[str, Any]] = {name: {} for name in self.classes}

    def owner(self, key: str, where: str) -> tuple[str, str] | None:
        """(component, bare key) for `key` (bare or dotted); None when no component has it."""
        name, _, bare = key.rpartition(".")
        if name:
            if name not in self.classes:
                raise FedrcError(
                    f"{where}{key}: {name} is neither the algorithm ({self.algorithm}) nor the "
                    f"model ({self.model})"
                )
            known = list(field_types(self.classes[name]))
            if bare not in known:
                raise FedrcError(
                    f"{where}{key}: unknown setting of {name}{did_you_mean(bare, known)} "
                    f"(known: {', '.join(known) or 'none'})"
                )
            return name, bare
        owners = [n for n, cls in self.classes.items() if key in field_types(cls)]
        if len(owners) > 1:
            both = " and ".join(owners)
            raise FedrcError(f"{where}{key}: both {both} have it; write {owners[0]}.{key}")
        return (owners[0], key) if owners else None

    def put(self, key: str, value: Any, where: str) -> None:
        found = self.owner(key, where)
        if found is None:
            raise FedrcError(f"{where}{key}: {self.unknown(key)}")
        name, bare = found
        self.values[name][bare] = value

    def unknown(self, key: str) -> str:
        def known(name: str) -> str:
            return ", ".join(field_types(self.classes[name])) or "none"

        every = [k for cls in self.classes.values() for k in field_types(cls)]
        return (
            f"unknown setting{did_you_mean(key, every)} for algorithm {self.algorithm} "
            f"({known(self.algorithm)}) and model {self.model} ({known(self.model)})"
        )

    def built(self) -> dict[str, Any]:
        return {
            name: build_settings(cls, self.values[name], f"train.{name}")
            for name, cls in self.classes.items()
        }


def parse_set(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` → (KEY, the value as YAML reads it: 0.5, true, null, adam, [1, 2])."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise FedrcError(f"--set {item}: expected KEY=VALUE, for example --set estep=adam")
    try:
        value = strict_yaml.load(text) if text.strip() else ""
    except strict_yaml.DuplicateKey as e:
        raise FedrcError(f"--set {item}: {e}; give each key once") from None
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def _apply_sets(collected: _Collected, sets: list[str]) -> None:
    """Each `--set KEY=VALUE` into its component's values; a key given twice (bare or dotted)
    is refused, as params.yaml refuses one: the last would win silently."""
    given: dict[tuple[str, str], str] = {}
    for item in sets:
        key, value = parse_set(item)
        if key in SHARED:
            raise FedrcError(f"--set {key}: a shared option; give it as --{key.replace('_', '-')}")
        found = collected.owner(key, "--set ")
        if found is None:
            raise FedrcError(f"--set {key}: {collected.unknown(key)}")
        if found in given:
            raise FedrcError(f"--set {key}: given twice ({given[found]}, {item}); give it once")
        given[found] = item
        name, bare = found
        kind = field_types(collected.classes[name])[bare]
        collected.values[name][bare] = coerce(f"--set {name}.{bare}", value, kind)


def _per_algorithm(params: dict[str, Any], algorithm: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`per_algorithm: {cfl: {lr: 0.1, max_clusters: 3}, ...}`: one algorithm's row, split into
    its shared options (checked) and its settings.

    DVC cannot index a table by a matrix item, so a pipeline that runs many algorithms from one
    params file keeps their learning rates (and μ, max_clusters) here and fedrc picks the row.
    """
    table = mapping(params.get("per_algorithm"), "per_algorithm")
    for name in table:
        ALGORITHMS.get(str(name), "per_algorithm")
    row = mapping(table.get(algorithm), f"per_algorithm.{algorithm}")
    shared = {k: v for k, v in row.items() if k in SHARED and k != "algorithm"}
    settings = {k: v for k, v in row.items() if k not in shared}  # `algorithm` is refused there
    return checked_values(TrainConfig, shared, f"per_algorithm.{algorithm}"), settings


def train_config(
    params: dict[str, Any], options: dict[str, Any] | None = None, sets: list[str] = ()
) -> TrainConfig:
    """The configuration of a new run, layer over layer (the module's docstring); `options`
    that are None were not given."""
    raw = section(params, "train")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    from_file = checked_values(TrainConfig, {k: v for k, v in raw.items() if k in SHARED}, "train")
    algorithm = given.get("algorithm", from_file.get("algorithm", DEFAULTS.algorithm))
    row, row_settings = _per_algorithm(params, algorithm)
    shared = {**from_file, **row, **given}
    profile = shared.get("profile", DEFAULTS.profile)
    require(profile in PROFILES, "train.profile", f"one of {tuple(PROFILES)}", profile)
    model = shared.get("model") or default_model(shared.get("data", DEFAULTS.data))
    shared["model"] = model
    collected = _Collected(algorithm, model, ("train.algorithm", "train.model"))
    for name, cls in collected.classes.items():
        collected.values[name].update(cls.profiles.get(profile, {}))
    _put_sections(collected, raw)
    for key, value in row_settings.items():
        collected.put(key, value, f"per_algorithm.{algorithm}.")
    _apply_sets(collected, list(sets))
    return _finish({**PROFILES[profile], **shared}, collected, "train")


def default_model(data: str) -> str:
    """The model when none is named: `mlp` for a benchmark of feature rows (samples of shape
    (1, d, 1): a tabular stream, which the CNN cannot take), else `cnn`. A missing or broken
    benchmark gets the CNN here; training then says what is wrong with it."""
    try:
        height, _, channels = read_manifest(Path(data)).image_shape
    except FedrcError:
        return DEFAULTS.model
    return "mlp" if (height, channels) == (1, 1) else DEFAULTS.model


def _put_sections(collected: _Collected, raw: dict[str, Any]) -> None:
    """`train:`'s keys other than the shared options: the sections of the run's algorithm and
    model are taken, another component's is kept for the runs that choose it, and a setting
    written flat (or an unknown key) is one line saying where it belongs."""
    components = {*ALGORITHMS.names(), *MODELS.names(), *collected.classes}
    for key, value in raw.items():
        if key in SHARED:
            continue
        if key in components:
            if key in collected.values:
                collected.values[key].update(mapping(value, f"train.{key}"))
        elif key in _legacy_keys() or collected.owner(key, "train.") is not None:
            raise FedrcError(
                f"train.{key}: a setting of one algorithm or model; write it under its name, "
                f"e.g. train: {{{collected.algorithm}: {{{key}: ...}}}}, or give --set {key}=..."
            )
        else:
            hint = did_you_mean(str(key), [*SHARED, *components])
            raise FedrcError(
                f"train.{key}: unknown key{hint} (known: {', '.join(SHARED)}, and a section "
                "per algorithm or model)"
            )


def _finish(values: dict[str, Any], collected: _Collected, name: str) -> TrainConfig:
    config = TrainConfig(**values, settings=collected.built())
    refuse_unusable(config, name)
    config.validate()
    return config.fixed()


def from_values(values: dict[str, Any], where: str = "train", strict: bool = False) -> TrainConfig:
    """A TrainConfig from a config.json (or a checkpoint's identity): settings nested under
    `settings`, dotted (`fedrc.estep`), or flat as written before settings existed (other
    algorithms' flat keys are then ignored, unless `strict`)."""
    values = dict(values)
    nested = values.pop("settings", None)
    shared = checked_values(TrainConfig, {k: v for k, v in values.items() if k in SHARED}, where)
    shared["model"] = shared.get("model") or default_model(shared.get("data", DEFAULTS.data))
    collected = _Collected(
        shared.get("algorithm", DEFAULTS.algorithm),
        shared["model"],
        (f"{where}.algorithm", f"{where}.model"),
    )
    _put_nested(collected, nested, where)
    for key, value in values.items():
        if key not in SHARED:
            _put_flat(collected, key, value, where, strict)
    return _finish(shared, collected, where)


def _put_nested(collected: _Collected, nested: Any, where: str) -> None:
    """config.json's `settings: {component: {key: value}}`."""
    for name, table in mapping(nested, f"{where}.settings").items():
        for key, value in mapping(table, f"{where}.settings.{name}").items():
            collected.put(f"{name}.{key}", value, f"{where}.settings.")


def _put_flat(collected: _Collected, key: str, value: Any, where: str, strict: bool) -> None:
    """A setting outside `settings`: dotted (a checkpoint's identity), or flat (a config.json
    from before settings, where another algorithm's key is left behind unless `strict`)."""
    if "." in key or collected.owner(key, f"{where}.") is not None:
        collected.put(key, value, f"{where}.")
    elif strict or key not in _legacy_keys():
        raise FedrcError(f"{where}.{key}: unknown key")


def make_config(**values: Any) -> TrainConfig:
    """A TrainConfig in Python (tests, benchmarks, notebooks): shared options and settings by
    name, bare or dotted, e.g. `make_config(algorithm="cfl", max_clusters=3, lr=0.05)`."""
    return from_values(values, "train", strict=True)


def recorded_identity(recorded: dict[str, Any], where: str) -> dict[str, Any]:
    """A checkpoint's recorded identity in today's form, so that runs from older versions of
    fedrc (flat settings, options added since missing) compare equal to their configuration."""
    values = {k: v for k, v in recorded.items() if k != "data_digest"}
    identity = from_values(values, where).identity()
    if "data_digest" in recorded:
        identity["data_digest"] = recorded["data_digest"]
    return identity


def resumed(
    saved: TrainConfig,
    options: dict[str, Any],
    sets: list[str],
    run: str,
    params: dict[str, Any] | None = None,
) -> TrainConfig:
    """The saved configuration of `run`, with what was given that may change on resume.

    Given are the CLI options, `--set`, and the `train:` section of a params file named with
    `--params` (./params.yaml is not read: a run resumes as it began). A value that would change
    the numbers gets one line naming it, both values, and what to do."""
    raw = section(params or {}, "train")
    changed = _resumable_changes(saved, raw, options, run)
    _refuse_changed_settings(saved, raw, sets, run)
    return dataclasses.replace(saved, **changed)


def _resumable_changes(
    saved: TrainConfig, raw: dict[str, Any], options: dict[str, Any], run: str
) -> dict[str, Any]:
    """The shared options given (in `raw` or `options`) that differ from `saved`'s, each one
    that may change on resume (`RESUMABLE`); any other is refused."""
    shared = checked_values(TrainConfig, {k: v for k, v in raw.items() if k in SHARED}, "train")
    flags = {k: f"--{k.replace('_', '-')}" for k in SHARED}
    where = {**{k: f"train.{k} in --params" for k in shared}, **flags}
    given = {**shared, **{k: v for k, v in options.items() if v is not None}}
    changed = {k: v for k, v in given.items() if v != getattr(saved, k)}
    for key, value in changed.items():
        if key not in RESUMABLE:
            raise FedrcError(
                f"{where[key]}: {run} was trained with {getattr(saved, key)!r}, not {value!r}; "
                f"leave it out to resume (only {', '.join(flags[k] for k in RESUMABLE)} may "
                "change), or start again with --overwrite"
            )
    return changed


def _refuse_changed_settings(
    saved: TrainConfig, raw: dict[str, Any], sets: list[str], run: str
) -> None:
    """A setting given (under its component in `raw`, or with `--set`) that differs from
    `saved`'s: one line naming it."""
    collected = _Collected(saved.algorithm, saved.model)
    for name, settings in saved.settings.items():
        collected.values[name] = dataclasses.asdict(settings)
        collected.values[name].update(mapping(raw.get(name), f"train.{name}"))
    _apply_sets(collected, list(sets))
    before = saved.identity()
    for key, value in dataclasses.replace(saved, settings=collected.built()).identity().items():
        if value != before[key]:
            raise FedrcError(
                f"--set {key}: {run} was trained with {before[key]!r}, not {value!r}; leave it "
                "out to resume, or start again with --overwrite"
            )
