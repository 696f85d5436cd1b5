"""A run's checkpoints: when they are written, what they hold, and resuming from one.

A checkpoint (`run_files.RunState`) holds the models, the algorithm's state, the loop's
`Progress` and torch's generator; with `persistent_momentum`, a momentum snapshot beside it. It
is resumed only by a run of the same identity (the configuration's `TrainConfig.identity` and
the data's digest), and each of its fields is checked against the run before anything is used.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.algorithms import build_algorithm
from pipeline.algorithms.state import uncovered
from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.config import TrainConfig
from pipeline.run import files as rf
from pipeline.run.resolve import recorded_identity
from pipeline.run.setup import Progress, Run

CHECKPOINT_BUDGET = 512 * 2**20  # bytes a checkpoint may write per round when not told how often


def checkpoint_interval(config: TrainConfig, run: Run) -> int:
    """`checkpoint_every`, or when not set: every round while a checkpoint is small, else as
    often as keeps the average write under CHECKPOINT_BUDGET bytes per round."""
    if config.checkpoint_every is not None:
        return config.checkpoint_every
    logits = run.data.labels.numel() * run.models.shape[0] * run.data.num_classes
    size = 4 * (run.models.numel() + logits)
    if run.momentum.enabled:
        size += len(run.momentum.clients) * run.momentum.rows * run.momentum.size * 4
    return max(1, math.ceil(size / CHECKPOINT_BUDGET))


@dataclass
class Checkpoints:
    """Where a run's checkpoints go, under which identity, and how often."""

    out: Path
    identity: str  # the run's identity as JSON: what a resume must match
    every: int  # `checkpoint_interval`; 0: never, not even at the end
    warned: bool = False  # about state a checkpoint leaves out (`warn_uncovered_state`)

    def due(self, run: Run, round_: int) -> bool:
        return self.every > 0 and (round_ % self.every == 0 or round_ == run.config.rounds)

    def save(self, run: Run, progress: Progress, into: Path | None = None) -> None:
        """The momentum snapshot (every place takes part), then checkpoint.pt (the main
        place), or its bytes `into` a path the caller renames into place (`RunLog.checkpoint`)."""
        present = None
        if run.momentum.enabled:
            present = run.momentum.save(rf.momentum_snapshot(self.out, progress.round))
        state = rf.RunState(
            progress.round,
            run.models,
            run.algorithm.state_dict(),
            progress.eval_rounds,
            progress.history,
            progress.cached if run.comm.size == 1 else None,  # a place's cached rows are its own
            torch.get_rng_state(),
            present,
        )
        if run.comm.is_main:
            state.save(self.out, self.identity, into)
            self.warned = self.warned or warn_uncovered_state(run)

    def save_model(self, run: Run) -> None:
        """model.pt, the finished run: what eval and plot read (the main place)."""
        if run.comm.is_main:
            rf.save_model(
                self.out,
                self.identity,
                run.config.rounds,
                run.config.algorithm,
                run.models,
                run.algorithm.omega_table(),
                run.algorithm.state_dict(),
            )


def warn_uncovered_state(run: Run) -> bool:
    """One warning line when the algorithm keeps state that its `state_dict` leaves out (a
    resume would restart it from `init_state`: `pipeline.algorithms.state`). True once
    warned, so a run warns once."""
    algorithm, data = run.algorithm, run.data
    fresh = build_algorithm(run.config, len(data.clients), data.num_classes, algorithm.head)
    fresh.participants(list(data.participating))
    try:
        names = uncovered(algorithm, fresh)
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError) as e:
        problem = f"its state_dict does not load into a fresh one ({e}), so --resume would fail"
    else:
        if not names:
            return False
        listed = ", ".join(names)
        problem = (
            f"{listed} not in its state_dict, so --resume would restart it from init_state; "
            f"list it in state_attributes = ({', '.join(map(repr, names))},)"
        )
    warnings.warn(FedrcWarning(f"algorithm {run.config.algorithm}: {problem}"), stacklevel=2)
    return True


def expected_state(run: Run, out: Path) -> rf.Expected:
    """What this run's checkpoint must hold: shapes from the configured model, algorithm and
    data, the rounds from the configuration and metrics.jsonl."""
    models = tuple(run.models.shape)
    return rf.Expected(
        rounds=run.config.rounds,
        models=models,
        omega=tuple(run.algorithm.omega_table().shape),
        algorithm=run.algorithm.state_dict(),
        metrics=out / rf.METRICS,
        logged=rf.logged_rounds(out / rf.METRICS),
        # a checkpoint's cached logits are used, and checked, in one process only
        logits=(models[0], run.data.labels.numel(), run.data.num_classes)
        if run.comm.size == 1
        else None,
        dtype=run.models.dtype,
    )


def checked_state(out: Path, wanted: dict[str, Any], run: Run) -> rf.RunState:
    """The checkpoint to resume, refused (before anything is touched) when written with
    another configuration, when a field does not fit the run (`rf.RunState.check`), or when
    the momentum snapshot it names is gone or of another shape."""
    path = out / rf.CHECKPOINT
    loaded = rf.load_state(path)
    recorded = rf.state_identity(path, loaded)
    other = rf.identity_mismatch(recorded_identity(recorded, f"{path}: identity"), wanted)
    if other is not None:
        raise FedrcError(
            f"--resume: {path} was written with {other}; start a new run with another --out"
        )
    check_fewer_rounds(out, loaded.get("round"), run.config.rounds)
    state = rf.RunState.load(path, expected_state(run, out))
    if state.momentum_present is not None and run.momentum.enabled:
        check_momentum(out, state, run)
    return state


def check_fewer_rounds(out: Path, saved: Any, rounds: int) -> None:
    """A resume asked for fewer rounds than the run has done (its checkpoint's round, which
    metrics.jsonl has reached): the option is wrong, not the file."""
    done = isinstance(saved, int) and not isinstance(saved, bool)
    if done and rounds < saved <= rf.logged_rounds(out / rf.METRICS):
        raise FedrcError(
            f"--rounds {rounds}: the run in {out} already has {saved} rounds; --resume needs "
            f"--rounds {saved} or more (a shorter run: another --out, or --overwrite)"
        )


def check_momentum(out: Path, state: rf.RunState, run: Run) -> None:
    """The momentum snapshot a checkpoint names: there, and of this run's shape."""
    path, snapshot = out / rf.CHECKPOINT, rf.momentum_snapshot(out, state.round)
    if not snapshot.is_file():
        raise FedrcError(
            f"--resume: {snapshot} not found (the momentum of {path}); start again with --overwrite"
        )
    present = tuple(run.momentum.present.shape)
    rf.check_tensor(path, "momentum_present", state.momentum_present, present, "", False)
    try:
        shape = np.load(snapshot, mmap_mode="r").shape
    except (OSError, ValueError) as e:
        raise FedrcError(f"{snapshot}: not a momentum snapshot ({e})") from None
    if shape != (*present, run.momentum.size):
        raise FedrcError(
            f"{snapshot}: shape {shape}, expected {(*present, run.momentum.size)} "
            f"(the momentum of {path})"
        )


def resume_run(run: Run, out: Path, wanted: dict[str, Any]) -> Progress:
    """Load the checkpoint in `out` into `run`: the main place reads and checks it
    (`checked_state`) and sends it to the others. Returns where the loop stood."""
    comm = run.comm
    state = comm.broadcast_object(
        comm.agree(lambda: checked_state(out, wanted, run), everywhere=False)
    )
    run.models = state.models.to(comm.device)
    run.algorithm.load_state_dict(state.algorithm)
    snapshot = rf.momentum_snapshot(out, state.round)
    run.momentum.load(snapshot, state.momentum_present, state.legacy_momentum)
    if state.rng is not None:
        torch.set_rng_state(state.rng)
    cached = None
    if comm.size == 1 and state.cached_logits is not None:  # rows differ across places
        cached = state.cached_logits.to(comm.device)
    return Progress(state.round, state.eval_rounds, state.omega_history, cached)
