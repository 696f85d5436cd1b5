"""What a run records as it goes, written by the main place: config.json, a row a round in
metrics.jsonl, each evaluated round's ω in assignments.parquet, and the rows for DVCLive and the
trackers of `--log` (TensorBoard, W&B, MLflow).

A resumed run's metrics.jsonl is cut back to its checkpoint's round first. Extending a finished
run (`--resume` with more `--rounds`): its files stay as they were (whole) until the extension's
first checkpoint. There metrics.jsonl with the new rows, assignments.parquet, config.json and
checkpoint.pt are all written to temporary files first (a full disk or a file-size limit
leaves the run whole), then renamed in that order, and only then are model.pt and what eval
and plot made of the old run removed: a kill between the renames leaves a folder that
`--resume --rounds N` continues (`fedrc eval` refuses its model.pt, behind metrics.jsonl).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.common.io import atomic_file, atomic_files, json_text, naming, write_json
from pipeline.config import config_dict
from pipeline.data.time_steps import step_of
from pipeline.run import files as rf
from pipeline.run.assignments import write_assignments
from pipeline.run.derived import remove_derived
from pipeline.run.live import round_logger
from pipeline.run.setup import Progress, Run
from pipeline.run.trackers import Tracker, open_trackers


class RunLog:
    """The run's record; on a place other than the main one every call does nothing."""

    def __init__(self, run: Run, out: Path, digest: str) -> None:
        self.out, self.main = out, run.comm.is_main
        self.config, self.clients = run.config, run.data.clients
        self.steps = run.data.time_steps
        self.values = {**config_dict(run.config), "data_digest": digest}  # config.json
        self.identity = rf.run_identity(run.config, digest)
        self.held: list[dict[str, Any]] | None = None  # an extension's rows, until written
        self.live = None
        self.trackers: list[Tracker] = []

    def open(self, progress: Progress, resume: bool) -> None:
        """Start the record: from scratch, or after the checkpoint's round when resuming."""
        if not self.main:
            return
        if resume:
            rf.truncate_metrics(self.out / rf.METRICS, progress.round)
        finished = (self.out / rf.MODEL).is_file()
        if resume and finished and progress.round < self.config.rounds:
            self.held = []
        else:
            write_json(self.out / rf.CONFIG, self.values)
        logged = rf.read_metrics(self.out / rf.METRICS) if resume else []
        self.live = round_logger(self.out, logged)
        self.trackers = open_trackers(self.config.log, self.out, self.values, logged)

    def add(self, row: dict[str, Any], progress: Progress) -> None:
        """A round's row (held back while an extension has not reached its checkpoint)."""
        if self.held is not None:
            self.held.append(row)
        elif self.main:
            self.write([row], progress)

    def checkpoint(self, progress: Progress, save: Callable[[Path | None], None]) -> None:
        """The round's checkpoint: `save(None)` writes it in place; an extension's first is
        written with the rounds held back, all or nothing (the module's docstring)."""
        if self.held is None:
            save(None)
            return
        out, held = self.out, self.held
        logged = (out / rf.METRICS).read_text()
        writes: dict[str, Callable[[Path], Any]] = {  # in the order they are renamed
            rf.METRICS: lambda tmp: tmp.write_text(logged + "".join(map(rf.metrics_line, held))),
            rf.ASSIGNMENTS: lambda tmp: self.write_assignments(tmp, progress),
            rf.CONFIG: lambda tmp: tmp.write_text(json_text(self.values)),
            rf.CHECKPOINT: save,
        }
        with atomic_files(*(out / name for name in writes)) as tmps:
            for (name, write), tmp in zip(writes.items(), tmps):
                with naming(out / name):  # a full disk or a size limit names the file
                    write(tmp)
        (out / rf.MODEL).unlink(missing_ok=True)
        remove_derived(out)  # eval.json and plots/ describe fewer rounds
        rf.prune_momentum(out, progress.round)
        for row in held:
            if self.live is not None:
                self.live(row)
            for tracker in self.trackers:
                tracker(row)
        self.held = None

    def write(self, rows: list[dict[str, Any]], progress: Progress) -> None:
        """metrics.jsonl, assignments.parquet, DVCLive and the trackers."""
        for row in rows:
            rf.append_metrics(self.out / rf.METRICS, row)
            if self.live is not None:
                self.live(row)
            for tracker in self.trackers:
                tracker(row)
        if progress.history:
            with atomic_file(self.out / rf.ASSIGNMENTS) as tmp:
                self.write_assignments(tmp, progress)

    def write_assignments(self, path: Path, progress: Progress) -> None:
        """ω at every evaluated round so far, into `path`."""
        per_step = self.config.rounds_per_step
        steps = [step_of(r, per_step, self.steps) for r in progress.eval_rounds]
        rounds, history = progress.eval_rounds, progress.history
        write_assignments(path, rounds, history, self.clients, steps, self.identity)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        for tracker in self.trackers:
            tracker.close()
