"""`fedrc flower app` (core install, no Flower needed): the app folder it writes, its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.flower.appconfig import train_config_from_json

runner = CliRunner()
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_help() -> None:
    result = runner.invoke(app, ["flower", "app", "--help"])
    assert result.exit_code == 0
    for option in ("--app", "--wait", "--timeout", "--on-node-loss", "--algorithm", "--set"):
        assert option in result.output


def test_writes_the_app_with_the_resolved_train_config(tiny_data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "app"
    result = runner.invoke(
        app,
        [
            *("flower", "app", "--app", str(folder), "--data", str(tiny_data)),
            *("--algorithm", "fedrc", "--rounds", "7", "--set", "estep=adam", "--timeout", "30"),
        ],
    )
    assert result.exit_code == 0, result.output
    written = tomllib.loads((folder / "pyproject.toml").read_text())
    flwr = written["tool"]["flwr"]
    assert flwr["app"]["components"] == {
        "serverapp": "pipeline.flower.apps:server_app",
        "clientapp": "pipeline.flower.apps:client_app",
    }
    values = flwr["app"]["config"]
    assert values["fedrc-timeout"] == 30.0 and values["fedrc-on-node-loss"] == "continue"
    config = train_config_from_json(values["fedrc-train"])
    assert (config.algorithm, config.rounds) == ("fedrc", 7)
    assert config.settings["fedrc"].estep == "adam"
    assert Path(config.data).is_absolute() and Path(config.out).is_absolute()
    assert json.loads(values["fedrc-train"])["data"] == str(tiny_data.resolve())


def test_bad_option_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    result = runner.invoke(app, ["flower", "app", "--app", str(folder), "--on-node-loss", "maybe"])
    assert result.exit_code == 2
    assert "--on-node-loss: expected one of ('continue', 'stop')" in result.output
    assert not folder.exists()
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, ["flower", "app", "--app", str(tmp_path / "file" / "app")])
    assert result.exit_code == 2 and "--app" in result.output
