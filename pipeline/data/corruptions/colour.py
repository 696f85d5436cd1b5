"""The colour suite: CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019), as the FedRC scripts use it.

Every function maps float RGB images (N, 3, H, W) in [0, 1] to the same shape, drawing fresh
randomness per image from `gen`. The tables are the published CIFAR-10-C ones (severity 1 → 5);
pixel-sized parameters are given for 32×32 images and scaled by W / 32, and random layers (snow,
spatter, frost) are drawn at 32×32 and resized to the image.

    gaussian_noise     σ                                   .04, .06, .08, .09, .10
    shot_noise         photons per unit intensity          500, 250, 100, 75, 50
    impulse_noise      salt-and-pepper fraction            .01, .02, .03, .05, .07
    speckle_noise      σ of multiplicative noise           .06, .10, .12, .16, .20
    gaussian_blur      σ px                                .4, .6, .7, .8, 1
    glass_blur         (σ, max shift px, iterations)       (.05,1,1) (.25,1,1) (.4,1,1) (.25,1,2)
                                                           (.4,1,2)
    defocus_blur       (disk radius, alias σ) px           (.3,.4) (.4,.5) (.5,.6) (1,.2) (1.5,.1)
    motion_blur        ImageMagick (radius, σ) px          (6,1) (6,1.5) (6,2) (8,2) (9,2.5)
    zoom_blur          zooms np.arange(1, s, .01), s =     1.06, 1.11, 1.16, 1.21, 1.26
    snow               (loc, scale, zoom, threshold,       (.1,.2,1,.6,8,3,.95) (.1,.2,1,.5,10,4,.9)
                        blur radius, blur σ, blend)        (.15,.3,1.75,.55,10,4,.9)
                                                           (.25,.3,2.25,.6,12,6,.85)
                                                           (.3,.3,1.25,.65,14,12,.8)
    frost              (image weight, frost weight)        (1,.2) (1,.3) (.9,.4) (.85,.4) (.75,.45)
    fog                (strength, fractal decay)           (.2,3) (.5,3) (.75,2.5) (1,2) (1.5,1.75)
    brightness         added to V of HSV                   .05, .1, .15, .2, .3
    contrast           factor about the channel mean       .75, .5, .4, .3, .15
    saturate           S of HSV → S·a + b, (a, b)          (.3,0) (.1,0) (1.5,0) (2,.1) (2.5,.2)
    elastic_transform  (α, σ, affine shift) × 32 px        (0,0,.08) (.05,.2,.07) (.08,.06,.06)
                                                           (.1,.04,.05) (.1,.03,.03)
    pixelate           box-downscale factor                .95, .9, .85, .75, .65
    jpeg_compression   quality                             80, 65, 58, 50, 40
    spatter            (loc, scale, σ, threshold,          (.62,.1,.7,.7,.5,water)
                        intensity or σ₂, kind)             (.65,.1,.8,.7,.5,water)
                                                           (.65,.3,1,.69,.5,water)
                                                           (.65,.1,.7,.69,.6,mud)
                                                           (.65,.1,.5,.68,.6,mud)

Our own conventions: frost uses a procedural texture (`textures.frost`) instead of the frost
photographs; the snow and motion blurs sample their streak bilinearly where ImageMagick rounds
offsets to whole pixels; glass blur's sequential swap loop is a parallel random gather
(`ops.local_shuffle`); elastic transform composes the affine and elastic warps into one
resampling; spatter's water shading follows the published OpenCV chain with our own Canny and an
exact Euclidean distance. JPEG runs image by image through PIL, as published.

Not monotone in pixel change: the published elastic_transform table shrinks the random affine
shift (.08 → .03 × 32 px) while it grows the local elastic field, so on smooth images severity 5
moves pixels less, on average, than severity 1 (it distorts local structure more).
"""

from __future__ import annotations

from io import BytesIO

import numpy as np
import torch
from PIL import Image

from pipeline.data.corruptions import ops, textures

REF = 32  # CIFAR's image side


def _px(value: float, x: torch.Tensor) -> float:
    return value * x.shape[-1] / REF


def gaussian_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    sigma = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
    return x + sigma * torch.randn(x.shape, generator=gen)


def shot_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    lam = (500, 250, 100, 75, 50)[severity - 1]
    return torch.poisson(x * lam, generator=gen) / lam


def impulse_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    amount = (0.01, 0.02, 0.03, 0.05, 0.07)[severity - 1]
    hit = torch.rand(x.shape, generator=gen) < amount  # each channel on its own, as scikit-image
    salt = torch.rand(x.shape, generator=gen) < 0.5
    return torch.where(hit, salt.float(), x)


def speckle_noise(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    sigma = (0.06, 0.1, 0.12, 0.16, 0.2)[severity - 1]
    return x + x * sigma * torch.randn(x.shape, generator=gen)


def gaussian_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    return ops.gaussian_blur(x, _px((0.4, 0.6, 0.7, 0.8, 1.0)[severity - 1], x))


def glass_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    sigma, delta, iterations = (
        (0.05, 1, 1),
        (0.25, 1, 1),
        (0.4, 1, 1),
        (0.25, 1, 2),
        (0.4, 1, 2),
    )[severity - 1]
    sigma, delta = _px(sigma, x), max(1, round(_px(delta, x)))
    x = ops.gaussian_blur(x, sigma)
    x = ops.local_shuffle(x, delta, iterations, p_move=1.0, gen=gen)  # CIFAR: every pixel
    return ops.gaussian_blur(x, sigma)


def _disk(radius: float, alias_sigma: float) -> torch.Tensor:
    """ImageNet-C's defocus kernel: a normalised disk, then a 3×3 Gaussian of σ alias_sigma."""
    r = int(np.ceil(radius)) + 1
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    disk = ((t.view(-1, 1) ** 2 + t.view(1, -1) ** 2) <= radius**2).float()
    disk = disk / disk.sum()
    g = torch.exp(-torch.tensor([1.0, 0.0, 1.0]) / (2 * alias_sigma**2))
    g = g / g.sum()
    return ops.filter2d(disk.view(1, 1, *disk.shape), g.view(-1, 1) * g.view(1, -1), "constant")[
        0, 0
    ]


def defocus_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    radius, alias = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))[severity - 1]
    return ops.filter2d(x, _disk(_px(radius, x), _px(alias, x)), "reflect")


def motion_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    radius, sigma = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))[severity - 1]
    angle = ops.uniform(x.shape[0], -45, 45, gen)
    return ops.motion_blur(x, _px(radius, x), _px(sigma, x), angle)


def zoom_blur(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    # the published list, np.arange's float rounding included (7, 12, 16, 21, 26 zooms)
    zooms = np.arange(1, (1.06, 1.11, 1.16, 1.21, 1.26)[severity - 1], 0.01)
    total = x.clone()
    for z in zooms:
        total += ops.zoom(x, float(z))
    return total / (len(zooms) + 1)


def snow(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    loc, spread, zoom, threshold, radius, sigma, blend = (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    )[severity - 1]
    n, _, h, w = x.shape
    flakes = ops.zoom(loc + spread * torch.randn(n, 1, REF, REF, generator=gen), zoom)
    flakes = torch.where(flakes < threshold, 0.0, flakes).clamp(0, 1)
    flakes = (flakes * 255).floor() / 255  # the published layer passes through 8 bits
    flakes = ops.motion_blur(flakes, radius, sigma, ops.uniform(n, -135, -45, gen))
    flakes = ops.resize(flakes, h, w)
    x = blend * x + (1 - blend) * torch.maximum(x, ops.grey(x) * 1.5 + 0.5)
    return x + flakes + flakes.flip(-1, -2)


def frost(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    image_weight, frost_weight = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))[
        severity - 1
    ]
    n, _, h, w = x.shape
    return image_weight * x + frost_weight * ops.resize(textures.frost(n, REF, gen), h, w)


def fog(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    strength, decay = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))[severity - 1]
    n, _, h, w = x.shape
    size = ops.next_power_of_two(max(h, w))
    haze = ops.plasma_fractal(n, size, decay, gen)[:, None, :h, :w]
    peak = x.amax((1, 2, 3), keepdim=True)
    return (x + strength * haze) * peak / (peak + strength)


def brightness(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """V of HSV raised by c with H and S kept: RGB scales by V'/V (black becomes grey V')."""
    c = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
    v = x.amax(1, keepdim=True)
    v_new = (v + c).clamp(max=1)
    return torch.where(v > 0, x * v_new / v.clamp(min=1e-12), v_new)


def contrast(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    c = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
    means = x.mean((2, 3), keepdim=True)
    return (x - means) * c + means


def saturate(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """S of HSV → clip(S·a + b) with H and V kept.

    For fixed H and V a channel is V − (V − channel)·S'/S. Grey pixels (S = 0) have hue 0 in
    scikit-image, so a positive b tints them red, as in the published images.
    """
    a, b = ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2))[severity - 1]
    v = x.amax(1, keepdim=True)
    s = torch.where(v > 0, (v - x.amin(1, keepdim=True)) / v.clamp(min=1e-12), 0.0)
    s_new = (s * a + b).clamp(0, 1)
    coloured = v - (v - x) * s_new / s.clamp(min=1e-12)
    red_hue = torch.tensor([0.0, 1.0, 1.0]).view(1, 3, 1, 1)
    return torch.where(s > 0, coloured, v - v * s_new * red_hue)


def elastic_transform(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """A random affine map of three points, then a smooth random displacement field.

    Both warps are composed into one bilinear resampling with mirrored edges.
    """
    alpha, sigma, shift = (
        (0, 0, 0.08),
        (0.05, 0.2, 0.07),
        (0.08, 0.06, 0.06),
        (0.1, 0.04, 0.05),
        (0.1, 0.03, 0.03),
    )[severity - 1]
    n, _, h, w = x.shape
    alpha, sigma, shift = alpha * w, sigma * w, shift * w
    centre, half = float(min(h, w) // 2), float(min(h, w) // 3)
    src = torch.tensor(
        [[centre + half, centre + half], [centre + half, centre - half], [centre - half] * 2]
    )
    dst = src + ops.uniform((n, 3, 2), -shift, shift, gen)
    ones = torch.ones(3, 1)
    forward = torch.linalg.solve(torch.cat([src, ones], 1), dst).transpose(1, 2)  # (n, 2, 3)
    full = torch.cat([forward, torch.tensor([0.0, 0.0, 1.0]).expand(n, 1, 3)], 1)
    inverse = torch.linalg.inv(full)[:, :2]
    field = ops.uniform((n, 2, h, w), -1, 1, gen)
    field = ops.gaussian_blur(field, sigma, truncate=3, mode="reflect") * alpha
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    px, py = xx + field[:, 0], yy + field[:, 1]
    sx = inverse[:, 0, 0, None, None] * px + inverse[:, 0, 1, None, None] * py
    sy = inverse[:, 1, 0, None, None] * px + inverse[:, 1, 1, None, None] * py
    sx, sy = sx + inverse[:, 0, 2, None, None], sy + inverse[:, 1, 2, None, None]
    return ops.sample(x, sx, sy, "reflection")


def _box_resize_matrix(n_out: int, n_in: int) -> torch.Tensor:
    """PIL's BOX resampling as a matrix (n_out, n_in): an output pixel averages the input pixels
    whose centres fall in its footprint (nearest neighbour when enlarging)."""
    scale = n_in / n_out
    centre = (torch.arange(n_out, dtype=torch.float64).view(-1, 1) + 0.5) * scale
    pos = (torch.arange(n_in, dtype=torch.float64).view(1, -1) + 0.5 - centre) / max(scale, 1)
    m = ((pos > -0.5) & (pos <= 0.5)).double()
    return (m / m.sum(1, keepdim=True)).float()


def pixelate(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    c = (0.95, 0.9, 0.85, 0.75, 0.65)[severity - 1]
    h, w = x.shape[-2:]
    sh, sw = int(h * c), int(w * c)
    down_h, down_w = _box_resize_matrix(sh, h), _box_resize_matrix(sw, w)
    up_h, up_w = _box_resize_matrix(h, sh), _box_resize_matrix(w, sw)
    small = torch.einsum("ih,nchw,jw->ncij", down_h, x, down_w)
    small = (small * 255).round() / 255  # PIL keeps the small image in 8 bits
    return torch.einsum("hi,ncij,wj->nchw", up_h, small, up_w)


def jpeg_compression(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """PIL's JPEG (libjpeg, 4:2:0 chroma), image by image: the one corruption not batched."""
    quality = (80, 65, 58, 50, 40)[severity - 1]
    images = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    decoded = []
    for image in images:
        buffer = BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        decoded.append(np.asarray(Image.open(buffer).convert("RGB")))
    return torch.from_numpy(np.stack(decoded)).permute(0, 3, 1, 2).float() / 255


def spatter(x: torch.Tensor, severity: int, gen: torch.Generator) -> torch.Tensor:
    """Water drops (severities 1–3, pale turquoise shading) or mud (4–5, brown blots)."""
    loc, spread, sigma, threshold, strength, kind = (
        (0.62, 0.1, 0.7, 0.7, 0.5, "water"),
        (0.65, 0.1, 0.8, 0.7, 0.5, "water"),
        (0.65, 0.3, 1, 0.69, 0.5, "water"),
        (0.65, 0.1, 0.7, 0.69, 0.6, "mud"),
        (0.65, 0.1, 0.5, 0.68, 0.6, "mud"),
    )[severity - 1]
    n, _, h, w = x.shape
    layer = textures.liquid(n, REF, loc, spread, sigma, threshold, gen)
    if kind == "water":
        shade = ops.resize(textures.water(layer), h, w) * strength
        return x + shade * torch.tensor([175, 238, 238]).view(1, 3, 1, 1) / 255
    mask = ops.resize(textures.mud(layer, threshold, strength), h, w)
    return x * (1 - mask) + mask * torch.tensor([63, 42, 20]).view(1, 3, 1, 1) / 255
