"""Logits of only the (model row, sample) pairs that someone reads.

A round used to run every model on every sample it touched, whatever the algorithm did with
the outputs: FeSEM, which assigns a client by the distance of its trained model to the centres,
paid for the per-sample losses of the K models all the same. Here the caller says which pairs
it needs (an (R, N) mask, from what each client's E-step or scoring reads), and each distinct
set of rows runs once over the samples that need exactly that set. Pairs not computed are NaN,
so an algorithm that reads what it did not ask for gets NaN losses, never silently other ones.

On the CPU a pair's numbers do not depend on which other samples or models share its pass
(evaluation's logits already served the next E-step to the bit, `test_golden.py`), so asking
for fewer pairs changes no number of a run: every built-in algorithm's runs are the same to
the bit (docs/performance.md). In eval mode nothing draws from a generator, so fewer passes
leave the random state as it was.
"""

from __future__ import annotations

import torch

from pipeline.engine.sequential import SequentialExecutor


def known(block: torch.Tensor) -> torch.Tensor:
    """(R, N) which pairs of a logits block (R, N, classes) hold values (NaN: not computed)."""
    return torch.isfinite(block).all(-1)


def logits_where(
    executor: SequentialExecutor,
    models: torch.Tensor,
    images: torch.Tensor,
    need: torch.Tensor,
    classes: int,
    cached: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """(R, N, classes) logits of `models` (R, P) on the N samples `images[index]` (default:
    all of `images`) wherever `need` (R, N) is True and `cached` (the result's shape, NaN where
    unknown) has no values yet; the cached values where it has them; NaN elsewhere. One
    executor call per distinct set of rows still missing, on the samples that miss exactly
    that set."""
    rows, count = need.shape
    missing = need.to(executor.device)
    if cached is not None:
        missing = missing & ~known(cached.to(executor.device))
    if index is None:
        index = torch.arange(count, device=images.device)
    if bool(missing.all()):  # every pair: the plain pass over everything
        return executor.logits(models, images[index])
    out = cached if cached is not None else torch.full((rows, count, classes), float("nan"))
    out = out.to(executor.device)
    patterns, which = torch.unique(missing.T, dim=0, return_inverse=True)
    for p, pattern in enumerate(patterns.tolist()):
        chosen = [r for r, wanted in enumerate(pattern) if wanted]
        if not chosen:
            continue
        at = (which == p).nonzero().flatten()
        part = models if len(chosen) == rows else models[chosen]
        values = executor.logits(part, images[index[at.to(index.device)]])
        out[torch.tensor(chosen, device=out.device)[:, None], at.to(out.device)] = values.to(out)
    return out


def rows_mask(rows: int, count: int, chosen: tuple[int, ...]) -> torch.Tensor:
    """(rows, count) True on the `chosen` rows: one client's need over its samples."""
    mask = torch.zeros(rows, count, dtype=torch.bool)
    mask[list(chosen)] = True
    return mask
