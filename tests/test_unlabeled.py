"""New clients assigned without their labels (Flux's protocol for every algorithm): the
fallback rule on a hand-checked case, and `fedrc eval` scoring them beside the labelled ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.algorithms import build_algorithm
from pipeline.config import EvalConfig
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, train_stage


def test_fallback_picks_the_most_confident_model() -> None:
    """Model 0's logits (0, 0) give p = (½, ½), entropy log 2 ≈ 0.693 on both samples; model
    1's (4, 0) give p ≈ (0.982, 0.018), entropy ≈ 0.090: model 1, whatever the labels are."""
    algo = build_algorithm(make_config(algorithm="ifca", clusters=2), 3, 2)
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[4.0, 0.0], [0.0, 4.0]]])
    before = algo.omega.clone()
    omega = algo.assign_unlabeled(2, logits, torch.zeros(2, 1, 1, 1))
    assert torch.equal(omega, torch.tensor([0.0, 1.0], dtype=torch.float64))
    p = torch.tensor([4.0, 0.0]).softmax(0)
    assert math.isclose(float(-(p * p.log()).sum()), 0.0900, abs_tol=1e-4)
    assert torch.equal(algo.omega, before)  # the state is untouched


def test_eval_scores_new_clients_with_and_without_labels(tiny_data: Path, tmp_path: Path) -> None:
    """FedAvg has one model: without labels a new client can only take it, so the two global
    accuracies agree. IFCA (2 models) gets its own number and the rule it used; the labelled
    scores and ω in eval_clients.json are those of the labelled assignment."""
    base = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
    fedavg = train_stage(make_config(data=str(tiny_data), out=str(tmp_path / "a"), **base))
    result = eval_stage(EvalConfig(run=str(fedavg)))
    assert result["final_unlabeled_global_accuracy"] == result["final_global_accuracy"]
    assert "lowest prediction entropy" in result["unlabeled_rule"]

    config = make_config(data=str(tiny_data), out=str(tmp_path / "i"), algorithm="ifca", **base)
    ifca = train_stage(config)
    labelled = eval_stage(EvalConfig(run=str(ifca), unlabeled=False))
    assert "final_unlabeled_global_accuracy" not in labelled
    clients = json.loads((ifca / "eval_clients.json").read_text())
    both = eval_stage(EvalConfig(run=str(ifca)))
    assert 0.0 <= both["final_unlabeled_global_accuracy"] <= 1.0
    assert both["final_global_accuracy"] == labelled["final_global_accuracy"]
    assert json.loads((ifca / "eval_clients.json").read_text()) == clients
    by_concept = both["final_unlabeled_global_accuracy_by_concept"]
    assert by_concept.keys() == both["final_global_accuracy_by_concept"].keys()

    shown = CliRunner().invoke(app, ["eval", "--run", str(ifca)])
    assert shown.exit_code == 0, shown.output
    assert "new clients unlabeled" in shown.output
    report = CliRunner().invoke(app, ["report", str(ifca), "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    assert "global (last, unlabeled)" in (tmp_path / "r" / "report.md").read_text()
    assert "new clients unlabeled" in report.output
