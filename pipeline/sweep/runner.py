"""Running a sweep's steps: here, one after the other, or in worker processes on a CPU.

`run_step` is one point's work: train (fresh, or resumed from its checkpoint), then eval and
plot where they are missing, as `fedrc train`, `fedrc eval` and `fedrc plot` would; its folder
is an ordinary run folder. A runner takes the steps that need work and a function to which it
reports what happens (`Event`); a point that fails with a FedrcError is reported and the
others go on. `Processes` runs `jobs` workers, each with one thread, a point at a time;
`Together` (pipeline.sweep.together) trains several points in this process, their local
trainings in the same batched steps (a GPU).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.config import EvalConfig, PlotConfig, config_dict
from pipeline.run import files as rf
from pipeline.run.derived import EVAL, PLOTS
from pipeline.run.resolve import from_values
from pipeline.run.setup import ExecutorFactory, make_executor
from pipeline.run.training import run_training
from pipeline.stages import eval_stage, plot_stage
from pipeline.sweep.plan import Step


@dataclass(frozen=True)
class Event:
    """What happened to a point: `start`, `round` (its number), `done`, `failed` or `warning`
    (`text`: the one-line message)."""

    point: str
    kind: str
    round: int = 0
    text: str = ""


Report = Callable[[Event], None]


class Runner(Protocol):
    def run(self, steps: Sequence[Step], report: Report) -> None:
        """Run every step, reporting each point's events; a KeyboardInterrupt stops it."""


@dataclass(frozen=True)
class Work:
    """A step as plain values (a worker rebuilds the configuration: a plugin's classes need
    not be picklable), and what to do once it is complete."""

    name: str
    config: dict[str, Any]
    eval: dict[str, Any]
    plot: dict[str, Any] | None
    train: bool
    resume: bool
    drop_checkpoints: bool

    @staticmethod
    def of(step: Step, drop_checkpoints: bool) -> Work:
        plot = None if step.plot is None else config_dict(step.plot)
        config = config_dict(step.point.config)
        return Work(
            step.point.name,
            config,
            config_dict(step.eval),
            plot,
            step.train,
            step.resume,
            drop_checkpoints,
        )


def run_work(work: Work, report: Report) -> None:
    """One point: train or resume it, then eval and plot where missing; a FedrcError is its
    `failed` event, each FedrcWarning a `warning` event."""
    report(Event(work.name, "start"))
    with _warnings_to(work.name, report):
        try:
            run_point(work, report)
        except FedrcError as e:
            report(Event(work.name, "failed", text=str(e)))
            return
    report(Event(work.name, "done"))


def run_point(
    work: Work, report: Report, executor_factory: ExecutorFactory = make_executor
) -> None:
    """A point's train (or resume), eval and plot, as `run_work` without its events: a
    runner that reports them itself calls this."""
    config = from_values(work.config)
    folder = Path(config.out)
    if work.train or work.resume:

        def on_round(row: dict[str, Any]) -> None:
            report(Event(work.name, "round", row["round"]))

        run_training(
            config,
            resume=work.resume,
            overwrite=work.train,
            on_round=on_round,
            executor_factory=executor_factory,
        )
    if not (folder / EVAL).is_file():
        eval_stage(EvalConfig(**work.eval))
    if work.plot is not None and not (folder / PLOTS).is_dir():
        plot_stage(PlotConfig(**work.plot))
    if work.drop_checkpoints:
        for path in [folder / rf.CHECKPOINT, *folder.glob(rf.MOMENTUM_SNAPSHOTS)]:
            path.unlink(missing_ok=True)


@contextmanager
def _warnings_to(name: str, report: Report) -> Iterator[None]:
    """FedrcWarnings raised inside become `warning` events; others show as Python shows them."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            if issubclass(category, FedrcWarning):
                report(Event(name, "warning", text=str(message)))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", FedrcWarning)
        warnings.showwarning = show
        yield


class InProcess:
    """The steps one after the other in this process (the threads torch is given)."""

    def __init__(self, drop_checkpoints: bool = False) -> None:
        self.drop_checkpoints = drop_checkpoints

    def run(self, steps: Sequence[Step], report: Report) -> None:
        for step in steps:
            run_work(Work.of(step, self.drop_checkpoints), report)


class WorkerCrashed(Exception):
    """A worker process failed with an error that is not a user's (a bug, a full disk): its
    traceback, as text."""


class Processes:
    """`jobs` worker processes (spawned, one thread each), each taking the next step when it
    is done with one. Ctrl-C reaches the workers too: each stops its run at its last
    checkpoint."""

    def __init__(self, jobs: int, drop_checkpoints: bool = False) -> None:
        self.jobs = jobs
        self.drop_checkpoints = drop_checkpoints

    def run(self, steps: Sequence[Step], report: Report) -> None:
        context = multiprocessing.get_context("spawn")
        tasks, events = context.Queue(), context.Queue()
        for step in steps:
            tasks.put(Work.of(step, self.drop_checkpoints))
        count = min(self.jobs, len(steps))
        for _ in range(count):
            tasks.put(None)
        with _one_thread():
            workers = [context.Process(target=_worker, args=(tasks, events)) for _ in range(count)]
            for worker in workers:
                worker.start()
        try:
            _relay(workers, events, report)
        finally:
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()  # the run's files are written atomically
                worker.join()
            for channel in (tasks, events):
                channel.cancel_join_thread()
                channel.close()


@contextmanager
def _one_thread() -> Iterator[None]:
    """Workers started inside get one thread each (torch reads it when it is imported)."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


def _relay(workers: list[Any], events: Any, report: Report) -> None:
    """Hand the workers' events to `report` until every worker has left; a worker that died
    without a word (killed by the system) fails the point it held."""
    gone: set[int] = set()
    holding: dict[int, str] = {}
    while len(gone) < len(workers):
        try:
            pid, event = events.get(timeout=1.0)
        except queue.Empty:  # a worker's last events reach the queue before it ends
            for worker in workers:
                if worker.exitcode is not None and worker.pid not in gone:
                    gone.add(worker.pid)
                    if worker.pid in holding:
                        name = holding.pop(worker.pid)
                        why = f"its worker process ended with exit code {worker.exitcode}"
                        report(Event(name, "failed", text=f"{name}: {why}"))
            continue
        if event.kind == "exit":
            gone.add(pid)
        elif event.kind == "crashed":
            raise WorkerCrashed(event.text)
        else:
            if event.kind == "start":
                holding[pid] = event.point
            elif event.kind in ("done", "failed"):
                holding.pop(pid, None)
            report(event)


def _worker(tasks: Any, events: Any) -> None:
    """A worker's loop: the next step until there is none; its events go to the parent."""
    import torch

    torch.set_num_threads(1)
    pid = os.getpid()

    def send(event: Event) -> None:
        events.put((pid, event))

    try:
        while (work := tasks.get()) is not None:
            run_work(work, send)
    except KeyboardInterrupt:
        pass  # Ctrl-C: the parent has it too and says what stopped
    except Exception:
        send(Event("", "crashed", text=traceback.format_exc()))
    send(Event("", "exit"))
