"""Where things sit in a model's flat vector (parameters in `model.parameters()` order)."""

from __future__ import annotations

from torch import nn


def head_range(model: nn.Module) -> tuple[int, int]:
    """[start, stop) of the final layer's parameters: the last module that owns parameters
    (the classifier of the CNN, MobileNetV2 and ResNet18). Everything else is the body."""
    owner = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))][-1]
    mine = {id(p) for p in owner.parameters(recurse=False)}
    offset, start, stop = 0, None, None
    for p in model.parameters():
        if id(p) in mine:
            start = offset if start is None else start
            stop = offset + p.numel()
        offset += p.numel()
    return start, stop
