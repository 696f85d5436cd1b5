"""Whether a checkpoint covers an algorithm's state: a resume builds a fresh algorithm and loads
the checkpoint's `state_dict` into it, so anything the live algorithm keeps outside its
`state_dict` restarts from `init_state` and the resumed run drifts silently from an unbroken one.

`uncovered` replays that resume on a fresh algorithm and names the attributes that come out
different. Names starting with `_` hold one round's work (the contract's convention, e.g.
`_updates`), and `ROUND_ONLY` lists the base's own such attributes and its construction
arguments: neither has to survive a restart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.algorithms.base import Algorithm

# the base's construction arguments and the round's running sums (`begin_round` → `aggregate`)
ROUND_ONLY = frozenset(
    {"num_models", "num_clients", "num_classes", "config", "settings", "head", "sums", "totals"}
)
DEPTH = 8  # how deep `same` follows containers and objects' attributes


def uncovered(live: Algorithm, fresh: Algorithm) -> list[str]:
    """The attributes of `live` that a resume would not restore: `fresh`, a new algorithm of
    the same run (straight from `init_state`), is given `live.state_dict()` and compared with
    `live`, attribute by attribute. `fresh` is changed; `live` is not."""
    fresh.load_state_dict(live.state_dict())
    restored = vars(fresh)
    missing = object()
    return [
        name
        for name, value in vars(live).items()
        if not name.startswith("_")
        and name not in ROUND_ONLY
        and not same(value, restored.get(name, missing))
    ]


def same(a: Any, b: Any, depth: int = DEPTH) -> bool:
    """Equal values: tensors and arrays by shape and elements (NaN equals NaN), containers
    element by element, generators by state, other objects by their attributes."""
    if a is b:
        return True
    if depth == 0:
        return True  # too deep to tell: not reported
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _same_tensor(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and _same_array(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], depth - 1) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y, depth - 1) for x, y in zip(a, b))
    if isinstance(a, torch.Generator):
        return torch.equal(a.get_state(), b.get_state())
    if isinstance(a, np.random.Generator):
        return a.bit_generator.state == b.bit_generator.state
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):
        return same(vars(a), vars(b), depth - 1)
    try:
        return bool(a == b) or (a != a and b != b)  # NaN == NaN here
    except (TypeError, ValueError, RuntimeError):
        return True  # not comparable: not reported


def _same_tensor(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    equal_nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=equal_nan))
