"""The batched executor's step under torch.compile (`compile=True`, pipeline.engine.compiled)
against the eager batched step: the same parameters, losses, momentum and BatchNorm statistics
within the batched-vs-sequential tolerance. Each compiles for half a minute on a 2-core CPU
(slow); the GPU check's dry run (CI) compiles and compares one round (compiled_step.py)."""

from __future__ import annotations

import pytest
import torch
from test_batched import SGD, batchnorm_net, cnn, jobs
from test_cohort import assert_equal_results
from torch._dynamo.utils import counters

from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.engine import BatchedExecutor, LocalTask
from pipeline.run.resolve import make_config
from pipeline.run.setup import make_executor


def pair(build, **kw) -> tuple[BatchedExecutor, BatchedExecutor]:
    """The eager and the compiled batched executor of one model."""
    out = []
    for compile in (False, True):
        torch.manual_seed(0)
        args = {**SGD, "drop_last": False, **kw}
        out.append(BatchedExecutor(build(), torch.device("cpu"), **args, compile=compile))
    return out[0], out[1]


def even_jobs(ex: BatchedExecutor) -> list:
    """Clients of one size (every step one batch shape): γ weights, a proximal task, logit
    offsets and a momentum task, as in test_batched's `jobs`."""
    gen = torch.Generator().manual_seed(2)
    start = ex.flatten()
    out = []
    for i in range(4):
        x = torch.randint(0, 256, (16, 1, 16, 16), generator=gen, dtype=torch.uint8)
        y = torch.randint(0, 4, (16,), generator=gen)
        task = LocalTask(0, start + 0.01 * torch.randn(start.shape, generator=gen), torch.rand(16))
        if i == 1:
            task.anchor, task.mu = start, 0.5
        if i == 2:
            task.offset = torch.randn(16, 4, generator=gen)
        if i == 3:
            task.momentum = 0.01 * torch.randn(ex.num_trainable, generator=gen)
        out.append((task, x, y, 100 + i))
    return out


@pytest.mark.slow
def test_compiled_step_matches_eager_and_a_new_lr_is_no_new_shape() -> None:
    eager, compiled = pair(cnn)
    work = even_jobs(eager)
    assert_equal_results(compiled.train_many(work), eager.train_many(work))
    assert len(compiled.compiled.keys) == 1  # four steps of one shape
    graphs = counters["stats"]["unique_graphs"]
    for ex in (eager, compiled):
        ex.lr = 0.02  # as a schedule sets it between rounds
    assert_equal_results(compiled.train_many(work), eager.train_many(work))
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled again


@pytest.mark.slow
def test_shapes_past_the_limit_run_eagerly_with_batchnorm() -> None:
    """Clients of many sizes (partial batches: a new shape at nearly every step) and
    BatchNorm's running statistics; one shape compiled, the others eager, one warning."""
    eager, compiled = pair(batchnorm_net)
    compiled.compiled.shapes = 1
    work = jobs(eager)
    with pytest.warns(FedrcWarning, match="more than 1 batch shapes") as caught:
        assert_equal_results(compiled.train_many(work), eager.train_many(work))
    assert len(caught) == 1 and len(compiled.compiled.keys) == 1


def test_compile_needs_the_batched_executor_and_sgd() -> None:
    config = make_config(executor="sequential", compile=True, device="cpu")
    with pytest.raises(FedrcError, match=r"^train\.compile: .* sequential"):
        make_executor(config, None, torch.device("cpu"))
    with pytest.raises(FedrcError, match=r"^train\.compile: compiles SGD's local step only"):
        make_config(executor="batched", compile=True, optimizer="adam")
    with pytest.raises(ValueError, match="compile: compiles SGD's step, not adamw's"):
        pair(cnn, optimizer="adamw")
