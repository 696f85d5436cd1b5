"""Random layers painted over images: liquid (spatter), water shading, frost.

Layers are synthesised at a reference size (the suite's 28 or 32 px) with the published
parameters and resized to the image by the caller, so a 64-px image gets the same pattern,
larger, rather than a different one.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from pipeline.data.corruptions import ops


def liquid(
    n: int, size: int, loc: float, spread: float, sigma: float, threshold: float, gen
) -> torch.Tensor:
    """Spatter's liquid layer (n, 1, size, size): smoothed Gaussian noise, zero below threshold."""
    layer = ops.gaussian_blur(loc + spread * torch.randn(n, 1, size, size, generator=gen), sigma)
    return torch.where(layer < threshold, 0.0, layer)


def mud(layer: torch.Tensor, threshold: float, soften: float) -> torch.Tensor:
    """Opaque blots where the liquid is, softened and cut at 0.8 (opacity in [0, 1])."""
    mask = ops.gaussian_blur((layer > threshold).float(), soften)
    return torch.where(mask < 0.8, 0.0, mask)


def _equalise(v: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation of integer images 0..255 (N, 1, H, W), each on its own histogram
    (OpenCV's `equalizeHist`)."""
    n = v.shape[0]
    flat = v.reshape(n, -1).long()
    hist = torch.zeros(n, 256).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float32))
    cdf = hist.cumsum(1)
    first = torch.gather(cdf, 1, flat.min(1, keepdim=True).values)  # count of the lowest value
    total = cdf[:, -1:]
    span = (total - first).clamp(min=1)
    lut = ((cdf - first) * 255 / span).round().clamp(0, 255)
    lut = torch.where(total > first, lut, torch.arange(256.0).expand(n, 256))
    return torch.gather(lut, 1, flat).view_as(v)


_EMBOSS = torch.tensor([[-2.0, -1.0, 0.0], [-1.0, 1.0, 1.0], [0.0, 1.0, 2.0]])


def water(layer: torch.Tensor) -> torch.Tensor:
    """CIFAR-10-C's water-drop shading of a liquid layer, normalised to a peak of 1.

    The published chain, step by step on 8-bit values: Canny edges of the layer (thresholds
    50/150), the distance to the nearest edge capped at 20, a 3×3 mean, histogram equalisation,
    an emboss filter saturated to 0..255, another 3×3 mean; the shading is the layer times that.
    """
    n = layer.shape[0]
    layer8 = (layer * 255).floor().clamp(0, 255)
    edges = ops.canny(layer8, sigma=0, low=50, high=150, l2=False)[:, 0].numpy()
    dist = np.full(edges.shape, 20.0, dtype=np.float32)
    has_edges = edges.any(axis=(1, 2))
    if has_edges.any():
        # one call for the batch: a huge spacing between images keeps distances within one image
        found = ndimage.distance_transform_edt(~edges[has_edges], sampling=(1e6, 1, 1))
        dist[has_edges] = np.minimum(found, 20)
    d = torch.from_numpy(dist).unsqueeze(1)
    d = _equalise(ops.box_blur3(d).floor())
    d = ops.filter2d(d, _EMBOSS).round().clamp(0, 255)
    d = ops.box_blur3(d)
    shade = layer8 * d
    peak = shade.amax((1, 2, 3), keepdim=True)
    return torch.where(peak > 0, shade / peak.clamp(min=1e-12), 0.0).view(n, 1, *layer.shape[-2:])


def frost(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """A procedural frost texture (n, 3, size, size) in [0, 1]: our stand-in for the frost
    photographs of ImageNet-C, which we do not ship.

    Ice needles (sparse seeds streaked in three random directions per image) over a fractal
    haze, tinted pale blue-white. Seeded by `gen`, a fresh pattern for every image. Mean
    brightness about 0.46 (σ 0.19 within an image); its likeness to the photographs was judged
    by eye only.
    """
    haze = ops.plasma_fractal(n, size, 1.8, gen).unsqueeze(1)
    seeds = (torch.rand(n, 1, size, size, generator=gen) < 0.05).float()
    seeds = seeds * ops.uniform((n, 1, size, size), 0.5, 1.0, gen)
    needles = torch.zeros_like(seeds)
    for _ in range(3):
        angle = ops.uniform(n, 0, 360, gen)
        streak = ops.motion_blur(seeds, radius=size / 5, sigma=size / 12, angle_deg=angle)
        needles = torch.maximum(needles, streak)
    needles = needles / needles.amax((2, 3), keepdim=True).clamp(min=1e-12)
    ice = (0.5 * haze + 0.9 * needles.sqrt()).clamp(0, 1)
    tint = torch.tensor([0.86, 0.93, 1.0]).view(1, 3, 1, 1)
    return ice * tint
