"""`fedrc partition`: build the federated benchmark as Parquet shards and a manifest."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fedrc_cli.common import ParamsOption, console, load_config, user_errors, writing
from fedrc_cli.info import render
from fedrc_cli.options import comma_lists, dataclass_options, with_options
from pipeline.config import PartitionConfig
from pipeline.data.describe import describe

PARTITION_MEMORY = "lower --replicate, --clients × --samples-per-client or --holdout-samples"


def partition(
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a benchmark already in --out.")
    ] = False,
    params: ParamsOption = None,
    **options: Any,
) -> None:
    """Split a dataset into clients with label, feature and concept shift (FedRC benchmark)."""
    with user_errors(PARTITION_MEMORY):
        config = load_config(PartitionConfig, params, **comma_lists(PartitionConfig, options))
        from pipeline import stages  # torch: imported once the options are known to be good

        status = f"Partitioning {config.dataset} into {config.clients} clients…"
        with writing("--out", config.out), console.status(status):
            manifest = stages.partition_stage(config, overwrite=overwrite)
    console.print(render(describe(manifest)))
    console.print(
        f"Wrote [bold]{config.out}[/] (manifest.json + shards/); `fedrc info` shows this again"
    )


with_options(
    partition,
    dataclass_options(
        PartitionConfig,
        "partition",
        names={"holdout_corrupted": "--holdout-corrupted/--holdout-clean"},
    ),
)
