"""The batched executor against the sequential reference: same parameters, losses, momentum."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ALGORITHMS, PROXIMAL, assert_metrics_close
from torch import nn

from pipeline.algorithms import ALGORITHMS as REGISTRY
from pipeline.common.errors import FedrcError
from pipeline.engine import BatchedExecutor, LocalTask, SequentialExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.models import build_model
from pipeline.run.resolve import make_config
from pipeline.run.training import run_training

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-3, batch_size=8, local_epochs=2)


def cnn() -> nn.Module:
    return build_model((16, 16, 1), 4, "cnn")


def batchnorm_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14, 4)
    )


def pair(build, **kw) -> tuple[SequentialExecutor, BatchedExecutor]:
    args = {**SGD, "drop_last": False, **kw}
    chunk = args.pop("chunk_tasks", None)
    torch.manual_seed(0)
    seq = SequentialExecutor(build(), torch.device("cpu"), **args)
    torch.manual_seed(0)
    bat = BatchedExecutor(build(), torch.device("cpu"), **args, chunk_tasks=chunk)
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
