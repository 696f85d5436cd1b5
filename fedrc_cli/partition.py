"""`fedrc partition`: build the federated benchmark as Parquet shards and a manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from fedrc_cli.common import ParamsOption, console, load_config, split_list, user_errors
from pipeline.config import PartitionConfig
from pipeline.stages import partition_stage


def partition(
    dataset: Annotated[
        str | None, typer.Option(help="fmnist or synthetic (built in, no files needed).")
    ] = None,
    data_root: Annotated[
        Path | None,
        typer.Option(
            help="Folder with the dataset's raw files; then Debian's "
            "/usr/share/datasets/fashion-mnist, then a torchvision download."
        ),
    ] = None,
    clients: Annotated[int | None, typer.Option(help="Participating clients.")] = None,
    samples_per_client: Annotated[
        int | None,
        typer.Option(
            help="Samples per client (train + test); default: the training set divided evenly."
        ),
    ] = None,
    alpha: Annotated[
        float | None, typer.Option(help="Concentration of the sequential Dirichlet label split.")
    ] = None,
    client_mix: Annotated[
        str | None,
        typer.Option(
            help="Client types: 'paper' (30/20/25/25, appendix H.8) or 'reference' "
            "(the authors' data scripts)."
        ),
    ] = None,
    styles: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated corruptions to draw from (default: the dataset's suite)."
        ),
    ] = None,
    test_fraction: Annotated[
        float | None, typer.Option(help="Share of each client's samples kept for its test split.")
    ] = None,
    holdout_samples: Annotated[
        int | None,
        typer.Option(
            help="Samples per non-participating client (class-balanced, from the test "
            "set); default: the whole test set."
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed: same seed, same bytes.")] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder.")] = None,
    params: ParamsOption = None,
) -> None:
    """Split a dataset into clients with label, feature and concept shift (FedRC benchmark)."""
    with user_errors():
        config = load_config(
            PartitionConfig,
            params,
            dataset=dataset,
            data_root=str(data_root) if data_root else None,
            clients=clients,
            samples_per_client=samples_per_client,
            alpha=alpha,
            client_mix=client_mix,
            styles=split_list(styles),
            test_fraction=test_fraction,
            holdout_samples=holdout_samples,
            seed=seed,
            out=str(out) if out else None,
        )
        with console.status(f"Partitioning {config.dataset} into {config.clients} clients…"):
            manifest = partition_stage(config)
    console.print(summary_table(manifest))
    console.print(f"Wrote [bold]{config.out}[/] (manifest.json + shards/)")


def summary_table(manifest: dict[str, Any]) -> Table:
    """Clients grouped by (participating, concept, corrupted), with their sample counts."""
    sizes: dict[tuple, list[int]] = {}
    for c in manifest["clients"]:
        key = (c["participating"], manifest["concepts"][c["concept"]], c["style"] != "none")
        sizes.setdefault(key, []).append(c["train_size"] + c["test_size"])
    table = Table(title=f"{manifest['dataset']}: {len(manifest['clients'])} clients")
    for name in ("clients", "concept", "corrupted", "count", "samples each"):
        table.add_column(name)
    for (participating, concept, corrupted), s in sorted(sizes.items(), reverse=True):
        table.add_row(
            "participating" if participating else "held-out",
            concept,
            "yes" if corrupted else "no",
            str(len(s)),
            str(s[0]) if min(s) == max(s) else f"{min(s)}–{max(s)}",
        )
    return table
