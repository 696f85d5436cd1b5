"""Which corruptions exist and for which images, by name only: `pipeline.config` checks a
benchmark's styles with these before anything imports torch (`registry` holds the functions).

Two suites share some names with different published parameters (shot_noise, impulse_noise,
brightness, motion_blur, glass_blur, spatter): the suite is chosen by the images' channel count,
1 → grey (MNIST-C), 3 → colour (CIFAR-10-C). A dataset's channel count is known from its name.
`identity` (clean images, in the FedRC scripts' FMNIST list) is accepted with either suite but
is not part of a suite, so it is never drawn by default.
"""

from __future__ import annotations

# each name is the function of that name in `grey` or `colour`
GREY_NAMES: tuple[str, ...] = (
    "shot_noise",
    "impulse_noise",
    "glass_blur",
    "motion_blur",
    "shear",
    "scale",
    "rotate",
    "brightness",
    "translate",
    "stripe",
    "spatter",
    "dotted_line",
    "zigzag",
    "canny_edges",
)
COLOUR_NAMES: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "gaussian_blur",
    "glass_blur",
    "defocus_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "saturate",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "spatter",
)

IDENTITY = "identity"
SUITE_NAMES: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("grey", GREY_NAMES),
    3: ("colour", COLOUR_NAMES),
}
CORRUPTIONS: tuple[str, ...] = tuple(sorted({*GREY_NAMES, *COLOUR_NAMES, IDENTITY}))
# corruptions whose output depends only on the image (the seed changes nothing)
DETERMINISTIC = frozenset(
    {
        ("grey", "brightness"),
        ("grey", "scale"),
        ("grey", "stripe"),
        ("grey", "canny_edges"),
        ("colour", "gaussian_blur"),
        ("colour", "defocus_blur"),
        ("colour", "zoom_blur"),
        ("colour", "brightness"),
        ("colour", "contrast"),
        ("colour", "saturate"),
        ("colour", "pixelate"),
        ("colour", "jpeg_compression"),
    }
)


def suite_names(channels: int) -> tuple[str, tuple[str, ...]]:
    """The suite's label and names for images with this many channels."""
    if channels not in SUITE_NAMES:
        raise ValueError(f"corruptions need 1 (grey) or 3 (colour) channels, got {channels}")
    return SUITE_NAMES[channels]


def suite_name(channels: int) -> str:
    return suite_names(channels)[0]


def suite_for(channels: int) -> tuple[str, ...]:
    """The default styles for images with this many channels: the whole suite, sorted."""
    return tuple(sorted(suite_names(channels)[1]))


def accepted(channels: int) -> tuple[str, ...]:
    """Every name `corrupt` takes for such images: the suite and `identity`."""
    return (*suite_for(channels), IDENTITY)


def check_style(name: str, channels: int) -> None:
    """Raise ValueError, naming the corruption and the suite, unless `name` fits the images."""
    label, names = suite_names(channels)
    if name == IDENTITY or name in names:
        return
    others = [other for c, (other, s) in SUITE_NAMES.items() if c != channels and name in s]
    where = f"; it is in the {others[0]} suite" if others else ""
    raise ValueError(
        f"corruption {name!r} is not in the {label} suite ({channels}-channel images){where}"
    )
