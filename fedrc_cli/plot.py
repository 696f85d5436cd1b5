"""`fedrc plot`: cluster maps, accuracy curves and the ω heat map of a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fedrc_cli.common import ParamsOption, console, load_config, user_errors, writing
from fedrc_cli.options import comma_lists, dataclass_options, with_options
from pipeline.config import PlotConfig


def plot(params: ParamsOption = None, **options: Any) -> None:
    """Draw the paper's Figure 3 style cluster map, accuracy curves and ω per client (a
    drifting run: per time step, and its timeline), as PNG, PDF or SVG."""
    with user_errors():
        config = load_config(PlotConfig, params, **comma_lists(PlotConfig, options))
        from pipeline import stages  # torch: imported once the options are known to be good

        run = Path(config.run)
        # a missing or broken run is the stage's own one-line error, so check only a folder
        with writing("--run", run / "plots", check=os.path.isdir(run)):
            paths = stages.plot_stage(config)
    for path in paths:
        console.print(f"Wrote {path}")


with_options(plot, dataclass_options(PlotConfig, "plot"))
