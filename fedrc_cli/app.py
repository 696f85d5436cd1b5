"""The `fedrc` command: partition → train → eval → plot, and report over many runs."""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from fedrc_cli.check import check
from fedrc_cli.common import give_back_outputs
from fedrc_cli.evaluate import evaluate
from fedrc_cli.flower import flower
from fedrc_cli.info import info
from fedrc_cli.partition import partition
from fedrc_cli.plot import plot
from fedrc_cli.report import report
from fedrc_cli.sweep import sweep
from fedrc_cli.train import train
from fedrc_cli.usage import OneLineGroup

app = typer.Typer(
    name="fedrc",
    help="Clustered federated learning under label, feature and concept shift: build "
    "benchmarks, train FedRC and baselines, evaluate and plot. Each command reads its section "
    "of params.yaml; options override it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineGroup,
)


def show_version(value: bool) -> None:
    if value:
        print(f"fedrc {metadata.version('fedrc')}")
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=show_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Clustered federated learning under label, feature and concept shift."""


app.command(no_args_is_help=False)(partition)
app.command(no_args_is_help=False)(train)
app.command("eval", no_args_is_help=False)(evaluate)
app.command(no_args_is_help=False)(plot)
app.command(no_args_is_help=False)(info)
app.command(no_args_is_help=False)(check)
app.command(no_args_is_help=False)(sweep)
app.command(no_args_is_help=True)(report)
app.add_typer(flower)


def main() -> None:
    """The console script: a command that fails as a DVC stage gives back what DVC removed."""
    try:
        app()
    except SystemExit as e:
        if e.code not in (0, None):
            give_back_outputs()
        raise
