"""`fedrc check`: every stage's section of params.yaml checked at once, before any stage runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedrc_cli.common import ParamsOption, console, user_errors, writable_output, writing
from pipeline.common.errors import counted
from pipeline.config import read_params

# The folders the stages write, by their params.yaml key: checked here because under `dvc
# repro` DVC itself touches a stage's outputs before its command could name the problem.
OUTPUTS = {"partition.out": ("partition", "out"), "train.out": ("train", "out"),
           "eval.run": ("eval", "run"), "plot.run": ("plot", "run")}  # fmt: skip


def check(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Folder for each stage's resolved configuration (partition.json, train.json, "
            "eval.json, plot.json, and sweep.json for a sweep section) with the digests of the "
            "code each runs, written only when every section is valid.",
            file_okay=False,
        ),
    ] = None,
    params: ParamsOption = None,
) -> None:
    """Check params.yaml's partition, train, eval, plot (and sweep) sections as their commands
    would, and that the folders they write can be written."""
    with user_errors(), writing("--out", *([out] if out is not None else [])):
        from pipeline.stages import check_feasible, check_stage, write_resolved  # torch: options
        from pipeline.sweep import resolved_points  # first (and an import failing is one line)
        from pipeline.sweep.grid import SECTION, read_grid

        values = read_params(params)
        folder, points = read_grid(values, [], None) if SECTION in values else (None, [])
        resolved = check_stage(values)
        for key, (section, field) in OUTPUTS.items():
            writable_output(key, resolved[section][field])
        if folder is not None:
            writable_output(f"{SECTION}.out", folder)
            resolved[SECTION] = {"out": str(folder), "points": resolved_points(points)}
        check_feasible(values, tuple(p.config for p in points))
        if out is not None:
            write_resolved(resolved, out)
    train = resolved["train"]
    grid = f", {counted(len(points), 'run')} → {folder}" if folder is not None else ""
    console.print(
        f"{params or 'params.yaml'}: {', '.join(resolved)} are valid "
        f"(train: {train['algorithm']}, {counted(train['rounds'], 'round')} → {train['out']}"
        f"{grid})" + (f"; wrote {out}/" if out is not None else ""),
        soft_wrap=True,
    )
