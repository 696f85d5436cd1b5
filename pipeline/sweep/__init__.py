"""A grid of runs in one command (`fedrc sweep`, and a DVC stage): `grid` lists the points of
algorithms × seeds × settings, `plan` says what each point's folder still needs, `runner` runs
those steps, here or in worker processes. Each point is an ordinary run folder."""

from __future__ import annotations

from typing import Any

from pipeline.config import config_dict
from pipeline.run.code import run_code
from pipeline.sweep.grid import Point


def resolved_points(points: list[Point]) -> dict[str, Any]:
    """Every point's configuration and code, as `fedrc check --out` writes resolved/sweep.json:
    the DVC stage of a sweep depends on it, so a plugin edited since reruns the sweep."""
    return {p.name: {**config_dict(p.config), "code": run_code(p.config)} for p in points}
