"""The batched executor against the sequential reference: same parameters, losses, momentum."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import ALGORITHMS, PROXIMAL, assert_metrics_close
from torch import nn

from pipeline.algorithms import ALGORITHMS as REGISTRY
from pipeline.common.errors import FedrcError
from pipeline.engine import BatchedExecutor, LocalTask, SequentialExecutor
from pipeline.engine.im2col import Im2colConv2d, conv_path, with_im2col
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.models import build_model
from pipeline.models.settings import TorchvisionSettings
from pipeline.run.resolve import make_config
from pipeline.run.training import run_training

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-3, batch_size=8, local_epochs=2)


def cnn() -> nn.Module:
    return build_model((16, 16, 1), 4, "cnn")


def batchnorm_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14, 4)
    )


def strided_net() -> nn.Module:
    """Convolutions with stride, padding, dilation, a non-square kernel, no bias, BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 8, (3, 2), stride=(1, 2), padding=(2, 0), dilation=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 3, 4),
    )


def depthwise_net() -> nn.Module:
    """A plain convolution (im2col) before a depthwise one (vmap's own rule)."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.Conv2d(4, 4, 3, padding=1, groups=4),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 14 * 14, 4),
    )


def refused_net() -> nn.Module:
    """No convolution that im2col takes: reflection padding, then a depthwise convolution."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect"),
        nn.Conv2d(4, 4, 3, groups=4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 14 * 14, 4),
    )


def pair(build, **kw) -> tuple[SequentialExecutor, BatchedExecutor]:
    args = {**SGD, "drop_last": False, **kw}
    chunk = args.pop("chunk_tasks", None)
    conv = args.pop("conv", "auto")
    torch.manual_seed(0)
    seq = SequentialExecutor(build(), torch.device("cpu"), **args)
    torch.manual_seed(0)
    bat = BatchedExecutor(build(), torch.device("cpu"), **args, chunk_tasks=chunk, conv=conv)
    return seq, bat


def jobs(ex: SequentialExecutor) -> list:
    """Clients of different sizes (partial last batches, fewer steps, fewer than a batch), two
    tasks sharing one client's data, γ weights, a proximal, an offset and a momentum task."""
    gen = torch.Generator().manual_seed(1)
    start = ex.flatten()
    out = []
    for i, n in enumerate([20, 20, 13, 8, 5, 17]):
        if i != 1:  # task 1 trains on task 0's client (another model row)
            x = torch.randint(0, 256, (n, 1, 16, 16), generator=gen, dtype=torch.uint8)
            y = torch.randint(0, 4, (n,), generator=gen)
        task = LocalTask(0, start + 0.01 * torch.randn(start.shape, generator=gen), torch.rand(n))
        if i == 2:
            task.anchor, task.mu = start, 0.5
        if i == 3:
            task.offset = torch.randn(n, 4, generator=gen)
        if i == 4:
            task.momentum = 0.01 * torch.randn(ex.num_trainable, generator=gen)
        if i == 5:
            task.momentum = torch.zeros(ex.num_trainable)
        out.append((task, x, y, 100 + i))
    return out


def assert_same(seq: SequentialExecutor, bat: BatchedExecutor) -> None:
    work = jobs(seq)
    for a, b in zip(seq.train_many(work), bat.train_many(work), strict=True):
        torch.testing.assert_close(b.params, a.params, atol=1e-5, rtol=0)
        assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5)
        assert (a.momentum is None) == (b.momentum is None)
        if a.momentum is not None:
            torch.testing.assert_close(b.momentum, a.momentum, atol=1e-5, rtol=0)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("chunk", [None, 4])
def test_cnn_matches_sequential(drop_last: bool, chunk: int | None) -> None:
    assert_same(*pair(cnn, drop_last=drop_last, chunk_tasks=chunk))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_batchnorm_and_running_statistics_match(momentum: float) -> None:
    seq, bat = pair(batchnorm_net, momentum=momentum, chunk_tasks=4)
    assert bat.num_params > bat.num_trainable  # the running statistics travel too
    assert_same(seq, bat)


def test_logits_match_and_single_train_delegates() -> None:
    seq, bat = pair(batchnorm_net)
    task, x, y, seed = jobs(seq)[2]
    models = torch.stack([seq.flatten(), task.start, task.anchor])
    torch.testing.assert_close(bat.logits(models, x), seq.logits(models, x), atol=1e-5, rtol=0)
    torch.testing.assert_close(bat.losses(models, x, y), seq.losses(models, x, y))
    one, ref = bat.train(task, x, y, seed), seq.train(task, x, y, seed)
    torch.testing.assert_close(one.params, ref.params, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("build", [cnn, strided_net, depthwise_net])
def test_im2col_matches_sequential_and_grouped(build, chunk: int | None) -> None:
    seq, im2col = pair(build, conv="im2col", chunk_tasks=chunk)
    grouped = pair(build, conv="grouped", chunk_tasks=chunk)[1]
    assert any(isinstance(m, Im2colConv2d) for m in im2col.vmapped.modules())
    assert not any(isinstance(m, Im2colConv2d) for m in im2col.model.modules())
    assert grouped.vmapped is grouped.model
    assert_same(seq, im2col)
    assert_same(grouped, im2col)


def test_im2col_only_takes_plain_convolutions() -> None:
    convs = [type(m) for m in with_im2col(depthwise_net()).modules() if isinstance(m, nn.Conv2d)]
    assert convs == [Im2colConv2d, nn.Conv2d]  # the depthwise one keeps vmap's rule
    grouped, refused = pair(refused_net, conv="grouped")[1], pair(refused_net, conv="im2col")[1]
    assert refused.vmapped is refused.model
    work = jobs(grouped)
    for a, b in zip(grouped.train_many(work), refused.train_many(work), strict=True):
        assert torch.equal(a.params, b.params) and a.loss_sum == b.loss_sum


@pytest.mark.parametrize(
    ("name", "norm", "reference"),
    [("resnet18", "batch", "sequential"), ("mobilenet_v2", "group", "grouped")],
)
def test_im2col_trains_torchvision_nets(name: str, norm: str, reference: str) -> None:
    """ResNet18's BatchNorm against the sequential executor; MobileNetV2's depthwise layers
    (vmap's rule) and dropout against the grouped path, which draws the same masks. One full
    batch per task: further steps of these deep nets on tiny data drift apart beyond rounding
    between any two executors, today's included."""
    build = partial(build_model, (32, 32, 3), 4, name, TorchvisionSettings(norm=norm))
    args = dict(batch_size=8, local_epochs=1, lr=0.01)
    seq, im2col = pair(build, conv="im2col", **args)
    ref = seq if reference == "sequential" else pair(build, conv="grouped", **args)[1]
    gen = torch.Generator().manual_seed(1)
    start = seq.flatten()
    work = [
        (
            LocalTask(0, start + 0.01 * torch.randn(start.shape, generator=gen), torch.rand(8)),
            torch.randint(0, 256, (8, 3, 32, 32), generator=gen, dtype=torch.uint8),
            torch.randint(0, 4, (8,), generator=gen),
            i,
        )
        for i in range(2)
    ]
    results = []
    for ex in (ref, im2col):
        torch.manual_seed(3)  # the dropout masks
        results.append(ex.train_many(work))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b.params, a.params, atol=1e-5, rtol=0)
        assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5)


@pytest.mark.parametrize("build", [cnn, strided_net])
def test_im2col_logits_match(build) -> None:
    seq, bat = pair(build, conv="im2col")
    task, x, y, seed = jobs(seq)[2]
    bat.train(task, x, y, seed)  # BatchNorm's running statistics away from their start
    models = torch.stack([seq.flatten(), task.start, task.anchor])
    torch.testing.assert_close(bat.logits(models, x), seq.logits(models, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_im2col_convolution_outside_vmap_is_conv2d(precision: str) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    outs, grads = [], []
    for module in (conv, with_im2col(conv)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = module(x)
        outs.append(out)
        grads.append(torch.autograd.grad(out.float().square().sum(), [x, *module.parameters()]))
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*grads, strict=True):
        assert b.dtype == a.dtype
        torch.testing.assert_close(b, a)


def test_conv_option_and_memory_estimate() -> None:
    assert conv_path("auto", torch.device("cpu")) == "grouped"
    assert conv_path("auto", torch.device("cuda")) == "im2col"
    with pytest.raises(ValueError, match="conv: expected one of"):
        pair(cnn, conv="winograd")
    images = torch.zeros(1, 1, 16, 16, dtype=torch.uint8)
    grouped, im2col = pair(cnn, conv="grouped")[1], pair(cnn, conv="im2col")[1]
    columns = 25 * 12 * 12 + 32 * 25 * 2 * 2  # C·kh·kw × H'·W' of each convolution
    assert im2col._activations(images) == grouped._activations(images) + columns


def test_non_finite_loss_names_the_task() -> None:
    for ex in pair(cnn, chunk_tasks=2):
        work = jobs(ex)
        work[3][0].weights[0] = float("nan")
        with pytest.raises(NonFiniteLoss) as info:
            ex.train_many(work)
        assert info.value.index == 3


def algorithm_class(name: str) -> type:
    return REGISTRY.get(name)


def metrics(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


@pytest.mark.parametrize(
    ("algorithm", "profile"),
    [(a, "paper") for a in ALGORITHMS] + [("fedrc", "reference")],  # + wd, drop_last, momentum
)
def test_training_matches_sequential_end_to_end(
    algorithm: str, profile: str, tiny_data: Path, tmp_path: Path
) -> None:
    extra = {"mu": 0.1} if algorithm in PROXIMAL else {}
    if profile == "reference":
        extra.update(weight_decay=5e-4, drop_last=True, persistent_momentum=True)
    if algorithm.endswith("-cam"):
        extra["warmup_rounds"] = 1
    if getattr(algorithm_class(algorithm), "needs_sequential", False):  # staged tasks: refused
        config = make_config(data=str(tiny_data), algorithm=algorithm, executor="batched")
        with pytest.raises(FedrcError, match=r"^train\.executor: .* only the sequential"):
            run_training(config)
        return
    runs = {}
    for executor in ("sequential", "batched"):
        config = make_config(
            data=str(tiny_data),
            algorithm=algorithm,
            profile=profile,
            rounds=2,
            local_epochs=1,
            batch_size=16,
            lr=0.05,
            clusters=2,
            device="cpu",
            executor=executor,
            out=str(tmp_path / executor),
            **extra,
        )
        runs[executor] = metrics(run_training(config))
    assert_metrics_close(runs["sequential"], runs["batched"], loss_tolerance=1e-4)
