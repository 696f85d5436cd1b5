"""The example plugin package (examples/fedrc-digits, installed by .ci/setup): FLSC's update
rule on a hand-checked case, and the package through partition, train, eval and plot."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.algorithms import ALGORITHMS, build_algorithm
from pipeline.common.settings import description
from pipeline.engine import LocalResult
from pipeline.models import MODELS
from pipeline.run.resolve import make_config

if "flsc" not in ALGORITHMS.names():
    pytest.fail("the example plugin is not installed: run `bash .ci/setup`", pytrace=False)


def test_flsc_clients_train_their_n_best_models_and_the_server_averages_them() -> None:
    """3 models, n = 2. Client 0 (2 samples): mean losses (1, 3, 2) → models 0 and 2; client 1
    (1 sample): (5, 1, 4) → models 1 and 2. Each trains its two models on all its samples with
    weight 1; model 2 = (2·a + 1·b)/3 of the clients' results a, b; model 0 = client 0's, model
    1 = client 1's. ω: ½ on each chosen model."""
    algo = build_algorithm(make_config(algorithm="flsc", clusters=3, n=2), 2, 4)
    models = torch.zeros(3, 2)
    algo.begin_round(models)
    losses = {0: torch.tensor([[0.0, 4.0, 2.0], [2.0, 2.0, 2.0]]), 1: torch.tensor([[5.0, 1, 4]])}
    trained = {0: torch.tensor([3.0, 0.0]), 1: torch.tensor([0.0, 6.0])}
    for client, loss in losses.items():
        gamma = algo.e_step(client, loss, torch.zeros(len(loss), dtype=torch.long))
        tasks = algo.local_tasks(client, gamma, models, torch.zeros(3, len(loss), 4))
        assert [t.model for t in tasks] == ([0, 2] if client == 0 else [1, 2])
        for task in tasks:
            assert torch.equal(task.weights, torch.ones(len(loss)))
            algo.fold(client, task, LocalResult(trained[client].double(), 0.0, None))
    new = algo.aggregate(models)
    torch.testing.assert_close(new, torch.tensor([[3.0, 0.0], [0.0, 6.0], [2.0, 2.0]]))
    torch.testing.assert_close(algo.omega[0], torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))


def test_the_example_describes_each_of_its_settings() -> None:
    """What `fedrc info flsc` and `fedrc info digits-mlp` show in their description column."""
    for settings in (ALGORITHMS.get("flsc").Settings, MODELS.get("digits-mlp").settings):
        for item in dataclasses.fields(settings):
            assert description(item), item.name


def test_the_example_package_runs_partition_train_eval_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    def invoke(*args: str) -> None:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output

    listing = CliRunner().invoke(app, ["info"]).output
    for name in ("flsc", "digits-mlp", "digits"):
        assert name in listing and "fedrc-digits" in listing
    invoke("partition", "--dataset", "digits", "--clients", "12", "--seed", "1", "--out", "d")
    manifest = json.loads(Path("d/manifest.json").read_text())
    assert manifest["dataset"] == "digits"
    invoke(
        "train", "--data", "d", "--algorithm", "flsc", "--model", "digits-mlp", "--set", "n=2",
        "--set", "hidden=32", "--clusters", "3", "--rounds", "3", "--local-epochs", "1",
        "--batch-size", "16", "--device", "cpu", "--out", "r",
    )  # fmt: skip
    config = json.loads(Path("r/config.json").read_text())
    assert config["settings"] == {"flsc": {"n": 2}, "digits-mlp": {"hidden": 32}}
    invoke("eval", "--run", "r")
    result = json.loads(Path("r/eval.json").read_text())
    assert result["algorithm"] == "flsc" and 0 <= result["final_global_accuracy"] <= 1
    invoke("plot", "--run", "r")
    assert any(Path("r/plots").glob("*.png"))


def test_the_example_imports_fedrc_only_through_pipeline_plugin() -> None:
    """One import surface: the example package names nothing of fedrc outside
    `pipeline.plugin`, and docs/plugins.md lists every name the module exports."""
    import ast

    import pipeline.plugin

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "examples/fedrc-digits/fedrc_digits").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
                assert node.module == "pipeline.plugin", (path.name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("pipeline") for a in node.names), path.name
    docs = (root / "docs/plugins.md").read_text()
    missing = [name for name in pipeline.plugin.__all__ if f"`{name}`" not in docs]
    assert missing == [], missing
