"""The corruption functions of each suite and `corrupt`, the one entry point (the names alone,
without torch: `names`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pipeline.data.corruptions import colour, grey
from pipeline.data.corruptions.names import (
    COLOUR_NAMES,
    GREY_NAMES,
    IDENTITY,
    check_style,
)

# float images (N, C, H, W) in [0, 1], severity 1..5, the generator → images of the same shape
Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]

GREY_SUITE: dict[str, Corruption] = {name: getattr(grey, name) for name in GREY_NAMES}
COLOUR_SUITE: dict[str, Corruption] = {name: getattr(colour, name) for name in COLOUR_NAMES}
SUITES: dict[int, tuple[str, dict[str, Corruption]]] = {
    1: ("grey", GREY_SUITE),
    3: ("colour", COLOUR_SUITE),
}


def corrupt(images: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """Apply corruption `name` at `severity` (1..5) to uint8 images (N, H, W, C).

    The suite follows C (1: grey, 3: colour). Randomness is fresh for every image and a pure
    function of `seed` and the batch, so the same call gives the same pixels.
    """
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer):
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    if not 1 <= severity <= 5:
        raise ValueError(f"severity must be in 1..5, got {severity}")
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(f"expected uint8 images (N, H, W, C), got {images.dtype} {images.shape}")
    check_style(name, images.shape[-1])
    if name == IDENTITY or len(images) == 0:
        return images.copy()
    function = SUITES[images.shape[-1]][1][name]  # check_style vouched for the channels
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(images.astype(np.float32)).permute(0, 3, 1, 2) / 255
    with torch.no_grad():
        y = function(x, int(severity), gen).clamp(0, 1)
    return (y * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
