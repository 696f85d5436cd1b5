"""What DVC sees of a run's code: `fedrc check` writes the digests of fedrc's training code and
of the package (or file) each plugin comes from into the resolved files the stages depend on;
an edit to a plugin's file or to a module of its package changes them, a plugin given as
`path/to/file.py:Name` loads and is tracked the same way."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrc_cli.app import app

PARAMS = "partition: {dataset: synthetic, clients: 8, samples_per_client: 40}\ntrain: {%s}\n"
ALGORITHM = """
from dataclasses import dataclass

from pipeline.algorithms.fedavg import FedAvg
from pipeline.plugin import Settings, setting
from %s import helper


@dataclass(frozen=True)
class Own(Settings):
    beta: float = setting(0.9, "a default to edit")


class Mine(FedAvg):
    Settings = Own
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("mypkg", "fedrc_plugin_"))]:
        del sys.modules[name]


def resolved_code(here: Path, train: str) -> dict[str, str]:
    (here / "params.yaml").write_text(PARAMS % train)
    for name in [m for m in sys.modules if m.startswith(("mypkg", "fedrc_plugin_"))]:
        del sys.modules[name]  # a new `fedrc check` imports the files afresh
    result = CliRunner().invoke(app, ["check", "--out", "resolved"])
    assert result.exit_code == 0, result.output
    return json.loads((here / "resolved" / "train.json").read_text())["code"]


def test_a_built_in_run_is_fedrcs_code_alone(here: Path) -> None:
    code = resolved_code(here, "algorithm: ifca")
    assert set(code) == {"fedrc"} and len(code["fedrc"]) == 64
    assert resolved_code(here, "algorithm: fedrc") == code  # the training code, not the name


def test_a_plugin_packages_every_module_counts(here: Path) -> None:
    package = here / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("helper = 1\n")
    (package / "algo.py").write_text(ALGORITHM % "mypkg.helper")
    first = resolved_code(here, "algorithm: 'mypkg.algo:Mine'")
    assert set(first) == {"fedrc", "mypkg"}
    (package / "helper.py").write_text("helper = 2\n")  # not the algorithm's own module
    second = resolved_code(here, "algorithm: 'mypkg.algo:Mine'")
    assert second["mypkg"] != first["mypkg"] and second["fedrc"] == first["fedrc"]


def test_a_plugin_file_by_its_path_loads_and_is_tracked(here: Path) -> None:
    folder = here / "plugins"
    folder.mkdir()
    (here / "support.py").write_text("helper = 1\n")
    (folder / "mine.py").write_text(ALGORITHM % "support")
    first = resolved_code(here, "algorithm: 'plugins/mine.py:Mine'")
    (plugin,) = set(first) - {"fedrc"}
    assert plugin.startswith("fedrc_plugin_mine_")
    (folder / "mine.py").write_text((ALGORITHM % "support").replace("0.9", "0.5"))
    second = resolved_code(here, "algorithm: 'plugins/mine.py:Mine'")
    assert second[plugin] != first[plugin]
    result = CliRunner().invoke(app, ["info", "plugins/mine.py:Mine"])
    assert result.exit_code == 0 and "beta" in result.output, result.output
    missing = CliRunner().invoke(app, ["train", "--algorithm", "plugins/none.py:Mine"])
    assert missing.exit_code == 2 and "no file plugins/none.py" in missing.output, missing.output
