"""Checks that turn silent numerical trouble into a one-line FedrcError naming where it arose."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.common.errors import FedrcError


def non_finite_keys(values: Any, prefix: str = "") -> list[str]:
    """The keys of a (nested) dict of numbers whose value is NaN or infinite."""
    if isinstance(values, dict):
        return [k for key, v in values.items() for k in non_finite_keys(v, f"{prefix}{key}.")]
    if isinstance(values, float) and not math.isfinite(values):
        return [prefix.rstrip(".")]
    return []


def require_finite(
    where: str, scores: dict[str, Any], logits: torch.Tensor | None, hint: str | None = None
) -> None:
    """Refuse NaN / inf logits or scores: the models diverged (or the weights are damaged);
    `hint` says what to change (default: retrain with a lower --lr)."""
    bad = []
    if logits is not None and not bool(torch.isfinite(logits).all()):
        bad.append("logits")
    bad += non_finite_keys(scores)
    if bad:
        hint = hint or "retrain with a lower --lr"
        raise FedrcError(f"{where}: non-finite {', '.join(bad[:3])} — the models diverged; {hint}")
