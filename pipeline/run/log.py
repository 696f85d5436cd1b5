"""What a run records as it goes, written by the main place: config.json, a row a round in
metrics.jsonl, each evaluated round's ω in assignments.parquet, and the rows for DVCLive and the
trackers of `--log` (TensorBoard, W&B, MLflow).

A resumed run's metrics.jsonl is cut back to its checkpoint's round first. Extending a finished
run (`--resume` with more `--rounds`): its files stay as they were (whole) until the extension's
first checkpoint, where model.pt goes, then config.json, the rounds' rows and the checkpoint
come: a kill anywhere leaves a folder that `--resume` continues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.common.io import write_json
from pipeline.config import config_dict
from pipeline.data.time_steps import step_of
from pipeline.run import files as rf
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

    def before_checkpoint(self, progress: Progress) -> None:
        """An extension's first checkpoint comes: the run is unfinished from here on."""
        if self.held is None:
            return
        (self.out / rf.MODEL).unlink(missing_ok=True)
        remove_derived(self.out)  # eval.json and plots/ describe fewer rounds
        write_json(self.out / rf.CONFIG, self.values)
        self.write(self.held, progress)
        self.held = None

    def write(self, rows: list[dict[str, Any]], progress: Progress) -> None:
        """metrics.jsonl, assignments.parquet, DVCLive and the trackers."""
        for row in rows:
            rf.append_metrics(self.out / rf.METRICS, row)
            if self.live is not None:
                self.live(row)
            for tracker in self.trackers:
                tracker(row)
        per_step = self.config.rounds_per_step
        steps = [step_of(r, per_step, self.steps) for r in progress.eval_rounds]
        where = self.out / rf.ASSIGNMENTS
        rf.write_assignments(where, progress.eval_rounds, progress.history, self.clients, steps)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        for tracker in self.trackers:
            tracker.close()
