"""`fedrc sweep`: algorithms × seeds × any train setting, one ordinary run folder per point,
each trained, evaluated and plotted; stopped, it goes on where it stopped."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedrc_cli.common import (
    INTERRUPT_CODES,
    ParamsOption,
    Terminated,
    console,
    fail,
    is_terminal,
    user_errors,
    writing,
)
from pipeline.common.errors import counted, first_few
from pipeline.config import EvalConfig, PlotConfig

if TYPE_CHECKING:
    from pipeline.sweep.grid import Point
    from pipeline.sweep.runner import Runner

GridOption = Annotated[
    list[str] | None,
    typer.Option(
        "--grid",
        help="An axis of the grid, KEY=V1,V2,… (repeatable): algorithm, seed, any train option "
        "(lr, clusters, rounds, data, …) or an algorithm's or model's setting (fedrc.estep, "
        "mu). Replaces the same key of params.yaml's sweep.grid.",
        show_default=False,
    ),
]


def sweep(
    grid: GridOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The sweep's folder: one run folder per point, named by what varies "
            "(default: sweep.out, else runs/sweep).",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", help="Runs at once, each a process with one thread.")
    ] = 1,
    together: Annotated[
        int,
        typer.Option(
            "--together",
            help="Runs at once in this process, their local trainings in the same batched "
            "steps (the batched executor: a GPU). 0: off.",
        ),
    ] = 0,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Train again the points whose folder holds a run of other settings or code, "
            "and remove the runs of points no longer in the grid.",
        ),
    ] = False,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Draw each run's plots (fedrc plot).")
    ] = True,
    drop_checkpoints: Annotated[
        bool,
        typer.Option(
            "--drop-checkpoints",
            help="Remove a run's checkpoint once it is evaluated (it can no longer be extended "
            "with more rounds).",
        ),
    ] = False,
    params: ParamsOption = None,
) -> None:
    """Train, evaluate and plot every point of a grid: algorithms × seeds × settings.

    The grid is params.yaml's `sweep: {out, grid: {KEY: values}}` and --grid. Each point is
    an ordinary run folder (`fedrc report OUT` compares them); run again, the command keeps
    the finished runs, resumes the stopped ones from their checkpoints and trains the rest.
    """
    with user_errors():
        if jobs < 1:
            raise fail(f"--jobs: expected an integer >= 1, got {jobs}")
        if together < 0:
            raise fail(f"--together: expected an integer >= 0, got {together}")
        if together and jobs > 1:
            raise fail("--together and --jobs: choose one (runs in this process, or processes)")
        from pipeline.config import build_config, read_params
        from pipeline.sweep.grid import read_grid

        values = read_params(params)
        folder, points = read_grid(values, grid or [], None if out is None else str(out))
        eval_config = build_config(EvalConfig, values)
        plot_config = build_config(PlotConfig, values) if plots else None
        with writing("--out", folder):
            runner = choose_runner(jobs, together, drop_checkpoints)
            trained, failed = run_sweep(folder, points, (eval_config, plot_config), replace, runner)
        if failed:
            raise fail(
                f"{counted(len(failed), 'run')} of {len(points)} failed "
                f"({first_few(sorted(failed))}); the others are in {folder}, and the same "
                "command trains the failed ones again"
            )
    kept = len(points) - trained
    console.print(
        f"Done: {counted(len(points), 'run')} in {folder} ({trained} ran now, {kept} kept "
        f"as they were); compare them with `fedrc report {folder}`",
        soft_wrap=True,
    )


def choose_runner(jobs: int, together: int, drop_checkpoints: bool) -> Runner:
    """One point after another, `--jobs` processes, or `--together` runs in this process."""
    from pipeline.sweep.runner import InProcess, Processes

    if together:
        from pipeline.sweep.together import Together

        return Together(together, drop_checkpoints)
    return InProcess(drop_checkpoints) if jobs == 1 else Processes(jobs, drop_checkpoints)


def run_sweep(
    folder: Path,
    points: list[Point],
    derived: tuple[EvalConfig, PlotConfig | None],
    replace: bool,
    runner: Runner,
) -> tuple[int, dict[str, str]]:
    """Plan the points under the folder's lock, run what is left; returns how many ran and
    the failed ones with their messages."""
    from fedrc_cli.sweep_progress import Tally, show_as_lines, show_on_terminal
    from pipeline.common.run_lock import writer_lock
    from pipeline.sweep.plan import plan

    with writer_lock(folder, "--out", "fedrc sweep"):
        steps = plan(points, folder, *derived, replace)
        todo = [s for s in steps if not s.complete]
        tally = Tally(steps)
        try:
            if is_terminal():
                progress, update = show_on_terminal(tally)
                with progress:
                    runner.run(todo, update)
            else:
                runner.run(todo, show_as_lines(tally))
        except (KeyboardInterrupt, Terminated) as e:
            raise fail(
                f"{'interrupted' if isinstance(e, KeyboardInterrupt) else 'terminated'}; "
                f"{tally.finished} of {len(steps)} runs finished; the same command goes on "
                "where this one stopped",
                INTERRUPT_CODES[type(e)],
            ) from None
    for step in todo:  # a worker that ended early (killed by the system) left these
        if step.point.name not in tally.ended:
            tally.failed[step.point.name] = "not run: its worker process ended first"
    return len(todo), tally.failed
