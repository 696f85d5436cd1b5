"""`fedrc flower app`: the app folder it writes and its refusals (Flower's presence faked: these
run in the core install), and the one line it gives where Flower is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.flower.appconfig import Deployment, run_settings, train_config_from_json

runner = CliRunner()
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
pytestmark = pytest.mark.usefixtures("flower_installed")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("flwr") is not None, reason="Flower is installed")
def test_without_flower_it_says_what_to_install_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    done = subprocess.run(
        [sys.executable, "-m", "fedrc_cli", "flower", "app", "--app", "app"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: fedrc flower app: Flower is not installed in this environment; install the "
        "extra (Python 3.11 or newer): pip install 'fedrc[flower]'"
    ]
    assert list(tmp_path.iterdir()) == []


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


def test_persistent_momentum_is_refused_before_the_app_is_written(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    result = runner.invoke(app, ["flower", "app", "--app", str(folder), "--persistent-momentum"])
    assert result.exit_code == 2
    assert "persistent_momentum: not available on Flower" in result.output
    assert not folder.exists()


def test_run_settings_read_the_run_config() -> None:
    deployment, resume, overwrite = run_settings({"fedrc-timeout": 30, "fedrc-resume": True})
    assert deployment == Deployment(timeout=30.0) and resume and not overwrite


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"fedrc-timeout": "x"}, "fedrc-timeout: expected a number of seconds, got 'x'"),
        ({"fedrc-wait": True}, "fedrc-wait: expected a number of seconds, got True"),
        ({"fedrc-timeout": math.nan}, "fedrc-timeout > 0 (finite seconds)"),
        ({"fedrc-wait": math.inf}, "fedrc-wait must be >= 0"),
        ({"fedrc-resume": "false"}, "fedrc-resume: expected true or false, got 'false'"),
        ({"fedrc-on-node-loss": "maybe"}, "fedrc-on-node-loss: expected one of"),
    ],
)
def test_run_settings_refuse_what_a_run_config_override_got_wrong(values, error) -> None:
    """`flwr run --run-config` may give any key any TOML value: each is one line."""
    with pytest.raises(FedrcError, match=re.escape(error)):
        run_settings(values)


def test_the_docs_add_the_flwr_connection_once(tmp_path: Path) -> None:
    """docs/flower.md's block that adds the SuperLink to `config.toml` may run twice."""
    page = (ROOT / "docs" / "flower.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "fedrc-local]" in b]
    script = "\n".join(line for line in block.splitlines() if not line.startswith("flwr run"))
    config = tmp_path / "flwr" / "config.toml"
    env = {**os.environ, "FLWR_HOME": str(config.parent)}
    for _ in range(2):
        subprocess.run(["bash", "-euc", script], env=env, check=True, timeout=30)
    written = tomllib.loads(config.read_text())  # a repeated table would not parse
    assert written["superlink"]["fedrc-local"] == {"address": "127.0.0.1:9090", "insecure": True}
    config.write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    subprocess.run(["bash", "-euc", script], env=env, check=True, timeout=30)  # flwr's own file
    names = set(tomllib.loads(config.read_text())["superlink"])
    assert names == {"default", "local", "fedrc-local"}
