"""Folding results into an algorithm's float64 sums a block at a time (`pipeline.algorithms
.folding`): the same numbers, bit for bit, as one `add_` per result."""

from __future__ import annotations

import pytest
import torch

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.folding import FOLD_BLOCK, SPAN, fold_in_spans, owns_its_memory
from pipeline.resolve import make_config


def vectors(size: int, count: int, seed: int = 0) -> list[tuple[torch.Tensor, float]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, generator=g) * 3, float(torch.rand(1, generator=g)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [1000, 2 * SPAN + 13])  # one short span; several and a tail
def test_spans_give_the_same_bits_as_one_add_per_vector(threads: int, size: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        pending = vectors(size, FOLD_BLOCK)
        one_by_one = start.clone()
        for vector, weight in pending:
            one_by_one.add_(vector, alpha=weight)
        spans = start.clone()
        fold_in_spans(spans, pending)
        assert torch.equal(spans, one_by_one)
    finally:
        torch.set_num_threads(before)


def test_a_row_of_a_batch_of_results_is_not_held() -> None:
    batch = torch.zeros(3, 10)
    assert not owns_its_memory(batch[1])  # holding it would keep the whole batch
    assert owns_its_memory(batch[1].clone())


def test_the_sums_read_mid_block_include_every_fold() -> None:
    algorithm = build_algorithm(make_config(algorithm="fedavg"), 4, 3)
    size = SPAN + 5
    algorithm.begin_round(torch.zeros(1, size))
    expected = torch.zeros(size, dtype=torch.float64)
    for count, (vector, weight) in enumerate(vectors(size, FOLD_BLOCK + 2), 1):
        algorithm.accumulate(0, vector, weight)
        expected.add_(vector, alpha=weight)
        assert torch.equal(algorithm.sums[0], expected), count  # reading folds what waits
    batch = torch.ones(2, size)
    algorithm.accumulate(0, batch[0], 0.5)  # a view: added at once, not held
    assert not algorithm._pending
    assert algorithm.totals[0] == pytest.approx(
        sum(w for _, w in vectors(size, FOLD_BLOCK + 2)) + 0.5
    )


def test_a_vector_added_at_once_comes_after_those_waiting() -> None:
    algorithm = build_algorithm(make_config(algorithm="fedavg"), 4, 3)
    size = SPAN + 5
    algorithm.begin_round(torch.zeros(1, size))
    pending = vectors(size, 2)
    batch = torch.randn(2, size, generator=torch.Generator().manual_seed(3))
    expected = torch.zeros(size, dtype=torch.float64)
    for vector, weight in [*pending, (batch[1], 0.25)]:
        algorithm.accumulate(0, vector, weight)
        expected.add_(vector, alpha=weight)
    assert 0 not in algorithm._pending  # what waited was added first
    assert torch.equal(algorithm.sums[0], expected)
