"""Runs that share the batched executor's steps (pipeline.engine.cohort, `fedrc sweep
--together`): each run's local trainings, and whole runs, equal the run trained alone."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from conftest import assert_metrics_close
from test_batched import batchnorm_net, cnn, jobs
from test_sweep import benchmark, here, invoke  # noqa: F401 (fixtures)

from pipeline.engine import BatchedExecutor
from pipeline.engine.cohort import Cohort
from pipeline.engine.sequential import NonFiniteLoss

SGD = dict(momentum=0.9, batch_size=8, local_epochs=2, drop_last=False)


def executor(build, **kw) -> BatchedExecutor:
    torch.manual_seed(0)
    args = {**SGD, "lr": 0.05, "weight_decay": 1e-3, **kw}
    return BatchedExecutor(build(), torch.device("cpu"), **args)


def alone(ex: BatchedExecutor, work: list) -> list:
    return ex.train_tasks(work, [ex] * len(work))


def together(executors: list[BatchedExecutor], works: list[list], cohort: Cohort) -> list:
    """Each executor's `stream` in a thread of its own, all members of `cohort`."""
    results: list = [None] * len(executors)

    def member(i: int) -> None:
        try:
            results[i] = [r for _, r in executors[i].stream(works[i])]
        except NonFiniteLoss as e:
            results[i] = e
        finally:
            cohort.leave()

    for ex in executors:
        ex.cohort = cohort
        cohort.join()
    threads = [threading.Thread(target=member, args=(i,)) for i in range(len(executors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def assert_equal_results(got: list, expected: list) -> None:
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b.params, a.params, atol=1e-5, rtol=0)
        assert b.loss_sum == pytest.approx(a.loss_sum, rel=1e-5)
        assert (a.momentum is None) == (b.momentum is None)
        if a.momentum is not None:
            torch.testing.assert_close(b.momentum, a.momentum, atol=1e-5, rtol=0)


@pytest.mark.parametrize("build", [cnn, batchnorm_net])
def test_runs_with_their_own_sgd_numbers_train_in_one_step(build) -> None:
    """Three runs of one model with their own lr, weight decay, momentum, batch size and
    epochs: each run's results equal its own executor's alone, and the cohort trained them in
    shared turns (it waits for every member, so each turn holds a chunk of each)."""
    executors = [
        executor(build),
        executor(build, lr=0.2, weight_decay=0.0),
        executor(build, lr=0.01, momentum=0.0, batch_size=5, local_epochs=1),
    ]
    works = [jobs(ex) for ex in executors]
    expected = [alone(ex, w) for ex, w in zip(executors, works)]
    cohort = Cohort(patience_s=30.0)
    got = together(executors, works, cohort)
    for g, e in zip(got, expected, strict=True):
        assert_equal_results(g, e)
    assert cohort.chunks == 3 and cohort.turns == 1


def test_other_models_wait_for_a_turn_of_their_own() -> None:
    executors = [executor(cnn), executor(batchnorm_net)]
    works = [jobs(ex) for ex in executors]
    expected = [alone(ex, w) for ex, w in zip(executors, works)]
    cohort = Cohort(patience_s=30.0)
    got = together(executors, works, cohort)
    for g, e in zip(got, expected, strict=True):
        assert_equal_results(g, e)
    assert cohort.turns == 2


def test_a_run_that_diverges_stops_alone() -> None:
    """A learning rate that sends one run's loss to inf: that run gets NonFiniteLoss, naming
    its own first bad task; the other run gets its results."""
    executors = [executor(cnn), executor(cnn, lr=1e30)]
    works = [jobs(ex) for ex in executors]
    expected = alone(executors[0], works[0])
    got = together(executors, works, Cohort(patience_s=30.0))
    assert_equal_results(got[0], expected)
    assert isinstance(got[1], NonFiniteLoss)
    assert got[1].job is not None and got[1].job in works[1]


def rows(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]


def test_a_sweep_trained_together_equals_the_sweep_one_by_one(benchmark: Path) -> None:  # noqa: F811
    """`fedrc sweep --together 3` (the batched executor) against the same grid point by
    point: each run's metrics within the batched executor's tolerance."""
    grid = ["--grid", "algorithm=fedavg,ifca,fedrc", "--grid", "lr=0.05,0.1", "--no-plots"]
    batched = ["--grid", "executor=batched"]
    one = invoke("sweep", *grid, *batched, "--out", "runs/one")
    assert one.exit_code == 0, one.output
    three = invoke("sweep", *grid, *batched, "--out", "runs/three", "--together", "3")
    assert three.exit_code == 0, three.output
    names = sorted(p.name for p in (benchmark / "runs/one").iterdir() if p.is_dir())
    assert len(names) == 6
    for name in names:
        expected, got = rows(benchmark / "runs/one" / name), rows(benchmark / "runs/three" / name)
        assert_metrics_close(expected, got, loss_tolerance=1e-4)


def test_together_and_jobs_do_not_mix(here: Path) -> None:  # noqa: F811
    result = invoke("sweep", "--grid", "seed=0,1", "--together", "2", "--jobs", "2")
    assert result.exit_code == 2
    assert "--together" in result.output and "--jobs" in result.output
