"""Batched tensor primitives shared by the grey and colour suites.

Images are float tensors (N, C, H, W) in [0, 1]. Every primitive works on the whole batch at
once; per-image parameters (angles, offsets) are tensors with one entry per image. Distances are
in pixels of the image they are applied to; the suites scale the published values to the image
size before calling these.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage


def uniform(shape: int | tuple[int, ...], lo: float, hi: float, gen: torch.Generator):
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def random_sign(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1


def grey(x: torch.Tensor) -> torch.Tensor:
    """Luma (ITU-R 601, as OpenCV's RGB2GRAY) of (N, 3, H, W) images, kept as (N, 1, H, W)."""
    w = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _depthwise(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """Correlate every channel of every image with one 2-D kernel, same-size output."""
    n, c, h, w = x.shape
    kh, kw = kernel.shape
    pad = (kw // 2, kw - 1 - kw // 2, kh // 2, kh - 1 - kh // 2)
    y = F.pad(x.reshape(1, n * c, h, w), pad, mode=mode)
    # one group per plane: several times faster on the CPU than a batch of 1-channel planes
    weight = kernel.to(x.dtype).view(1, 1, kh, kw).expand(n * c, 1, kh, kw)
    return F.conv2d(y, weight, groups=n * c).view(n, c, h, w)


def gaussian_blur(
    x: torch.Tensor, sigma: float, truncate: float = 4.0, mode: str = "replicate"
) -> torch.Tensor:
    """Separable Gaussian filter (scikit-image's `gaussian`: truncate 4 σ, nearest-edge mode)."""
    if sigma <= 0:
        return x
    radius = min(int(truncate * sigma + 0.5), min(x.shape[-2:]) - 1)
    if radius < 1:
        return x
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    y = _depthwise(x, k.view(1, -1), mode)
    return _depthwise(y, k.view(-1, 1), mode)


def box_blur3(x: torch.Tensor) -> torch.Tensor:
    """3×3 mean filter with mirrored edges (OpenCV's `blur` default border)."""
    return _depthwise(x, torch.full((3, 3), 1 / 9), "reflect")


def filter2d(x: torch.Tensor, kernel: torch.Tensor, mode: str = "reflect") -> torch.Tensor:
    return _depthwise(x, kernel, mode)


def affine(
    x: torch.Tensor, matrix: torch.Tensor, shift: torch.Tensor | None = None, padding="zeros"
) -> torch.Tensor:
    """Warp about the image centre: input point = matrix @ output point + shift.

    `matrix` (N, 2, 2) and `shift` (N, 2) are in pixels, (x, y) order, relative to the centre
    ((W-1)/2, (H-1)/2), the convention of MNIST-C's scikit-image warps. Bilinear sampling.
    """
    n, _, h, w = x.shape
    scale = torch.tensor([2 / w, 2 / h])
    theta = torch.zeros(n, 2, 3)
    theta[:, :, :2] = scale.view(1, 2, 1) * matrix / scale.view(1, 1, 2)
    if shift is not None:
        theta[:, :, 2] = shift * scale
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=False)


def rotation(angle: torch.Tensor) -> torch.Tensor:
    c, s = angle.cos(), angle.sin()
    return torch.stack([torch.stack([c, -s], 1), torch.stack([s, c], 1)], 1)


def scaling(factor: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros_like(factor)
    return torch.stack([torch.stack([factor, zero], 1), torch.stack([zero, factor], 1)], 1)


def sample(x: torch.Tensor, px: torch.Tensor, py: torch.Tensor, padding: str) -> torch.Tensor:
    """Bilinear values of `x` at pixel coordinates px, py (N, Hout, Wout)."""
    h, w = x.shape[-2:]
    grid = torch.stack([px * 2 / (w - 1) - 1, py * 2 / (h - 1) - 1], -1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=True)


def motion_blur(
    x: torch.Tensor, radius: float, sigma: float, angle_deg: torch.Tensor
) -> torch.Tensor:
    """ImageMagick's `-motion-blur radius x sigma + angle`, one direction per image.

    Each output pixel is a one-sided Gaussian-weighted mean of the pixels at distances
    0, 1, …, 2⌈radius⌉ along the angle (0° points right, angles grow clockwise on screen), with
    edge pixels repeated. ImageMagick rounds the offsets to whole pixels; we sample bilinearly.
    """
    n, c, h, w = x.shape
    taps = torch.arange(2 * math.ceil(radius) + 1, dtype=torch.float32)
    weight = torch.exp(-(taps**2) / (2 * sigma**2))
    keep = weight > 1e-3 * weight[0]  # taps beyond ~3.7 σ do not change a uint8 pixel
    taps, weight = taps[keep], weight[keep] / weight[keep].sum()
    a = angle_deg * math.pi / 180
    ox = taps.view(1, -1, 1, 1) * a.cos().view(n, 1, 1, 1)  # (N, T, 1, 1)
    oy = taps.view(1, -1, 1, 1) * a.sin().view(n, 1, 1, 1)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    px = (xx + ox).reshape(n, -1, w)  # (N, T*H, W)
    py = (yy + oy).reshape(n, -1, w)
    streaks = sample(x, px, py, "border").view(n, c, -1, h, w)
    return (streaks * weight.view(1, 1, -1, 1, 1)).sum(2)


def zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Zoom in about the centre by `factor`, cropping to the same size (`clipped_zoom`)."""
    f = torch.full((x.shape[0],), 1 / factor)
    return affine(x, scaling(f), padding="border")


def resize(layer: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Bring a layer synthesised at the reference size to the image size (bilinear)."""
    if layer.shape[-2:] == (h, w):
        return layer
    return F.interpolate(layer, size=(h, w), mode="bilinear", align_corners=False)


def local_shuffle(
    x: torch.Tensor, delta: int, iterations: int, p_move: float, gen: torch.Generator
) -> torch.Tensor:
    """Glass blur's local pixel shuffle, as parallel gathers.

    The original walks the image swapping each pixel with a random neighbour at offsets in
    [-delta, delta - 1] (a sequential loop); here every pixel, with probability `p_move`, takes
    the value of such a neighbour, all at once. Same neighbourhood and offset bias, not the
    same pixels.
    """
    n, c, h, w = x.shape
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    for _ in range(iterations):
        dy = torch.randint(-delta, delta, (n, h, w), generator=gen)
        dx = torch.randint(-delta, delta, (n, h, w), generator=gen)
        move = torch.rand(n, h, w, generator=gen) < p_move
        sy = (yy + dy * move).clamp(0, h - 1)
        sx = (xx + dx * move).clamp(0, w - 1)
        index = (sy * w + sx).view(n, 1, h * w).expand(n, c, h * w)
        x = x.reshape(n, c, h * w).gather(2, index).view(n, c, h, w)
    return x


_SOBEL = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
_LINKS = np.zeros((3, 3, 3), dtype=bool)
_LINKS[1] = True  # 8-connected within an image, never across images of the batch


def canny(x: torch.Tensor, sigma: float, low: float, high: float, l2: bool = True) -> torch.Tensor:
    """Canny edges of (N, 1, H, W) images: smoothing, Sobel, non-maximum suppression, hysteresis.

    `low`/`high` apply to the unnormalised Sobel magnitude (L2 as scikit-image, L1 as OpenCV).
    Gradient directions are quantised to four (OpenCV); hysteresis keeps the weak-edge
    components that touch a strong edge (scipy's labelling over the whole batch at once).
    Border pixels are never edges. Returns a bool tensor (N, 1, H, W).
    """
    s = gaussian_blur(x, sigma) if sigma > 0 else x
    gx = _depthwise(s, _SOBEL, "replicate")
    gy = _depthwise(s, _SOBEL.T, "replicate")
    mag = torch.hypot(gx, gy) if l2 else gx.abs() + gy.abs()
    # direction of the gradient, quantised to 0°, 45°, 90°, 135°
    sector = torch.round(torch.atan2(gy, gx) / (math.pi / 4)).long() % 4
    padded = F.pad(mag, (1, 1, 1, 1))
    h, w = x.shape[-2:]

    def shifted(dy: int, dx: int) -> torch.Tensor:
        return padded[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]

    steps = ((0, 1), (1, 1), (1, 0), (1, -1))  # (dy, dx) along each quantised direction
    peak = torch.zeros_like(mag, dtype=torch.bool)
    for k, (dy, dx) in enumerate(steps):
        is_max = (mag >= shifted(dy, dx)) & (mag >= shifted(-dy, -dx))
        peak |= (sector == k) & is_max
    weak = peak & (mag >= low)
    weak[..., 0, :] = weak[..., -1, :] = False
    weak[..., :, 0] = weak[..., :, -1] = False
    strong = weak & (mag >= high)
    labels, _ = ndimage.label(weak[:, 0].numpy(), structure=_LINKS)
    keep = np.zeros(labels.max() + 1, dtype=bool)
    keep[labels[strong[:, 0].numpy()]] = True
    keep[0] = False
    return torch.from_numpy(keep[labels]).unsqueeze(1)


def plasma_fractal(n: int, size: int, decay: float, gen: torch.Generator) -> torch.Tensor:
    """Diamond-square height maps (n, size, size) in [0, 1], as in ImageNet-C's fog.

    `size` must be a power of two; the map wraps around. The random displacement added at a
    level is uniform in ±wibble², wibble starting at 100 and divided by `decay` every level
    (so the amplitude falls by decay² an octave, as in the published code).
    """
    if size & (size - 1):
        raise ValueError(f"plasma size must be a power of two, got {size}")
    m = torch.zeros(n, size, size, dtype=torch.float64)
    step, wibble = size, 100.0

    def jitter(shape: torch.Size) -> torch.Tensor:
        noise = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
        return wibble * wibble * noise

    while step >= 2:
        half = step // 2
        corners = m[:, ::step, ::step]
        right, down = corners.roll(-1, 2), corners.roll(-1, 1)
        centres = (corners + right + down + down.roll(-1, 2)) / 4
        m[:, half::step, half::step] = centres + jitter(centres.shape)
        centres = m[:, half::step, half::step]
        # points on the horizontal edges: two corners beside them, two centres above and below
        top = (corners + right + centres + centres.roll(1, 1)) / 4
        m[:, ::step, half::step] = top + jitter(top.shape)
        # points on the vertical edges: two corners above and below, two centres beside them
        left = (corners + down + centres + centres.roll(1, 2)) / 4
        m[:, half::step, ::step] = left + jitter(left.shape)
        step, wibble = half, wibble / decay
    lo = m.amin((1, 2), keepdim=True)
    hi = m.amax((1, 2), keepdim=True)
    return ((m - lo) / (hi - lo).clamp(min=1e-12)).float()


def next_power_of_two(k: int) -> int:
    return 1 << max(0, (k - 1).bit_length())
