"""What only a GPU can show, run by `benchmarks/gpu_check.sh` (skipped where torch sees no GPU):
the batched executor on CUDA against the sequential one for every algorithm, both convolution
paths against the CPU, bf16 autocast, chunk sizing from free GPU memory, the compiled step
(CUDA graphs) against the eager one, and a checkpoint written on CUDA resumed on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ALGORITHMS, PROXIMAL, assert_metrics_close
from test_batched import SGD, cnn, depthwise_net, jobs, pair, strided_net

from pipeline.algorithms import BUILT_IN
from pipeline.config import TrainConfig
from pipeline.engine import BatchedExecutor
from pipeline.models import build_model
from pipeline.run import files as rf
from pipeline.run import momentum as momentum_module
from pipeline.run.resolve import make_config
from pipeline.stages import train_stage

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU"),
]


def config(data: Path, out: Path, algorithm: str, **extra) -> TrainConfig:
    values = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2, eval_every=1)
    if algorithm in PROXIMAL:
        values["mu"] = 0.1
    if algorithm.endswith("-cam"):
        values["warmup_rounds"] = 1
    return make_config(data=str(data), algorithm=algorithm, out=str(out), **{**values, **extra})


BATCHABLE = [a for a in ALGORITHMS if not BUILT_IN[a].load().needs_sequential]  # not staged


def test_staged_algorithms_are_not_batched() -> None:
    assert "fedccfa" not in BATCHABLE and "fedrc" in BATCHABLE


@pytest.mark.parametrize("algorithm", BATCHABLE)
def test_batched_on_cuda_matches_sequential_on_cuda(
    algorithm: str, tiny_data: Path, tmp_path: Path
) -> None:
    runs = {}
    for executor in ("sequential", "batched"):
        out = tmp_path / executor
        run = train_stage(config(tiny_data, out, algorithm, device="cuda", executor=executor))
        runs[executor] = rf.read_metrics(run / rf.METRICS)
        for row in runs[executor]:
            row.pop("seconds")
    assert_metrics_close(runs["sequential"], runs["batched"], loss_tolerance=1e-3)


@pytest.mark.parametrize("build", [cnn, strided_net, depthwise_net])
def test_both_conv_paths_on_cuda_match_the_cpu(build, monkeypatch: pytest.MonkeyPatch) -> None:
    """im2col and vmap's grouped convolution on CUDA against the CPU's sequential executor, in
    strict fp32 (cuDNN's convolutions use TF32 by default, the im2col products do not)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert torch.get_float32_matmul_precision() == "highest"  # torch's default: no TF32
    seq = pair(build)[0]
    work = jobs(seq)
    expected = seq.train_many(work)
    for conv in ("grouped", "im2col"):
        torch.manual_seed(0)  # the model of `pair`
        ex = BatchedExecutor(build(), torch.device("cuda"), **SGD, drop_last=False, conv=conv)
        for a, b in zip(expected, ex.train_many(work), strict=True):
            torch.testing.assert_close(b.params.cpu(), a.params, atol=1e-5, rtol=0)
            assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5)
            if a.momentum is not None:
                torch.testing.assert_close(b.momentum.cpu(), a.momentum, atol=1e-5, rtol=0)


def test_bf16_autocast_trains_close_to_fp32(tiny_data: Path, tmp_path: Path) -> None:
    losses = {}
    for precision in ("fp32", "bf16"):
        values = dict(device="cuda", executor="batched", precision=precision)
        run = train_stage(config(tiny_data, tmp_path / precision, "fedavg", **values))
        losses[precision] = [r["train_loss"] for r in rf.read_metrics(run / rf.METRICS)]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    assert losses["bf16"] != losses["fp32"]  # autocast did run in bfloat16


def test_chunk_size_follows_free_gpu_memory() -> None:
    device = torch.device("cuda")
    sgd = dict(lr=0.1, momentum=0.9, weight_decay=0.0, batch_size=128, local_epochs=1)
    executor = BatchedExecutor(build_model((28, 28, 1), 10, "cnn"), device, **sgd, drop_last=False)
    images = torch.zeros(4, 1, 28, 28, dtype=torch.uint8, device=device)
    chunk = executor.auto_chunk(images)
    free, _ = torch.cuda.mem_get_info(device)
    per_task = 4 * 6 * executor.num_params  # the estimate's parameter part alone
    assert 1 <= chunk <= free // per_task


def test_cuda_checkpoint_resumes_on_the_cpu(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train_stage(config(tiny_data, out, "fedrc", device="cuda", rounds=1))
    state = rf.load_state(out / rf.CHECKPOINT)  # read with map_location="cpu"
    assert state["models"].device.type == "cpu"
    train_stage(config(tiny_data, out, "fedrc", device="cpu", rounds=2), resume=True)
    rows = rf.read_metrics(out / rf.METRICS)
    assert [r["round"] for r in rows] == [1, 2]
    assert torch.isfinite(rf.load_state(out / rf.MODEL)["models"]).all()


def test_persistent_momentum_stays_on_the_gpu(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffers kept on the GPU train as the live file does, through a checkpoint and a
    resume, and write no live file."""
    extra = dict(
        device="cuda", executor="batched", chunk_clients=4, persistent_momentum=True, rounds=3
    )
    stores = []
    keep = momentum_module.MomentumStore.close
    monkeypatch.setattr(
        momentum_module.MomentumStore,
        "close",
        lambda self: (stores.append(self.in_memory), keep(self)),
    )
    on_gpu = tmp_path / "gpu"
    train_stage(config(tiny_data, on_gpu, "fedrc", **{**extra, "rounds": 2}))
    train_stage(config(tiny_data, on_gpu, "fedrc", **extra), resume=True)
    monkeypatch.setattr(momentum_module, "GPU_SHARE", 0.0)  # the live file, as before
    on_disk = train_stage(config(tiny_data, tmp_path / "disk", "fedrc", **extra))
    assert stores == [True, True, False]
    ours, theirs = rf.load_state(on_gpu / rf.MODEL), rf.load_state(on_disk / rf.MODEL)
    assert torch.allclose(ours["models"], theirs["models"], rtol=0, atol=1e-4)


def test_compiled_step_matches_eager_on_cuda(tiny_data: Path, tmp_path: Path) -> None:
    """`compile` on CUDA (CUDA graphs, `mode="reduce-overhead"`): each step's outputs are the
    next step's inputs, chunk after chunk (a smaller last one) and round after round; the run
    equals the eager step's."""
    extra = dict(
        device="cuda", executor="batched", chunk_clients=4, persistent_momentum=True, rounds=3
    )
    runs = {}
    for compile in (False, True):
        out = tmp_path / f"compile-{compile}"
        run = train_stage(config(tiny_data, out, "fedrc", **extra, compile=compile))
        runs[compile] = rf.read_metrics(run / rf.METRICS)
        for row in runs[compile]:
            row.pop("seconds")
    assert_metrics_close(runs[False], runs[True], loss_tolerance=1e-3)
