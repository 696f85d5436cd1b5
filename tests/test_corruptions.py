import numpy as np
import pytest

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.benchmark import build_clients, resolve_styles
from pipeline.data.corruptions import (
    COLOUR_SUITE,
    CORRUPTIONS,
    DETERMINISTIC,
    GREY_SUITE,
    corrupt,
    suite_for,
)
from pipeline.data.loaders import RawDataset


def _garments(n: int, side: int, rng: np.random.Generator) -> np.ndarray:
    """FMNIST-like grey images: a textured bright shape with a darker detail, black background."""
    yy, xx = np.mgrid[:side, :side] / side
    out = np.zeros((n, side, side))
    for i in range(n):
        cy, cx, ry, rx = rng.uniform(0.4, 0.6, 2).tolist() + rng.uniform(0.2, 0.35, 2).tolist()
        body = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
        shade = rng.uniform(0.5, 0.9) + 0.1 * np.sin(20 * yy + rng.uniform(0, 6))
        detail = (np.abs(yy - cy) < 0.05) & (np.abs(xx - cx) < rx / 2)
        out[i] = body * np.where(detail, 0.25, shade)
    return (out * 255).round().astype(np.uint8)[..., None]


def _scenes(n: int, side: int, rng: np.random.Generator) -> np.ndarray:
    """CIFAR-like colour images: a smooth coloured background and a contrasting object."""
    coarse = rng.uniform(0.1, 0.9, (n, 3, 4, 4))
    t = np.linspace(0, 3, side)
    i0 = np.floor(t).astype(int).clip(0, 2)
    f = t - i0
    rows = coarse[:, :, i0] * (1 - f)[:, None] + coarse[:, :, i0 + 1] * f[:, None]
    background = rows[..., i0] * (1 - f) + rows[..., i0 + 1] * f  # bilinear upsampling
    yy, xx = np.mgrid[:side, :side] / side
    out = np.empty((n, side, side, 3))
    for i in range(n):
        cy, cx = rng.uniform(0.35, 0.65, 2)
        thing = (np.abs(yy - cy) < 0.2) & (np.abs(xx - cx) < 0.25)
        colour = rng.uniform(0, 1, 3)
        out[i] = np.where(thing[..., None], colour, background[i].transpose(1, 2, 0))
    return (out * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def grey_images() -> np.ndarray:
    return _garments(8, 28, np.random.default_rng(0))


@pytest.fixture(scope="module")
def colour_images() -> np.ndarray:
    return _scenes(8, 32, np.random.default_rng(1))


CASES = [("grey", n) for n in GREY_SUITE] + [("colour", n) for n in COLOUR_SUITE]
# The published CIFAR-10-C elastic table shrinks the affine shift (.08 → .03) as the local
# elastic field grows: severity 5 moves pixels less than severity 1 on smooth images.
NOT_MONOTONE = {("colour", "elastic_transform")}


def _change(out: np.ndarray, images: np.ndarray) -> float:
    return float(np.abs(out.astype(float) - images).mean())


@pytest.mark.parametrize(("suite", "name"), CASES)
def test_corruption_contract(suite: str, name: str, grey_images, colour_images) -> None:
    images = grey_images if suite == "grey" else colour_images
    mild = corrupt(images, name, 1, seed=7)
    harsh = corrupt(images, name, 5, seed=7)
    assert mild.shape == images.shape and mild.dtype == np.uint8
    assert harsh.shape == images.shape and harsh.dtype == np.uint8
    if (suite, name) in NOT_MONOTONE:
        assert _change(harsh, images) > 0 and _change(mild, images) > 0
    else:
        assert _change(harsh, images) > _change(mild, images) > 0
    np.testing.assert_array_equal(mild, corrupt(images, name, 1, seed=7))
    other_seed = corrupt(images, name, 3, seed=8)
    if (suite, name) in DETERMINISTIC:
        np.testing.assert_array_equal(corrupt(images, name, 3, seed=7), other_seed)
        return
    assert not np.array_equal(corrupt(images, name, 3, seed=7), other_seed)
    same = np.repeat(images[:1], 4, axis=0)
    out = corrupt(same, name, 3, seed=0)
    assert len({out[i].tobytes() for i in range(4)}) > 1  # fresh randomness per image


@pytest.mark.parametrize(("suite", "name"), CASES)
def test_other_image_sizes(suite: str, name: str) -> None:
    rng = np.random.default_rng(2)
    images = _garments(2, 16, rng) if suite == "grey" else _scenes(2, 64, rng)
    out = corrupt(images, name, 5, seed=0)
    assert out.shape == images.shape and out.dtype == np.uint8


def test_suites_are_the_published_lists() -> None:
    grey = "shot_noise impulse_noise glass_blur motion_blur shear scale rotate brightness "
    grey += "translate stripe spatter dotted_line zigzag canny_edges"
    colour = "gaussian_noise shot_noise impulse_noise speckle_noise gaussian_blur glass_blur "
    colour += "defocus_blur motion_blur zoom_blur snow frost fog brightness contrast saturate "
    colour += "elastic_transform pixelate jpeg_compression spatter"
    assert set(suite_for(1)) == set(grey.split()) and set(suite_for(3)) == set(colour.split())
    assert len(suite_for(3)) == 19 and "identity" not in suite_for(3) + suite_for(1)
    assert set(CORRUPTIONS) == set(GREY_SUITE) | set(COLOUR_SUITE) | {"identity"}


def test_identity_is_accepted(grey_images, colour_images) -> None:
    for images in (grey_images, colour_images):
        np.testing.assert_array_equal(corrupt(images, "identity", 4, seed=0), images)


@pytest.mark.parametrize("severity", [0, 6, 2.5, True])
def test_bad_severity(severity, grey_images) -> None:
    with pytest.raises(ValueError, match="severity"):
        corrupt(grey_images, "shot_noise", severity, seed=0)


def test_name_from_the_other_suite(grey_images, colour_images) -> None:
    with pytest.raises(ValueError, match=r"'fog'.*grey suite.*colour suite"):
        corrupt(grey_images, "fog", 3, seed=0)
    with pytest.raises(ValueError, match=r"'zigzag'.*colour suite.*grey suite"):
        corrupt(colour_images, "zigzag", 3, seed=0)
    with pytest.raises(ValueError, match="'smudge'"):
        corrupt(grey_images, "smudge", 3, seed=0)
    with pytest.raises(ValueError, match="channels"):
        corrupt(np.zeros((1, 8, 8, 2), np.uint8), "shot_noise", 3, seed=0)


def test_partition_styles_are_checked() -> None:
    with pytest.raises(FedrcError, match=r"partition\.styles"):
        PartitionConfig(dataset="synthetic", styles=["smudge"]).validate()
    with pytest.raises(FedrcError, match=r"partition\.styles"):
        PartitionConfig(dataset="fmnist", styles=["frost"]).validate()  # a colour corruption
    PartitionConfig(dataset="fmnist", styles=["identity", "zigzag"]).validate()
    assert resolve_styles(PartitionConfig(dataset="synthetic"), 1) == list(suite_for(1))


def test_build_checks_styles_against_the_images() -> None:
    rng = np.random.default_rng(3)
    images, labels = _scenes(40, 32, rng), np.arange(40) % 10
    raw = RawDataset("synthetic", images, labels, images, labels, 10, "test")
    config = PartitionConfig(dataset="synthetic", clients=4, styles=["stripe"])
    config.validate()  # a grey name passes for a grey dataset's name…
    with pytest.raises(FedrcError, match=r"partition\.styles.*'stripe'.*colour suite"):
        build_clients(config, raw)  # …but these images have three channels
