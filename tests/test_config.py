import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from pipeline.algorithms import num_models
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig, TrainConfig, build_config, read_params
from pipeline.models.settings import MLPSettings
from pipeline.run.resolve import train_config


def build(cls, params, overrides=None):
    """A stage's configuration as the CLI builds it (`fedrc train`'s: pipeline.run.resolve)."""
    if cls is TrainConfig:
        return train_config(params, overrides)
    return build_config(cls, params, overrides)


def test_params_file_then_cli_override(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("train:\n  rounds: 7\n  lr: 1\n  algorithm: fedem\n")
    config = build(TrainConfig, read_params(path), {"rounds": 9, "seed": None})
    assert (config.rounds, config.lr, config.algorithm, config.seed) == (9, 1.0, "fedem", 0)
    assert isinstance(config.lr, float)


@pytest.mark.parametrize(
    ("section", "cls", "body", "culprit"),
    [
        ("partition", PartitionConfig, "alpha: 0", "partition.alpha"),
        ("partition", PartitionConfig, "alpha: -1", "partition.alpha"),
        ("partition", PartitionConfig, "dataset: imagenet", "partition.dataset"),
        ("partition", PartitionConfig, "clients: ten", "partition.clients"),
        ("partition", PartitionConfig, "styles: [fog]", "partition.styles"),
        ("partition", PartitionConfig, "colour: red", "partition.colour"),
        ("train", TrainConfig, "algorithm: fedfoo", "train.algorithm"),
        ("train", TrainConfig, "participation: 0", "train.participation"),
        ("train", TrainConfig, "momentum: 1.0", "train.momentum"),
        ("train", TrainConfig, "lr: true", "train.lr"),
    ],
)
def test_bad_params_name_the_key(tmp_path, section, cls, body, culprit) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"{section}:\n  {body}\n")
    with pytest.raises(FedrcError, match=culprit.replace(".", r"\.")):
        build(cls, read_params(path))


def test_missing_params_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FedrcError, match="--params"):
        read_params(tmp_path / "nope.yaml")


def test_per_algorithm_rows_go_over_the_train_section(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "train: {lr: 0.1, rounds: 5}\n"
        "per_algorithm: {fedsoft: {lr: 0.03, mu: 0.1}, cfl: {max_clusters: 3}}\n"
    )
    params = read_params(path)
    fedsoft = build(TrainConfig, params, {"algorithm": "fedsoft"})
    assert (fedsoft.lr, fedsoft.algorithm_settings.mu, fedsoft.rounds) == (0.03, 0.1, 5)
    assert build(TrainConfig, params, {"algorithm": "fedavg"}).lr == 0.1
    assert build(TrainConfig, params, {"algorithm": "fedsoft", "lr": 0.5}).lr == 0.5
    assert num_models(build(TrainConfig, params, {"algorithm": "cfl"})) == 3


@pytest.mark.parametrize(
    ("body", "culprit"),
    [
        ("per_algorithm: {fedfoo: {lr: 0.1}}", "per_algorithm"),
        ("per_algorithm: {fedrc: {lr: fast}}", "per_algorithm.fedrc.lr"),
        ("per_algorithm: {fedrc: {speed: 1}}", "per_algorithm.fedrc.speed"),
        ("per_algorithm: {fedrc: {algorithm: fedem}}", "per_algorithm.fedrc.algorithm"),
    ],
)
def test_bad_per_algorithm_rows_name_the_key(tmp_path: Path, body: str, culprit: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(body + "\n")
    with pytest.raises(FedrcError, match=culprit.replace(".", r"\.")):
        build(TrainConfig, read_params(path), {"algorithm": "fedrc"})


def test_later_layers_win_one_key_at_a_time() -> None:
    """The rule of `fedrc train --help`: built-in defaults < profile < params.yaml `train:` <
    `per_algorithm.<algorithm>` < command-line options < `--set`, for a shared option
    (weight_decay) and for a setting (adam_beta1), each layer added in turn."""
    layers = [
        ({}, {}, []),
        ({"train": {"profile": "reference"}}, {}, []),
        ({"train": {"weight_decay": 1e-3, "fedrc": {"adam_beta1": 0.6}}}, {}, []),
        ({"per_algorithm": {"fedrc": {"weight_decay": 2e-3, "adam_beta1": 0.7}}}, {}, []),
        ({}, {"weight_decay": 3e-3}, []),
        ({}, {}, ["adam_beta1=0.8"]),
    ]
    expected = [(0.0, 0.9), (5e-4, 0.5), (1e-3, 0.6), (2e-3, 0.7), (3e-3, 0.7), (3e-3, 0.8)]
    params: dict = {}
    options: dict = {}
    sets: list[str] = []
    for (more_params, more_options, more_sets), want in zip(layers, expected, strict=True):
        for name, values in more_params.items():
            params[name] = {**params.get(name, {}), **values}
        options.update(more_options)
        sets += more_sets
        config = train_config(params, options, sets)
        assert (config.weight_decay, config.algorithm_settings.adam_beta1) == want, params


def test_a_per_algorithm_row_may_choose_the_profile_and_the_model() -> None:
    """Like any shared option: the profile's values and the model's settings follow it."""
    params = {"per_algorithm": {"cfl": {"profile": "reference", "model": "mlp"}}}
    config = train_config(params, {"algorithm": "cfl"})
    assert (config.profile, config.weight_decay, config.drop_last) == ("reference", 5e-4, True)
    assert config.model == "mlp" and set(config.settings) == {"cfl", "mlp"}
    assert train_config(params, {"algorithm": "cfl", "model": "cnn"}).model_settings is not None


def test_train_config_fields_sit_in_their_sections_in_order() -> None:
    """`TrainConfig.GROUPS` (the panels of `fedrc train --help`) lists every shared option once,
    in the order of the fields, and the comment heading each run of fields names its group."""
    fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "settings"]
    assert [name for names in TrainConfig.GROUPS.values() for name in names] == fields
    headed: dict[str, list[str]] = {}
    title = None
    for line in inspect.getsource(TrainConfig).splitlines():
        if line.startswith("    # "):
            title = line[6:]
        elif (found := re.match(r"    (\w+): ", line)) and title in TrainConfig.GROUPS:
            headed.setdefault(title, []).append(found.group(1))
    assert {k: tuple(v) for k, v in headed.items()} == TrainConfig.GROUPS


def test_a_profile_sets_the_models_settings_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MLPSettings, "profiles", {"reference": {"layers": 2}})
    options = {"algorithm": "fedavg", "model": "mlp"}
    assert train_config({}, options).model_settings.layers == 1
    assert train_config({}, {**options, "profile": "reference"}).model_settings.layers == 2
    overridden = train_config({}, {**options, "profile": "reference"}, ["layers=3"])
    assert overridden.model_settings.layers == 3
