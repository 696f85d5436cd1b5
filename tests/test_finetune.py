"""FedRC-FT (`fedrc eval --finetune`): one γ-weighted epoch on copies of the models per client,
at the run's lr or `--finetune-lr`; the global models and the algorithm's state stay as they are."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from conftest import assert_one_line
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline import stages
from pipeline.config import EvalConfig
from pipeline.evaluation.accuracy import all_logits, finetuned_logits
from pipeline.outputs.report import build_report
from pipeline.run import files as rf
from pipeline.stages import eval_stage

runner = CliRunner()


def _opened(run: Path, lr: float | None = None):
    """The pieces `fedrc eval` scores a run with: its algorithm (state loaded), executor (at
    `lr` when given), final models and data."""
    train_config, final, _, data = stages._open_model(run)
    if lr is not None:
        train_config = stages.dataclasses.replace(train_config, lr=lr)
    metrics = rf.read_metrics(run / rf.METRICS)
    device = torch.device("cpu")
    executor, algorithm, _ = stages._checked_final(run, train_config, data, final, metrics, device)
    algorithm.load_state_dict(final["algorithm"])
    return algorithm, executor, final["models"], data, train_config.seed


def _same(a: object, b: object) -> bool:
    """Equal nested state: dicts, lists, tensors, arrays and plain values."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor | np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return a == b


def _train_loss(algorithm, logits: torch.Tensor, data, client: int) -> float:
    """Cross-entropy of the client's ω-weighted soft prediction on its training rows."""
    train = data.train_slices[client]
    rows = slice(0, train.stop - train.start)
    probs = torch.einsum("k,knc->nc", algorithm.omega[client].float(), logits[:, rows].softmax(-1))
    return float(F.nll_loss(probs.clamp_min(1e-12).log(), data.labels[train]))


def test_finetuning_changes_neither_the_models_nor_the_state(tiny_runs: dict[str, Path]) -> None:
    algorithm, executor, models, data, seed = _opened(tiny_runs["fedrc"])
    before_models, before_state = models.clone(), copy.deepcopy(algorithm.state_dict())
    own = finetuned_logits(algorithm, executor, models, data, seed)
    assert torch.equal(models, before_models)
    assert _same(algorithm.state_dict(), before_state)
    assert sorted(own) == list(range(len(data.clients)))  # every client, held-out ones too
    client = data.participating[0]
    rows = data.test_slices[client].stop - data.train_slices[client].start
    assert own[client].shape == (models.shape[0], rows, data.num_classes)


def test_a_small_finetuning_lr_lowers_each_clients_own_loss(tiny_runs: dict[str, Path]) -> None:
    """At a small lr, an epoch on the client's own rows lowers its training loss (first order);
    the lr given is the one that trains (0 would change nothing)."""
    run = tiny_runs["fedrc"]
    algorithm, executor, models, data, seed = _opened(run, lr=0.005)
    raw = all_logits(executor, models, data)
    own = finetuned_logits(algorithm, executor, models, data, seed)
    lower = 0
    for client in data.participating:
        start = data.train_slices[client].start
        plain = raw[:, start : data.test_slices[client].stop]
        lower += _train_loss(algorithm, own[client], data, client) < _train_loss(
            algorithm, plain, data, client
        )
    assert lower == len(data.participating)
    algorithm, executor, models, data, seed = _opened(run, lr=1e-12)
    tiny = finetuned_logits(algorithm, executor, models, data, seed)
    client = data.participating[0]
    start = data.train_slices[client].start
    plain = raw[:, start : data.test_slices[client].stop]
    assert torch.allclose(tiny[client], plain, atol=1e-5)


def test_finetune_lr_is_recorded_and_makes_its_own_report_row(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for name, lr in (("fedrc-ft", None), ("fedrc-ft-small", 0.01)):
        shutil.copytree(tiny_runs["fedrc"], runs / name)
        result = eval_stage(EvalConfig(run=str(runs / name), finetune=True, finetune_lr=lr))
        assert result["finetune_lr"] == (lr or 0.05)  # the run's lr (TINY_TRAIN) by default
    shutil.copytree(tiny_runs["fedrc"], tmp_path / "plain")
    assert eval_stage(EvalConfig(run=str(tmp_path / "plain")))["finetune_lr"] is None
    build_report([str(runs)], tmp_path / "report")
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| FedRC-FT |" in table or "| FedRC-FT ★ |" in table
    assert "FedRC-FT (FT lr 0.01)" in table


def test_a_bad_finetune_lr_is_one_line(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["fedrc"], run)
    for extra in (["--finetune-lr", "0.01"], ["--finetune", "--finetune-lr", "-1"]):
        result = runner.invoke(app, ["eval", "--run", str(run), *extra])
        assert_one_line(result, "eval.finetune_lr", code=2)
        assert not (run / "eval.json").exists()
    result = runner.invoke(app, ["eval", "--run", str(run), "--finetune", "--finetune-lr", "0.01"])
    assert result.exit_code == 0, result.output
    assert "fine-tuned at lr 0.01" in result.output
    assert json.loads((run / "eval.json").read_text())["finetune_lr"] == 0.01
