"""`fedrc check`: every stage's section of params.yaml checked at once, before any stage runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedrc_cli.common import ParamsOption, console, user_errors, writing
from pipeline.config import read_params


def check(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Folder for each stage's resolved configuration (partition.json, train.json, "
            "eval.json, plot.json), written only when every section is valid.",
            file_okay=False,
        ),
    ] = None,
    params: ParamsOption = None,
) -> None:
    """Check params.yaml's partition, train, eval and plot sections as their commands would."""
    from pipeline.stages import CHECKED, check_stage  # torch: only once the options are read

    with user_errors(), writing("--out", *([out] if out is not None else [])):
        resolved = check_stage(read_params(params), out)
    train = resolved["train"]
    console.print(
        f"{params or 'params.yaml'}: {', '.join(CHECKED)} are valid "
        f"(train: {train['algorithm']}, {train['rounds']} rounds → {train['out']})"
        + (f"; wrote {out}/" if out is not None else "")
    )
