"""`fedrc flower app`: the Flower app folder for a deployment, from params.yaml's `train:`."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from fedrc_cli.common import ParamsOption, console, fail, user_errors, writing
from fedrc_cli.options import dataclass_options, with_options
from fedrc_cli.train import SetOption
from fedrc_cli.usage import OneLineGroup
from pipeline.config import TrainConfig, read_params
from pipeline.flower.appconfig import ON_NODE_LOSS, Deployment, check_config, write_app

flower = typer.Typer(
    name="flower",
    help="Run fedrc on Flower's deployment engine (SuperLink, SuperNodes, `flwr run`).",
    no_args_is_help=True,
    cls=OneLineGroup,
)


def flower_installed() -> bool:
    return importlib.util.find_spec("flwr") is not None


def app(
    app_dir: Annotated[
        Path, typer.Option("--app", help="Folder to write the Flower app (pyproject.toml) into.")
    ] = Path("flower-app"),
    wait: Annotated[
        float,
        typer.Option(help="Seconds the server waits at the start for nodes holding every client."),
    ] = Deployment.wait,
    timeout: Annotated[
        float, typer.Option(help="Seconds a node may take to answer one request.")
    ] = Deployment.timeout,
    on_node_loss: Annotated[
        str,
        typer.Option(
            help="A node lost during local training: 'continue' (the round ends with the "
            "clients that answered) or 'stop' (one-line error; resume later)."
        ),
    ] = Deployment.on_node_loss,
    set_: SetOption = None,
    params: ParamsOption = None,
    **options: Any,
) -> None:
    """Write a Flower app that trains what `fedrc train` would: start it with `flwr run`."""
    with user_errors():
        if not flower_installed():  # an app nothing here could run: say what to install
            raise fail(
                "fedrc flower app: Flower is not installed in this environment; install the "
                "extra (Python 3.11 or newer): pip install 'fedrc[flower]'"
            )
        if on_node_loss not in ON_NODE_LOSS:
            raise fail(f"--on-node-loss: expected one of {ON_NODE_LOSS}, got {on_node_loss!r}")
        from pipeline.run.resolve import train_config  # torch: the algorithms' own settings

        config = train_config(read_params(params), options, set_ or [])
        check_config(config)
        # the ServerApp runs in the SuperLink's working folder: make paths absolute here
        config = replace(
            config, data=str(Path(config.data).resolve()), out=str(Path(config.out).resolve())
        )
        deployment = Deployment(wait=wait, timeout=timeout, on_node_loss=on_node_loss)
        with writing("--app", app_dir):
            path = write_app(app_dir, config, deployment)
    console.print(f"Wrote {path}: {config.algorithm} on {config.data} → {config.out}")
    console.print(f"Start it with: flwr run {app_dir} <federation> --stream")


with_options(app, dataclass_options(TrainConfig, "train", skip=("settings",)))
flower.command("app", no_args_is_help=False)(app)
