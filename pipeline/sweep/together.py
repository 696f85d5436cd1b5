"""A sweep's points trained together in this process: `width` runs at a time, each in a thread
of its own with its own round loop, their batched executors joined in one cohort
(`pipeline.engine.cohort`), so that their local trainings run in the same batched steps. On a
GPU this is how a grid of small runs keeps the device busy; each run's numbers are those of the
run trained alone, up to float rounding.

Runs whose executor is the sequential one (`executor: auto` on a CPU, a method that trains in
stages) still run in their threads, side by side, without sharing steps. Events reach `report`
from this thread only. On Ctrl-C or SIGTERM the runs stop where they are: each keeps its last
checkpoint (written atomically), and the same sweep resumes them.
"""

from __future__ import annotations

import queue
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.config import TrainConfig
from pipeline.data.shards import FederatedData
from pipeline.engine.batched import BatchedExecutor
from pipeline.engine.cohort import Cohort
from pipeline.engine.sequential import SequentialExecutor
from pipeline.run.setup import ExecutorFactory, make_executor
from pipeline.sweep.plan import Step
from pipeline.sweep.runner import Event, Report, Work, WorkerCrashed, run_point


class Together:
    """`width` points at a time in this process, their batched trainings in one cohort."""

    def __init__(self, width: int, drop_checkpoints: bool = False, patience_s: float = 0.05):
        self.width = width
        self.drop_checkpoints = drop_checkpoints
        self.cohort = Cohort(patience_s)

    def run(self, steps: Sequence[Step], report: Report) -> None:
        works: queue.Queue[Work | None] = queue.Queue()
        for step in steps:
            works.put(Work.of(step, self.drop_checkpoints))
        count = min(self.width, len(steps))
        for _ in range(count):
            works.put(None)
        events: queue.Queue[Event | None] = queue.Queue()
        factory = cohort_factory(self.cohort)
        with _warnings_as_events(events):
            for _ in range(count):
                self.cohort.join()  # before any thread starts: the first turn waits for all
                thread = threading.Thread(
                    target=_member, args=(self.cohort, works, events, factory), daemon=True
                )  # daemon: on Ctrl-C the runs stop at their last checkpoint
                thread.start()
            left = count
            while left:
                event = events.get()
                if event is None:
                    left -= 1
                elif event.kind == "crashed":
                    raise WorkerCrashed(event.text)
                else:
                    report(event)


def cohort_factory(cohort: Cohort) -> ExecutorFactory:
    """`make_executor`, with every batched executor it makes joined to `cohort`."""

    def factory(
        config: TrainConfig, data: FederatedData, device: torch.device
    ) -> SequentialExecutor:
        executor = make_executor(config, data, device)
        if isinstance(executor, BatchedExecutor):
            executor.cohort = cohort
        return executor

    return factory


_point = threading.local()  # the point a thread runs, for its warnings


def _member(
    cohort: Cohort,
    works: queue.Queue[Work | None],
    events: queue.Queue[Event | None],
    factory: ExecutorFactory,
) -> None:
    """A thread's loop: the next point until there is none, as a member of the cohort."""
    try:
        while (work := works.get()) is not None:
            _point.name = work.name
            events.put(Event(work.name, "start"))
            try:
                run_point(work, events.put, factory)
            except FedrcError as e:
                events.put(Event(work.name, "failed", text=str(e)))
                continue
            except Exception:  # a bug: the sweep stops with its traceback, as a worker's
                events.put(Event(work.name, "crashed", text=traceback.format_exc()))
                break
            events.put(Event(work.name, "done"))
    finally:
        cohort.leave()
        events.put(None)


@contextmanager
def _warnings_as_events(events: queue.Queue[Event | None]) -> Iterator[None]:
    """A FedrcWarning raised in a member's thread becomes that point's `warning` event (the
    warnings machinery is global, so one hook serves every thread)."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            name = getattr(_point, "name", None)
            if issubclass(category, FedrcWarning) and name is not None:
                events.put(Event(name, "warning", text=str(message)))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", FedrcWarning)
        warnings.showwarning = show
        yield
