"""How figures are written for print: which formats, what size, what font size.

PNG is for screens and the docs; PDF and SVG are vector files for a paper. PDF fonts are
embedded as TrueType (Type 42), which publishers accept where they refuse matplotlib's default
Type 3, and SVG keeps text as text, so a figure's words stay editable and searchable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.io import naming
from pipeline.config.sections import FIGURE_FORMATS

FORMATS = FIGURE_FORMATS


@dataclass(frozen=True)
class FigureStyle:
    """`formats`: file types written side by side; `width`, `height` (inches) of a one-panel
    figure (None: its own size); `font_size` in points; `dpi` for PNG."""

    formats: tuple[str, ...] = ("png",)
    width: float | None = None
    height: float | None = None
    font_size: float = 10.0
    dpi: int = 120

    def check(self) -> None:
        """One-line errors naming the option: unknown formats, sizes out of reason."""
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            given = unknown[0] if unknown else "(nothing)"
            raise FedrcError(f"--format: '{given}' is not one of {', '.join(FORMATS)}")
        for option, value, low, high in (
            ("--width", self.width, 1.0, 40.0),
            ("--height", self.height, 1.0, 40.0),
            ("--font-size", self.font_size, 4.0, 30.0),
        ):
            if value is not None and not low <= value <= high:
                raise FedrcError(f"{option}: expected a number in [{low:g}, {high:g}], got {value}")
        if not 20 <= self.dpi <= 600:
            raise FedrcError(f"--dpi: expected an integer in [20, 600], got {self.dpi}")

    def size(self, width: float, height: float) -> tuple[float, float]:
        """A one-panel figure's size: the options where given, else (width, height)."""
        return (self.width or width, self.height or height)

    @contextmanager
    def fonts(self) -> Iterator[None]:
        """matplotlib's settings for the figures drawn inside."""
        import matplotlib

        settings = {
            "font.size": self.font_size,
            "pdf.fonttype": 42,
            "svg.fonttype": "none",
            "axes.titlesize": self.font_size,
            "legend.fontsize": self.font_size * 0.85,
        }
        with matplotlib.rc_context(settings):
            yield

    def names(self, stem: str) -> list[str]:
        """The file names of one figure: `stem.png`, `stem.pdf`, …"""
        return [f"{stem}.{fmt}" for fmt in self.formats]

    def save(self, fig: Any, paths: list[Path]) -> None:
        """`fig` into each of `paths`, one per format in order (they may be temporary names,
        so the format is given, not guessed)."""
        for path, fmt in zip(paths, self.formats):
            with naming(path):  # matplotlib's errors name no file
                fig.savefig(path, dpi=self.dpi, format=fmt)
