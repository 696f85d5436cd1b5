"""The training progress bar for a terminal: the round count and the times always fit (80
columns included); the latest metrics take what width is left and are cut with "…"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from fedrc_cli.common import console
from pipeline.algorithms import num_models
from pipeline.config import TrainConfig
from pipeline.stages import train_stage

BAR = 10  # characters of bar: enough to see progress, little enough to leave room
CLOCK = 7  # "0:00:00"


class RemainingColumn(ProgressColumn):
    """Time left: seconds a round (the task's `per_round`) × rounds left, counted down since the
    last round ended (`ended`); unknown only until the first round ends. rich's own column
    divides by a speed it measures over its last 30 s, which never holds two rounds when a
    round takes longer: it then shows -:--:-- for the whole run."""

    def render(self, task: Task) -> Text:
        per_round = task.fields.get("per_round")
        if per_round is None or task.total is None:
            return Text("-:--:--", style="progress.remaining")
        left = per_round * (task.total - task.completed) - (task.get_time() - task.fields["ended"])
        minutes, seconds = divmod(int(max(left, 0.0)), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


class RoundClock:
    """Seconds a round: the first finished round's own time, then the mean time between the
    rounds since it ended (evaluations and checkpoints included). Counting from the first round
    this process finished, not from round 1, keeps a resumed run's estimate right."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None  # (round, when it ended)

    def per_round(self, round_: int, seconds: float, now: float) -> float:
        if self.first is None:
            self.first = (round_, now)
            return seconds
        start_round, start = self.first
        return (now - start) / (round_ - start_round)


def columns(name: str, total: int, width: int) -> tuple[ProgressColumn, ...]:
    """Name, bar, count, elapsed, remaining at their full widths; metrics in the rest."""
    count = 2 * len(str(total)) + 1
    fixed = len(name) + BAR + count + 2 * CLOCK + 5  # five one-space gaps
    return (
        TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=BAR),
        MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=count)),
        TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=CLOCK)),
        RemainingColumn(table_column=Column(no_wrap=True, min_width=CLOCK)),
        TextColumn(
            "{task.fields[latest]}",
            table_column=Column(
                no_wrap=True, overflow="ellipsis", max_width=max(width - fixed - 1, 1)
            ),
        ),
    )


def compact(row: dict[str, Any]) -> str:
    """The round's numbers, most telling first: loss, then global and local accuracy."""
    text = f"loss {row['train_loss']:.3f}"
    if "global_accuracy" in row:
        text += f" glob {row['global_accuracy']:.3f} loc {row['local_accuracy']:.3f}"
    return text + f" ({row['seconds']:.1f}s)"


def progress_bar(
    name: str, total: int, where: Console, get_time: Callable[[], float] | None = None
) -> tuple[Progress, TaskID]:
    """A Progress and its one task, sized for `where`'s width (`get_time`: rich's clock)."""
    progress = Progress(
        *columns(name, total, where.width), console=where, expand=False, get_time=get_time
    )
    return progress, progress.add_task(name, total=total, latest="", per_round=None, ended=0.0)


def round_done(progress: Progress, task: TaskID, clock: RoundClock, row: dict[str, Any]) -> None:
    """Show a finished round: the count, its numbers and the time left."""
    now = progress.get_time()
    per_round = clock.per_round(row["round"], row["seconds"], now)
    progress.update(
        task, completed=row["round"], latest=compact(row), per_round=per_round, ended=now
    )


def run_with_progress(config: TrainConfig, resume: bool, overwrite: bool, done: dict) -> None:
    progress, task = progress_bar(
        f"{config.algorithm} K={num_models(config)}", config.rounds, console
    )
    clock = RoundClock()
    with progress:

        def update(row: dict[str, Any]) -> None:
            done["round"] = row["round"]
            round_done(progress, task, clock, row)

        train_stage(config, resume=resume, overwrite=overwrite, on_round=update)
