"""`fedrc train`: federated training of one algorithm on a partitioned benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedrc_cli.common import (
    INTERRUPT_CODES,
    ParamsOption,
    Terminated,
    console,
    fail,
    is_terminal,
    load_config,
    user_errors,
    writing,
)
from pipeline.config import ALGORITHMS, TrainConfig
from pipeline.run_files import checkpoint_round
from pipeline.stages import train_stage


def describe(row: dict[str, Any]) -> str:
    text = f"loss {row['train_loss']:.3f}"
    if "train_accuracy" in row:
        text += (
            f"  train {row['train_accuracy']:.3f}  local {row['local_accuracy']:.3f}"
            f"  global {row['global_accuracy']:.3f}"
        )
    return text + f"  ({row['seconds']:.1f}s)"


def train(
    data: Annotated[Path | None, typer.Option(help="Folder written by `fedrc partition`.")] = None,
    algorithm: Annotated[
        str | None, typer.Option(help=f"One of: {', '.join(ALGORITHMS)}.", show_default=False)
    ] = None,
    clusters: Annotated[int | None, typer.Option(help="K, the number of models.")] = None,
    model: Annotated[str | None, typer.Option(help="cnn, mobilenet_v2 or resnet18.")] = None,
    pretrained: Annotated[
        bool | None, typer.Option(help="Start from torchvision's ImageNet weights.")
    ] = None,
    norm: Annotated[str | None, typer.Option(help="batch or group (GroupNorm).")] = None,
    profile: Annotated[
        str | None, typer.Option(help="paper, or reference: the authors' code's settings.")
    ] = None,
    mu: Annotated[
        float | None, typer.Option(help="Proximal μ (FedProx) / λ (FedSoft, FeSEM-CAM).")
    ] = None,
    max_clusters: Annotated[int | None, typer.Option(help="CFL: cap on clusters.")] = None,
    estep: Annotated[str | None, typer.Option(help="FedRC E-step: em or adam.")] = None,
    prune_threshold: Annotated[
        float | None, typer.Option(help="FedRC adaptive K: drop models with mean γ < δ.")
    ] = None,
    prune_after: Annotated[
        int | None, typer.Option(help="FedRC adaptive K: remove no model before this round.")
    ] = None,
    merge_gap: Annotated[
        float | None,
        typer.Option(help="FedRC adaptive K: merge two models within this many nats."),
    ] = None,
    hard_train: Annotated[
        bool | None, typer.Option(help="FedRC TrHC: train only the arg-max model.")
    ] = None,
    table_noise: Annotated[
        float | None, typer.Option(help="FedRC: std ξ of noise on uploaded label tables.")
    ] = None,
    shared_body: Annotated[
        bool | None, typer.Option(help="FedRC: one shared feature extractor, K heads.")
    ] = None,
    warmup_rounds: Annotated[
        int | None, typer.Option(help="Fed-CAM: FedAvg rounds before clustering.")
    ] = None,
    server_lr: Annotated[float | None, typer.Option(help="Server learning rate η_g.")] = None,
    rounds: Annotated[int | None, typer.Option(help="Communication rounds.")] = None,
    local_epochs: Annotated[int | None, typer.Option(help="Local epochs per round.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Local mini-batch size.")] = None,
    lr: Annotated[float | None, typer.Option(help="Local SGD learning rate.")] = None,
    momentum: Annotated[float | None, typer.Option(help="SGD momentum (fresh each round).")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="SGD weight decay.")] = None,
    participation: Annotated[
        float | None, typer.Option(help="Share of participating clients sampled each round.")
    ] = None,
    eval_every: Annotated[
        int | None, typer.Option(help="Evaluate every N rounds (and at the last round).")
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            help="Write checkpoint.pt every N rounds (and at the last round); default: every "
            "round while a checkpoint is under 512 MB."
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for models, sampling and batches.")] = None,
    device: Annotated[
        str | None, typer.Option(help="auto (cuda when available), cpu or cuda.")
    ] = None,
    executor: Annotated[
        str | None, typer.Option(help="auto (batched on CUDA), batched or sequential.")
    ] = None,
    chunk_clients: Annotated[
        int | None, typer.Option(help="Batched: local trainings at once (default: from memory).")
    ] = None,
    precision: Annotated[str | None, typer.Option(help="Batched on CUDA: fp32 or bf16.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run folder.")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its checkpoint.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a finished or partial run in --out.")
    ] = False,
    params: ParamsOption = None,
) -> None:
    """Train one algorithm (FedRC or a baseline); writes metrics, ω assignments, checkpoints."""
    with user_errors():
        config = load_config(
            TrainConfig,
            params,
            data=str(data) if data else None,
            algorithm=algorithm,
            clusters=clusters,
            model=model,
            pretrained=pretrained,
            norm=norm,
            profile=profile,
            mu=mu,
            max_clusters=max_clusters,
            estep=estep,
            prune_threshold=prune_threshold,
            prune_after=prune_after,
            merge_gap=merge_gap,
            hard_train=hard_train,
            table_noise=table_noise,
            shared_body=shared_body,
            warmup_rounds=warmup_rounds,
            server_lr=server_lr,
            rounds=rounds,
            local_epochs=local_epochs,
            batch_size=batch_size,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            participation=participation,
            eval_every=eval_every,
            checkpoint_every=checkpoint_every,
            seed=seed,
            device=device,
            executor=executor,
            chunk_clients=chunk_clients,
            precision=precision,
            out=str(out) if out else None,
        )
        if resume and overwrite:
            raise fail("--resume and --overwrite: choose one")
        done: dict[str, Any] = {"round": None}
        with writing("--out", config.out):
            try:
                if is_terminal():
                    run_with_progress(config, resume, overwrite, done)
                else:

                    def log(row: dict[str, Any]) -> None:
                        if done["round"] is None:
                            print(f"{config.algorithm} (K={config.num_models}) → {config.out}")
                        done["round"] = row["round"]
                        print(f"round {row['round']}/{config.rounds}  {describe(row)}", flush=True)

                    train_stage(config, resume=resume, overwrite=overwrite, on_round=log)
            except (KeyboardInterrupt, Terminated) as e:
                code = INTERRUPT_CODES[type(e)]
                raise fail(stopped_message(e, config, done["round"]), code) from None
    console.print(f"Done: {config.out}/metrics.jsonl, assignments.parquet, model.pt")


def stopped_message(error: BaseException, config: TrainConfig, completed: int | None) -> str:
    """Where an interrupted run stopped, what its checkpoint holds, and how to go on."""
    name = "interrupted" if isinstance(error, KeyboardInterrupt) else "terminated (SIGTERM)"
    where = f"after round {completed}" if completed else "before the first round ended"
    saved = checkpoint_round(Path(config.out))
    if saved is None:
        return f"{name} {where}; no checkpoint yet: start again with --overwrite"
    return (
        f"{name} {where}; last checkpoint: round {saved}; continue with: "
        f"fedrc train --out {config.out} --resume (and the same options)"
    )


def run_with_progress(config: TrainConfig, resume: bool, overwrite: bool, done: dict) -> None:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[latest]}"),
    )
    with Progress(*columns, console=console) as progress:
        name = f"{config.algorithm} K={config.num_models}"
        task = progress.add_task(name, total=config.rounds, latest="")

        def update(row: dict[str, Any]) -> None:
            done["round"] = row["round"]
            progress.update(task, completed=row["round"], latest=describe(row))

        train_stage(config, resume=resume, overwrite=overwrite, on_round=update)
