"""Feature shift: the grey-scale (MNIST-C) and colour (CIFAR-10-C) corruption suites.

Modules: `ops` (batched tensor primitives), `textures` (random layers: liquid, water, frost),
`grey` and `colour` (one function per corruption, with the severity tables in their
docstrings), `names` (which corruptions exist, without torch) and `registry` (the suites'
functions and `corrupt`).

The names are imported with the package; the functions, which need torch, when first asked
for, so that checking a configuration (`pipeline.config`) and the CLI's `--help` stay fast.
"""

from __future__ import annotations

from typing import Any

from pipeline.data.corruptions.names import (
    CORRUPTIONS,
    DETERMINISTIC,
    IDENTITY,
    accepted,
    check_style,
    suite_for,
    suite_name,
)

_IN_REGISTRY = ("COLOUR_SUITE", "GREY_SUITE", "SUITES", "corrupt")


def __getattr__(name: str) -> Any:
    if name in _IN_REGISTRY:
        from pipeline.data.corruptions import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "COLOUR_SUITE",
    "CORRUPTIONS",
    "DETERMINISTIC",
    "GREY_SUITE",
    "IDENTITY",
    "SUITES",
    "accepted",
    "check_style",
    "corrupt",
    "suite_for",
    "suite_name",
]
