"""`fedrc check`: every section of params.yaml at once, resolved configurations all or none."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrc_cli.app import app

PARAMS = "partition: {dataset: synthetic, clients: 10}\ntrain: {algorithm: fedavg, rounds: 3}\n"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_help_and_a_check_that_writes_nothing(here: Path) -> None:
    assert "resolved configuration" in CliRunner().invoke(app, ["check", "--help"]).output
    (here / "params.yaml").write_text(PARAMS)
    result = CliRunner().invoke(app, ["check"])
    assert result.exit_code == 0 and "fedavg, 3 rounds" in result.output, result.output
    assert [p.name for p in here.iterdir()] == ["params.yaml"]


def test_check_writes_each_stages_resolved_configuration(here: Path) -> None:
    (here / "params.yaml").write_text(PARAMS)
    result = CliRunner().invoke(app, ["check", "--out", "resolved"])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (here / "resolved").iterdir())
    assert files == ["eval.json", "partition.json", "plot.json", "train.json"]
    train = json.loads((here / "resolved" / "train.json").read_text())
    assert (train["algorithm"], train["rounds"]) == ("fedavg", 3)
    assert json.loads((here / "resolved" / "partition.json").read_text())["clients"] == 10


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("train: {rouns: 3}\n", "train.rouns: unknown key"),
        ("eval: {finetun: true}\n", "eval.finetun: unknown key"),
        ("plot: {dpi: 5}\n", "plot.dpi: expected an integer in [20, 600]"),
        ("trian: {rounds: 3}\n", "unknown section 'trian' (did you mean 'train'?)"),
    ],
)
def test_a_bad_key_is_one_line_and_writes_nothing(here: Path, params: str, message: str) -> None:
    (here / "resolved").mkdir()
    (here / "resolved" / "train.json").write_text("{}\n")  # the last check's: left as it was
    (here / "params.yaml").write_text(params)
    result = CliRunner().invoke(app, ["check", "--out", "resolved"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert [p.name for p in (here / "resolved").iterdir()] == ["train.json"]
    assert (here / "resolved" / "train.json").read_text() == "{}\n"


@pytest.mark.parametrize("key", ["partition.out", "train.out", "eval.run", "plot.run"])
def test_an_output_folder_that_cannot_be_written_is_one_line(here: Path, key: str) -> None:
    """Under `dvc repro` DVC would touch the stage's outputs first and fail in its own words."""
    (here / "notes.txt").write_text("mine\n")
    section, field = key.split(".")
    params = {"partition": {"dataset": "synthetic"}, "train": {"algorithm": "fedavg"}}
    params.setdefault(section, {})[field] = "notes.txt/run"
    (here / "params.yaml").write_text(json.dumps(params))  # JSON is YAML
    result = CliRunner().invoke(app, ["check", "--out", "resolved"])
    assert result.exit_code == 2, result.output
    line = f"Error: {key}: notes.txt/run: notes.txt is a file, not a folder"
    assert result.output.strip() == line, result.output
    assert sorted(p.name for p in here.iterdir()) == ["notes.txt", "params.yaml"]
