import numpy as np
import pytest

from pipeline.data.corruptions import CORRUPTIONS, corrupt


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    rng = np.random.default_rng(0)
    base = np.zeros((16, 28, 28, 1), dtype=np.uint8)
    base[:, 6:22, 8:20] = rng.integers(120, 230, size=(16, 16, 12, 1))
    return base


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_contract(name: str, images: np.ndarray) -> None:
    mild = corrupt(images, name, 1, seed=7)
    harsh = corrupt(images, name, 5, seed=7)
    assert mild.shape == images.shape and mild.dtype == np.uint8
    change = lambda x: np.abs(x.astype(float) - images).mean()  # noqa: E731
    assert change(harsh) > change(mild) > 0
    np.testing.assert_array_equal(mild, corrupt(images, name, 1, seed=7))
    assert not np.array_equal(corrupt(images, name, 3, seed=7), corrupt(images, name, 3, seed=8))


def test_fresh_randomness_per_image(images: np.ndarray) -> None:
    same = np.repeat(images[:1], 4, axis=0)
    out = corrupt(same, "rotate", 3, seed=0)
    assert len({out[i].tobytes() for i in range(4)}) > 1


def test_bad_severity() -> None:
    with pytest.raises(ValueError):
        corrupt(np.zeros((1, 8, 8, 1), np.uint8), "shot_noise", 6, seed=0)
