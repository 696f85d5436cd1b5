"""`--precision bf16`: every forward pass (local training, the E-step's logits, evaluation) under
bfloat16 autocast on both executors, with float32 parameters, gradients, momentum and results.

The tests pin oneDNN to AVX2 (conftest), where bf16 is emulated and slow: everything here is tiny.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN, assert_one_line
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.config import EvalConfig
from pipeline.engine import BatchedExecutor, LocalTask, SequentialExecutor
from pipeline.models import build_model
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, train_stage

runner = CliRunner()
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=8, local_epochs=2, drop_last=False)


def executor(kind: type[SequentialExecutor], precision: str, **kw) -> SequentialExecutor:
    torch.manual_seed(0)
    model = build_model((16, 16, 1), 4, "cnn")
    return kind(model, torch.device("cpu"), **SGD, precision=precision, **kw)


def job(ex: SequentialExecutor) -> tuple:
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (20, 1, 16, 16), generator=gen, dtype=torch.uint8)
    y = torch.randint(0, 4, (20,), generator=gen)
    momentum = torch.zeros(ex.num_trainable)
    return LocalTask(0, ex.flatten(), torch.rand(20, generator=gen), momentum=momentum), x, y, 7


@pytest.mark.parametrize("kind", [SequentialExecutor, BatchedExecutor])
def test_bf16_training_keeps_float32_master_weights(kind: type[SequentialExecutor]) -> None:
    results = {}
    for precision in ("fp32", "bf16"):
        ex = executor(kind, precision)
        results[precision] = ex.train(*job(ex))
        assert all(p.dtype == torch.float32 for p in ex.model.parameters())
        assert all(b.dtype == torch.float32 for b in ex.model.buffers() if b.is_floating_point())
    fp32, bf16 = results["fp32"], results["bf16"]
    assert bf16.params.dtype == bf16.momentum.dtype == torch.float32
    assert not torch.equal(bf16.params, fp32.params)  # autocast did run in bfloat16
    torch.testing.assert_close(bf16.params, fp32.params, atol=0.02, rtol=0)
    assert bf16.loss_sum == pytest.approx(fp32.loss_sum, rel=0.02)


@pytest.mark.parametrize("conv", ["grouped", "im2col"])
def test_both_executors_agree_under_bf16(conv: str) -> None:
    seq, bat = executor(SequentialExecutor, "bf16"), executor(BatchedExecutor, "bf16", conv=conv)
    a, b = seq.train(*job(seq)), bat.train(*job(bat))
    torch.testing.assert_close(b.params, a.params, atol=0.01, rtol=0)
    assert b.loss_sum == pytest.approx(a.loss_sum, rel=0.01)


@pytest.mark.parametrize("kind", [SequentialExecutor, BatchedExecutor])
def test_bf16_logits_come_back_as_float32(kind: type[SequentialExecutor]) -> None:
    images, labels = job(executor(kind, "fp32"))[1:3]
    out = {}
    for precision in ("fp32", "bf16"):
        ex = executor(kind, precision)
        models = torch.stack([ex.flatten(), ex.flatten() * 0.5])
        out[precision] = ex.logits(models, images)
        assert out[precision].dtype == torch.float32
        assert ex.losses(models, images, labels).dtype == torch.float32
    assert not torch.equal(out["bf16"], out["fp32"])
    torch.testing.assert_close(out["bf16"], out["fp32"], atol=0.05, rtol=0.02)


@pytest.fixture(scope="module")
def runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny FedRC run in each precision (the CPU's sequential executor)."""
    root = tmp_path_factory.mktemp("precision")
    return {
        precision: train_stage(
            make_config(
                data=str(tiny_data),
                algorithm="fedrc",
                out=str(root / precision),
                precision=precision,
                **TINY_TRAIN,
            )
        )
        for precision in ("fp32", "bf16")
    }


def test_bf16_run_trains_close_to_fp32(runs: dict[str, Path]) -> None:
    metrics = {p: rf.read_metrics(run / rf.METRICS) for p, run in runs.items()}
    losses = {p: [row["train_loss"] for row in rows] for p, rows in metrics.items()}
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    for a, b in zip(metrics["fp32"], metrics["bf16"], strict=True):
        assert b["global_accuracy"] == pytest.approx(a["global_accuracy"], abs=0.1)
    assert json.loads((runs["bf16"] / rf.CONFIG).read_text())["precision"] == "bf16"
    for run in runs.values():  # what eval reads and a resume starts from: float32 rows
        assert rf.load_state(run / rf.MODEL)["models"].dtype == torch.float32


def test_eval_of_a_bf16_run_scores_under_bf16(
    runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, torch.dtype]] = []
    forward = SequentialExecutor.forward

    def spy(self: SequentialExecutor, images: torch.Tensor) -> torch.Tensor:
        out = forward(self, images)
        seen.append((self.precision, out.dtype))
        return out

    monkeypatch.setattr(SequentialExecutor, "forward", spy)
    scores = {p: eval_stage(EvalConfig(run=str(run))) for p, run in runs.items()}
    assert {p for p, _ in seen} == {"fp32", "bf16"}  # each run with its own precision
    assert {dtype for _, dtype in seen} == {torch.float32}
    fp32, bf16 = scores["fp32"], scores["bf16"]
    for key in ("final_global_accuracy", "final_local_accuracy"):
        assert bf16[key] == pytest.approx(fp32[key], abs=0.1), key


@pytest.fixture
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here: defaults + options only


@pytest.mark.usefixtures("_isolated")
def test_an_unknown_precision_is_refused_in_one_line(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = runner.invoke(
        app, ["train", "--data", str(tiny_data), "--precision", "fp16", "--out", str(out)]
    )
    assert_one_line(result, "train.precision", "'fp16'", "bf16", code=2)
    assert not out.exists()


@pytest.mark.usefixtures("_isolated")
def test_resume_keeps_the_runs_precision(tiny_data: Path, tmp_path: Path) -> None:
    fast = ["--local-epochs", "1", "--batch-size", "16", "--clusters", "2", "--device", "cpu"]
    common = ["train", "--data", str(tiny_data), *fast]
    full, part = tmp_path / "full", tmp_path / "part"
    for out, rounds in ((full, "2"), (part, "1")):
        done = runner.invoke(
            app, [*common, "--precision", "bf16", "--rounds", rounds, "--out", str(out)]
        )
        assert done.exit_code == 0, done.output
    changed = runner.invoke(app, ["train", "--out", str(part), "--resume", "--precision", "fp32"])
    assert_one_line(changed, "--precision", "trained with 'bf16', not 'fp32'", code=2)
    resumed = runner.invoke(app, ["train", "--out", str(part), "--rounds", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((part / rf.CONFIG).read_text())["precision"] == "bf16"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(rf.read_metrics(part / rf.METRICS)) == strip(rf.read_metrics(full / rf.METRICS))
