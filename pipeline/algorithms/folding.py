"""Adding many model-sized vectors into float64 sums on the CPU without crossing memory for
each one: at 3,000 clients a FedRC round folds 9,000 results of 2.17 M parameters, and one
`add_` at a time reads and writes the 17 MB of a row's sums each time (about 2 ms a fold,
memory-bound; `benchmarks/many_clients.py`).

`fold_in_spans` adds a block of vectors span by span: a span of the sums stays in cache while
every vector's piece is added to it. Each element receives the same additions in the same
order as with one `add_` per vector, and every span's length is a multiple of any SIMD width,
so the numbers are bit for bit the same (`tests/test_folding.py`).
"""

from __future__ import annotations

import torch

FOLD_BLOCK = 4  # vectors of one row held before they are added (4 × 8.7 MB for the FMNIST CNN)
SPAN = 1 << 17  # elements of the sums per span: 1 MB of float64, with the vectors' pieces in L2/L3


def fold_in_spans(sums: torch.Tensor, pending: list[tuple[torch.Tensor, float]]) -> None:
    """sums += Σ w · v over `pending` (in order), one span of `sums` at a time."""
    if len(pending) == 1:
        vector, weight = pending[0]
        sums.add_(vector, alpha=weight)
        return
    for start in range(0, sums.numel(), SPAN):
        piece = sums[start : start + SPAN]
        for vector, weight in pending:
            piece.add_(vector[start : start + SPAN], alpha=weight)


def owns_its_memory(vector: torch.Tensor) -> bool:
    """Whether holding `vector` keeps nothing else alive (a row of a batched chunk of results
    would keep the whole chunk)."""
    return vector.is_contiguous() and vector.untyped_storage().nbytes() == vector.nbytes
