"""Several runs in one process share the batched executor's steps: a cohort.

Each run of a cohort trains in a thread of its own, with its own round loop and its own
`BatchedExecutor`; when an executor has a chunk of local trainings ready it hands it to the
cohort (`BatchedExecutor.cohort`) and waits. The cohort trains the chunks that are waiting
together, as one chunk of the first one's executor (`train_tasks`: every task keeps its own
run's batch size, epochs, learning rate, weight decay and momentum), and hands each run its
results. On a GPU, where one paper-scale run's local step is a few large kernels that leave the
device mostly idle, N runs then cost about the launches of one.

When to train: as soon as every member of the cohort is waiting (they reach their trainings
in step, round after round), or when the oldest chunk has waited `patience_s` (a member busy
elsewhere, evaluating or aggregating, does not hold the others back for longer). Chunks of
executors that cannot share a step (another model, device or precision) wait for the next
turn; what one turn trains is capped at what one run's chunk may hold in the memory free at
that moment (`BatchedExecutor.chunk_size`), so that N runs need no more memory for their
trainings than one. A task's numbers do not depend on the chunk it trains in, up to float
rounding (tests/test_cohort.py: each run equals the run trained alone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pipeline.engine.batched import BatchedExecutor
from pipeline.engine.sequential import NonFiniteLoss
from pipeline.engine.task import Job, LocalResult


@dataclass
class Request:
    """One executor's chunk, waiting to be trained."""

    executor: BatchedExecutor
    jobs: list[Job]
    since: float = field(default_factory=time.monotonic)
    results: list[LocalResult] | None = None
    error: BaseException | None = None


class Cohort:
    """The runs whose executors train their chunks together (the module's docstring).

    A run is a member from `join` to `leave` (or inside `with cohort.member():`)."""

    def __init__(self, patience_s: float = 0.05) -> None:
        self.patience_s = patience_s
        self.changed = threading.Condition()
        self.members = 0
        self.waiting: list[Request] = []
        self.turns = 0  # trained turns, and chunks trained in them (for benchmarks and tests)
        self.chunks = 0

    def join(self) -> None:
        """One more run in the cohort: a turn waits for it (join before the run's thread
        starts, so that the first turn already waits for every run)."""
        with self.changed:
            self.members += 1

    def leave(self) -> None:
        """A run is over (its thread's last act): the turns no longer wait for it."""
        with self.changed:
            self.members -= 1
            self.changed.notify_all()  # the others may now all be waiting

    @contextmanager
    def member(self) -> Iterator[None]:
        """`join` and `leave` around a run."""
        self.join()
        try:
            yield
        finally:
            self.leave()

    def train(self, executor: BatchedExecutor, jobs: list[Job]) -> list[LocalResult]:
        """`executor`'s chunk trained in the next turn that takes it; its results, in order."""
        request = Request(executor, jobs)
        with self.changed:
            self.waiting.append(request)
            self.changed.notify_all()
            while request.results is None and request.error is None:
                if self._due():
                    turn = self._take()
                    self.changed.release()
                    try:
                        _train_turn(turn)
                    finally:
                        self.changed.acquire()
                    self.turns, self.chunks = self.turns + 1, self.chunks + len(turn)
                    self.changed.notify_all()
                else:
                    self.changed.wait(self._wait_s())
        if request.error is not None:
            raise request.error
        return request.results

    def _due(self) -> bool:
        """A turn can start: every member is waiting, or the oldest chunk waited long enough."""
        if not self.waiting:
            return False
        oldest = min(r.since for r in self.waiting)
        return len(self.waiting) >= self.members or time.monotonic() - oldest >= self.patience_s

    def _wait_s(self) -> float:
        oldest = min((r.since for r in self.waiting), default=time.monotonic())
        return max(1e-3, self.patience_s - (time.monotonic() - oldest))

    def _take(self) -> list[Request]:
        """The oldest chunk and the waiting chunks that can share its step, as many tasks as
        one chunk of the oldest's executor may hold now; they leave the queue."""
        first = min(self.waiting, key=lambda r: r.since)
        limit = first.executor.chunk_size(first.jobs[0][1])
        turn, size = [], 0
        for request in sorted(self.waiting, key=lambda r: r.since):
            fits = size + len(request.jobs) <= limit or not turn
            if fits and _compatible(first.executor, request.executor):
                turn.append(request)
                size += len(request.jobs)
        for request in turn:
            self.waiting.remove(request)
        return turn


def _compatible(a: BatchedExecutor, b: BatchedExecutor) -> bool:
    """Whether two executors' tasks can train in one batched step: the same model (its
    parameters' and buffers' names and shapes), device, precision and convolution path, and
    either both SGD (each task keeps its own numbers) or the same Adam at the same lr."""
    same_model = type(a.model) is type(b.model) and a.shapes == b.shapes
    same_names = a.param_names == b.param_names and a.buffer_names == b.buffer_names
    same_place = (a.device, a.precision, a.conv) == (b.device, b.precision, b.conv)
    same_rule = a.rule == b.rule and (a.rule is None or a.lr == b.lr)
    return same_model and same_names and same_place and same_rule


def _train_turn(turn: list[Request]) -> None:
    """The turn's chunks as one chunk of the first executor; each request gets its results,
    or the error of its own first task whose loss was not finite (the others train on)."""
    jobs = [job for request in turn for job in request.jobs]
    owners = [request.executor for request in turn for _ in request.jobs]
    try:
        results = turn[0].executor.train_tasks(jobs, owners)
    except NonFiniteLoss:
        for request in turn:  # which runs diverged: each chunk again, alone
            try:
                request.results = request.executor.train_tasks(
                    request.jobs, [request.executor] * len(request.jobs)
                )
            except NonFiniteLoss as e:
                request.error = e
        return
    except BaseException as e:  # a bug or no memory: every waiting run stops with it
        for request in turn:
            request.error = e
        return
    start = 0
    for request in turn:
        request.results = results[start : start + len(request.jobs)]
        start += len(request.jobs)
