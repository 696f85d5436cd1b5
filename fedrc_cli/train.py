"""`fedrc train`: its options are TrainConfig's fields (`fedrc_cli.options`); an algorithm's
or model's own settings are `--set KEY=VALUE`. The training modules (torch) are imported inside
the functions that run them, so that `fedrc --help` does not wait for torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fedrc_cli.common import (
    INTERRUPT_CODES,
    ParamsOption,
    Terminated,
    check_names,
    console,
    fail,
    is_terminal,
    user_errors,
    writing,
)
from fedrc_cli.failures import TRAIN_MEMORY
from fedrc_cli.options import comma_lists, dataclass_options, with_options
from pipeline.common.errors import FedrcError
from pipeline.config import TrainConfig, read_params

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="An algorithm's or model's own setting, KEY=VALUE (repeatable), e.g. --set "
        "estep=adam; `fedrc info ALGORITHM` lists them.",
        show_default=False,
    ),
]


def train(
    set_: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out with its saved settings.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a finished or partial run in --out.")
    ] = False,
    params: ParamsOption = None,
    **options: Any,
) -> None:
    """Train one algorithm (FedRC or a baseline); writes metrics, ω assignments, checkpoints.

    Later wins: built-in defaults < profile < params.yaml `train:` <
    `per_algorithm.<algorithm>` < command-line options < `--set`.

    An algorithm's or model's own settings sit under its name in `train:`
    (train: {fedrc: {estep: adam}}) or go in --set. With --resume, the run's
    config.json is the start, and only what leaves the numbers alone may change.
    """
    with user_errors(TRAIN_MEMORY):
        if resume and overwrite:
            raise fail("--resume and --overwrite: choose one")
        check_names("--out", options.get("out") or TrainConfig().out)
        options = comma_lists(TrainConfig, options)
        from fedrc_cli.progress import run_with_progress
        from pipeline.run.resolve import train_config
        from pipeline.stages import train_stage

        config = resumed_config(options, set_ or [], params) if resume else None
        config = config or train_config(read_params(params), options, set_ or [])
        done: dict[str, Any] = {"round": None}
        with writing("--out", config.out):
            try:
                if is_terminal():
                    run_with_progress(config, resume, overwrite, done)
                else:
                    on_round = log(config, done)
                    train_stage(config, resume=resume, overwrite=overwrite, on_round=on_round)
            except (KeyboardInterrupt, Terminated) as e:
                code = INTERRUPT_CODES[type(e)]
                raise fail(stopped_message(e, config, done["round"]), code) from None
    console.print(f"Done: {config.out}/metrics.jsonl, assignments.parquet, model.pt")


with_options(train, dataclass_options(TrainConfig, "train", skip=("settings",)))


def resumed_config(
    options: dict[str, Any], sets: list[str], params: Path | None
) -> TrainConfig | None:
    """The configuration saved in --out, with what may change (./params.yaml is not read: a run
    resumes as it began). None when --out holds no run yet (the stage then explains)."""
    from pipeline.run.files import CONFIG
    from pipeline.run.resolve import resumed
    from pipeline.stages import run_config

    out = Path(options.get("out") or TrainConfig().out)
    if not (out / CONFIG).is_file():
        return None
    given = read_params(params) if params else None
    return resumed(run_config(out, "--out"), options, sets, str(out), given)


def log(config: TrainConfig, done: dict[str, Any]) -> Any:
    """Plain lines for a log file (no terminal): a header, then one line per round."""
    from pipeline.algorithms import num_models

    def line(row: dict[str, Any]) -> None:
        if done["round"] is None:
            print(f"{config.algorithm} (K={num_models(config)}) → {config.out}")
        done["round"] = row["round"]
        print(f"round {row['round']}/{config.rounds}  {describe(row)}", flush=True)

    return line


def describe(row: dict[str, Any]) -> str:
    text = f"loss {row['train_loss']:.3f}"
    if "train_accuracy" in row:
        text += (
            f"  train {row['train_accuracy']:.3f}  local {row['local_accuracy']:.3f}"
            f"  global {row['global_accuracy']:.3f}"
        )
    return text + f"  ({row['seconds']:.1f}s)"


def stopped_message(error: BaseException, config: TrainConfig, completed: int | None) -> str:
    """Where an interrupted run stopped, what its checkpoint holds, and how to go on."""
    from pipeline.common.dvc_stage import stage_root
    from pipeline.run.files import checkpoint_round
    from pipeline.run.staged import staged_checkpoint
    from pipeline.stages import run_config

    name = "interrupted" if isinstance(error, KeyboardInterrupt) else "terminated (SIGTERM)"
    where = f"after round {completed}" if completed else "before the first round ended"
    root = stage_root()
    if root is not None:  # trained in its staging folder (`pipeline.run.staged`)
        saved = staged_checkpoint(root, config.out)
        if saved is None:
            return f"{name} {where}; no checkpoint yet: the next `dvc repro` starts it over"
        return f"{name} {where}; last checkpoint: round {saved}; the next `dvc repro` resumes it"
    saved = checkpoint_round(Path(config.out))
    if saved is None:
        return f"{name} {where}; no checkpoint yet: run the same command again to start it over"
    try:  # an extension of a finished run stopped before its first checkpoint: config.json
        recorded = run_config(Path(config.out), "--out").rounds  # still has the old rounds
    except FedrcError:
        recorded = config.rounds
    more = "" if recorded == config.rounds else f" --rounds {config.rounds}"
    return (
        f"{name} {where}; last checkpoint: round {saved}; continue with: "
        f"fedrc train --out {config.out} --resume{more}"
    )
