"""What `fedrc sweep` shows while it runs: one progress bar over the whole grid on a terminal
(rounds done, runs finished, the time left, the runs in progress), plain lines elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

from fedrc_cli.common import console, error_console, warning_line
from pipeline.run import files as rf
from pipeline.sweep.plan import Step
from pipeline.sweep.runner import Event


class Tally:
    """Rounds and runs done over the whole grid, and the time left: the seconds a round took
    in this session (all workers together) × the rounds left."""

    def __init__(self, steps: list[Step], clock: Callable[[], float] = time.monotonic) -> None:
        self.total = sum(s.point.config.rounds for s in steps)
        self.runs = len(steps)
        self.clock, self.start = clock, clock()
        self.round: dict[str, int] = {}
        for step in steps:
            done = 0 if step.train else step.point.config.rounds
            if step.resume:
                done = min(rf.logged_rounds(step.folder / rf.METRICS), done)
            self.round[step.point.name] = done
        self.first = sum(self.round.values())
        self.finished = sum(1 for s in steps if s.complete)
        self.ended: set[str] = set()  # the runs that reported done or failed here
        self.failed: dict[str, str] = {}
        self.running: list[str] = []

    @property
    def rounds(self) -> int:
        return sum(self.round.values())

    def left(self) -> float | None:
        """Seconds left, or None until a round has ended in this session."""
        done = self.rounds - self.first
        if done <= 0:
            return None
        return (self.clock() - self.start) / done * (self.total - self.rounds)

    def add(self, event: Event) -> None:
        name = event.point
        if event.kind == "start":
            self.running.append(name)
        elif event.kind == "round":
            self.round[name] = event.round
        elif event.kind in ("done", "failed"):
            self.running.remove(name)
            self.ended.add(name)
            if event.kind == "done":
                self.finished += 1
            else:
                self.failed[name] = event.text


class LeftColumn(ProgressColumn):
    """The time left over the whole grid (`Tally.left`)."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(table_column=Column(no_wrap=True, min_width=7))
        self.tally = tally

    def render(self, task: Task) -> Text:
        left = self.tally.left()
        if left is None:
            return Text("-:--:--", style="progress.remaining")
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


def show_on_terminal(tally: Tally) -> tuple[Progress, Callable[[Event], None]]:
    """A rich Progress over the grid, and the function that feeds it the runs' events."""
    progress = Progress(
        TextColumn("[bold]sweep"),
        BarColumn(bar_width=10),
        TextColumn("{task.fields[runs]}", table_column=Column(no_wrap=True)),
        TimeElapsedColumn(),
        LeftColumn(tally),
        TextColumn("{task.fields[now]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=console,
    )
    task = progress.add_task("sweep", total=tally.total, runs="", now="")

    def update(event: Event) -> None:
        tally.add(event)
        say(event, progress.console.print)
        runs = f"{tally.finished}/{tally.runs} runs"
        now = ", ".join(f"{n} {tally.round[n]}" for n in tally.running)
        progress.update(task, completed=tally.rounds, runs=runs, now=now)

    update(Event("", "none"))
    return progress, update


def show_as_lines(tally: Tally) -> Callable[[Event], None]:
    """One line per run started, finished or failed (a log file, a DVC stage)."""

    def update(event: Event) -> None:
        tally.add(event)
        if event.kind == "start":
            console.print(
                f"{escape(event.point)}: running ({len(tally.running)} now, "
                f"{tally.finished}/{tally.runs} finished)",
                highlight=False,
            )
        say(event, console.print)

    return update


def say(event: Event, print_: Callable[..., Any]) -> None:
    """A finished or failed run, or a warning, as one line."""
    if event.kind == "done":
        print_(f"{escape(event.point)}: done", highlight=False)
    elif event.kind == "failed":
        error_console.print(
            f"[bold red]{escape(event.point)} failed:[/] {escape(event.text)}",
            highlight=False,
            soft_wrap=True,
        )
    elif event.kind == "warning":
        warning_line(f"{event.point}: {event.text}")
