"""Grey-scale image corruptions in the spirit of (Fashion-)MNIST-C, five severities each.

Every function maps float images (N, C, H, W) in [0, 1] to the same shape, drawing fresh
randomness per image from `gen`. Severity tables: the noise levels are Hendrycks & Dietterich's
CIFAR-10-C values (shot noise, impulse noise, brightness); the geometric ones (rotate, shear,
scale, translate) and motion blur spread MNIST-C's single setting over five levels, in pixels of
a 28×28 image (scaled to other sizes). The full grey and colour suites are a later issue.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen)


def _random_sign(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1


def shot_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    lam = (60, 25, 12, 5, 3)[severity - 1]
    return torch.poisson(x * lam, generator=gen) / lam


def impulse_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    amount = (0.03, 0.06, 0.09, 0.17, 0.27)[severity - 1]
    u = torch.rand(x.shape, generator=gen)
    salt = torch.rand(x.shape, generator=gen) < 0.5
    hit = u < amount
    return torch.where(hit, salt.float(), x)


def brightness(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    shift = (0.1, 0.2, 0.3, 0.4, 0.5)[severity - 1]
    jitter = _uniform(x.shape[0], -0.02, 0.02, gen).view(-1, 1, 1, 1)
    return x + shift + jitter


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _matrices(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros_like(a)
    return torch.stack([torch.stack([a, b, zeros], 1), torch.stack([c, d, zeros], 1)], 1)


def rotate(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    centre = (10, 20, 30, 40, 50)[severity - 1]
    angle = _uniform(x.shape[0], centre - 5, centre + 5, gen) * _random_sign(x.shape[0], gen)
    r = angle * math.pi / 180
    return _affine(x, _matrices(r.cos(), -r.sin(), r.sin(), r.cos()))


def shear(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    centre = (0.1, 0.2, 0.3, 0.4, 0.5)[severity - 1]
    s = _uniform(x.shape[0], centre - 0.05, centre + 0.05, gen) * _random_sign(x.shape[0], gen)
    one = torch.ones_like(s)
    return _affine(x, _matrices(one, s, torch.zeros_like(s), one))


def scale(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    factor = (0.9, 0.8, 0.7, 0.6, 0.5)[severity - 1]
    f = _uniform(x.shape[0], factor - 0.03, factor + 0.03, gen)
    inverse = 1 / f  # affine_grid maps output to input coordinates: zoom out = stretch the grid
    return _affine(x, _matrices(inverse, torch.zeros_like(f), torch.zeros_like(f), inverse))


def translate(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    pixels = (1.5, 3, 4.5, 6, 7.5)[severity - 1] * x.shape[-1] / 28
    direction = _uniform(x.shape[0], 0, 2 * math.pi, gen)
    shift = 2 * pixels / x.shape[-1]  # normalised coordinates span 2
    theta = _matrices(
        torch.ones_like(direction),
        torch.zeros_like(direction),
        torch.zeros_like(direction),
        torch.ones_like(direction),
    )
    theta[:, 0, 2] = shift * direction.cos()
    theta[:, 1, 2] = shift * direction.sin()
    return _affine(x, theta)


def stripe(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """Invert a vertical band of the image at a random column."""
    n, width = x.shape[0], x.shape[-1]
    band = max(1, round((2, 3, 4, 5, 6)[severity - 1] * width / 28))
    start = torch.randint(0, width - band + 1, (n,), generator=gen).view(n, 1)
    cols = torch.arange(width).view(1, width)
    inside = ((cols >= start) & (cols < start + band)).view(n, 1, 1, width)
    return torch.where(inside, 1 - x, x)


def motion_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """Blur along a line of random direction, one kernel per image (a grouped convolution)."""
    n, c, h, w = x.shape
    length = (3, 5, 7, 9, 11)[severity - 1] * w / 28
    size = 2 * math.ceil(length / 2) + 1
    angle = _uniform(n, 0, math.pi, gen).view(n, 1, 1)
    coords = torch.arange(size, dtype=torch.float32) - size // 2
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    along = xx * angle.cos() + yy * angle.sin()
    across = (-xx * angle.sin() + yy * angle.cos()).abs()
    kernel = (1 - across).clamp(min=0) * (along.abs() <= length / 2)
    kernel = kernel / kernel.sum(dim=(1, 2), keepdim=True)
    weight = kernel.repeat_interleave(c, 0).unsqueeze(1)  # (n*c, 1, size, size)
    out = F.conv2d(x.reshape(1, n * c, h, w), weight, padding=size // 2, groups=n * c)
    return out.view(n, c, h, w)


CORRUPTIONS: dict[str, Corruption] = {
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "brightness": brightness,
    "rotate": rotate,
    "shear": shear,
    "scale": scale,
    "translate": translate,
    "stripe": stripe,
    "motion_blur": motion_blur,
}


def corrupt(images: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """Apply corruption `name` at `severity` (1..5) to uint8 images (N, H, W, C)."""
    if not 1 <= severity <= 5:
        raise ValueError(f"severity must be in 1..5, got {severity}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    y = CORRUPTIONS[name](x, severity, gen).clamp(0, 1)
    return (y * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
