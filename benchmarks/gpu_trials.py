"""The trials of `benchmarks/gpu_check.py`: child processes, their progress, when to stop one
so that its last checkpoint is kept, and how many to run at once on one GPU.

A trial is one `fedrc train` (started, or resumed from its checkpoint), its `fedrc eval` and,
for FedRC, the fine-tuned evaluation of a copy (FedRC-FT). Each command runs in its own process
group with its output in a log file; the training's log says when a round (and its checkpoint,
when one was due) is done: `fedrc train` prints `round N/R` after the checkpoint is written.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pipeline.run.files import checkpoint_round

ROUND_LINE = re.compile(r"^round (\d+)/(\d+) ")
INTERRUPTED = (143, -signal.SIGTERM, -signal.SIGKILL)  # stopped by us: not a failure
RUN_FILES = ("config.json", "metrics.jsonl", "assignments.parquet", "model.pt")


class Command:
    """A child process in its own session (so that a stop reaches its children too)."""

    def __init__(self, argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._out: IO[bytes] = log.open("ab")
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None:
            self._out.close()
        return code

    def stop(self, grace_s: float) -> int:
        """SIGTERM (fedrc keeps its last checkpoint), then SIGKILL after `grace_s`."""
        if self.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.poll()  # type: ignore[return-value]

    def tail(self, lines: int = 1) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " / ".join(text[-lines:]) if text else "(no output)"


def run_command(
    argv: list[str], cwd: Path, log: Path, env: dict[str, str], timeout_s: float
) -> int:
    """Run to the end, or stop it after `timeout_s` (returns 143 then)."""
    command = Command(argv, cwd, log, env)
    try:
        return command.process.wait(max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        command.stop(10)
        return 143
    finally:
        command.poll()


def must_stop(
    now: float, deadline: float, round_: int, rounds: int, every: int,
    seconds_per_round: float | None, checkpoint_s: float,
) -> bool:  # fmt: skip
    """Whether a training should get SIGTERM now: the deadline has come, or its next save (the
    next checkpoint, or the end of the run) cannot be written before it, so that going on would
    only produce work that is thrown away."""
    if now >= deadline:
        return True
    if seconds_per_round is None:
        return False
    next_save = min(rounds, (round_ // every + 1) * every)
    return now + (next_save - round_) * seconds_per_round + checkpoint_s > deadline


def checkpoint_every(start: int, rounds: int, seconds_per_round: float | None, left_s: float,
                     default: int) -> int:  # fmt: skip
    """No checkpoint before the end when the rest of the run surely fits in `left_s` (a
    checkpoint of every client's momentum is gigabytes), else every `default` rounds."""
    if seconds_per_round is not None and (rounds - start) * seconds_per_round * 1.25 < left_s:
        return rounds
    return default


@dataclass
class Round:
    """The `count` rounds up to `number` whose lines one read of the log found: a round faster
    than the reads shares its gap with the rounds read with it."""

    number: int
    gap_s: float  # since the previous read's last line (the first after a start is not kept)
    running: tuple[int, int]  # fewest and most trainings running meanwhile
    checkpointed: bool  # a checkpoint was written in one of them
    count: int = 1


LEGACY_LR = 0.1  # the first plan's runs, named without their lr, all trained at it


@dataclass
class Trial:
    """One cell of the matrix: an algorithm, as its paper says or as its authors released it
    (`released`: `--profile released`), at a learning rate and a seed; `finetune`: also
    FedRC-FT from this run."""

    algorithm: str
    seed: int
    finetune: bool = False
    lr: float = LEGACY_LR
    released: bool = False

    @property
    def name(self) -> str:
        variant = "-released" if self.released else ""
        return f"{self.algorithm}{variant}-lr{self.lr:g}-s{self.seed}"

    @property
    def legacy(self) -> str | None:
        """Its name in the first plan (no lr grid), where it had one."""
        if self.released or self.lr != LEGACY_LR:
            return None
        return f"{self.algorithm}-s{self.seed}"

    def kept_name(self, settled: set[str]) -> str:
        """The name its run was kept under: the legacy one for a first-plan run."""
        return self.legacy if self.name not in settled and self.legacy in settled else self.name

    @property
    def ft_name(self) -> str:
        return f"{self.algorithm}-ft-lr{self.lr:g}-s{self.seed}"


@dataclass
class Job:
    """A trial's commands, one after the other, in the work folder; `train_argv(resume,
    every)` builds the training's command line, `eval_argv(run, finetune)` an evaluation's."""

    trial: Trial
    work: Path
    env: dict[str, str]
    rounds: int
    every: int
    train_argv: Callable[[bool, int], list[str]]
    eval_argv: Callable[[str, bool], list[str]]
    command: Command | None = None
    phase: str = ""
    start_round: int = 0
    round: int = 0
    rounds_seen: list[Round] = field(default_factory=list)
    _last_line_at: float = 0.0
    _running: tuple[int, int] = (10**9, 0)
    _read: int = 0
    _watched_at: float = 0.0

    @property
    def run(self) -> Path:
        return self.work / "runs" / self.trial.name

    @property
    def ft_run(self) -> Path:
        return self.work / "runs" / self.trial.ft_name

    def next_phase(self) -> str | None:
        """What is left to do, from the files in the work folder."""
        if not (self.run / "model.pt").is_file():
            return "train"
        if not (self.run / "eval.json").is_file():
            return "eval"
        if self.trial.finetune and not (self.ft_run / "eval.json").is_file():
            return "finetune"
        return None

    def start(self, phase: str, log: Path) -> None:
        # the log grows over the starts of this trial: read only what this start writes, so
        # that a resumed training's first round is not timed from an earlier start's last line
        self.phase, self._read = phase, log.stat().st_size if log.is_file() else 0
        if phase == "train":
            resume = (self.run / "checkpoint.pt").is_file()
            self.start_round = self.round = (checkpoint_round(self.run) or 0) if resume else 0
            self._last_line_at = 0.0
            argv = self.train_argv(resume, self.every)
        elif phase == "eval":
            argv = self.eval_argv(str(self.run.relative_to(self.work)), False)
        else:  # a copy of the finished run, scored with one fine-tuning epoch per client
            shutil.rmtree(self.ft_run, ignore_errors=True)
            self.ft_run.mkdir(parents=True)
            for name in RUN_FILES:
                shutil.copyfile(self.run / name, self.ft_run / name)
            argv = self.eval_argv(str(self.ft_run.relative_to(self.work)), True)
        self.command = Command(argv, self.work, log, self.env)

    def watch(self, now: float, training: int) -> None:
        """Read the training's new `round N/R` lines; `training`: trainings running now."""
        lo, hi = self._running
        self._running = (min(lo, training), max(hi, training))
        busy = self._watched_at and now - self._watched_at > 5  # we were busy: gaps too long
        self._watched_at = now
        if self.phase != "train" or self.command is None:
            return
        with self.command.log.open("rb") as f:
            f.seek(self._read)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._read += len(complete)
        lines = [
            m for m in map(ROUND_LINE.match, complete.decode(errors="replace").splitlines()) if m
        ]
        if not lines:
            return
        numbers = [int(m.group(1)) for m in lines]
        if self._last_line_at and not busy:
            done = any(n % self.every == 0 or n == self.rounds for n in numbers)
            gap = now - self._last_line_at
            self.rounds_seen.append(Round(numbers[-1], gap, self._running, done, len(numbers)))
        self.round, self._last_line_at = numbers[-1], now
        self._running = (training, training)

    def timed_rounds(self, running: int | None = None) -> list[Round]:
        """The reads without a checkpoint; `running`: only those during which exactly that
        many trainings ran."""
        return [
            r for r in self.rounds_seen
            if not r.checkpointed and (running is None or r.running == (running, running))
        ]  # fmt: skip

    def rounds_timed(self, running: int | None = None) -> int:
        """How many rounds `timed_rounds` covers."""
        return sum(r.count for r in self.timed_rounds(running))

    def seconds_per_round(self, running: int | None = None) -> float | None:
        """Seconds per round over the reads without a checkpoint: their gaps over their rounds,
        exact however the rounds fall between the reads (a median of single gaps read a
        0.34 s round as the 1 s between reads)."""
        timed = self.timed_rounds(running)
        rounds = sum(r.count for r in timed)
        return sum(r.gap_s for r in timed) / rounds if rounds else None

    def checkpoint_s(self) -> float | None:
        """The longest checkpoint write seen: a checkpointed read's extra seconds."""
        usual = self.seconds_per_round()
        extra = [r.gap_s - r.count * usual for r in self.rounds_seen if r.checkpointed and usual]
        return max(extra) if extra else None


def drop_checkpoints(run: Path) -> None:
    """A finished run's checkpoint and momentum snapshot: gigabytes, no longer needed."""
    for path in [run / "checkpoint.pt", *run.glob("checkpoint-momentum-r*.npy")]:
        path.unlink(missing_ok=True)


class GpuSampler:
    """nvidia-smi's utilisation and memory of GPU 0, sampled in a thread; nothing without it."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.samples: list[tuple[float, float, float, float]] = []  # time, util %, used, total
        self._stop = threading.Event()
        self._tool = shutil.which("nvidia-smi")
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True)
        if self._tool:
            self._thread.start()

    def _loop(self, interval_s: float) -> None:
        query = "--query-gpu=utilization.gpu,memory.used,memory.total"
        while not self._stop.wait(interval_s):
            try:
                out = subprocess.run(
                    [self._tool, query, "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True, text=True, timeout=10,
                ).stdout  # fmt: skip
                util, used, total = (float(x) for x in out.strip().split(","))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue
            self.samples.append((time.monotonic(), util, used, total))

    def between(self, start: float, end: float) -> dict[str, float] | None:
        """Mean utilisation and peak memory (MiB) sampled in [start, end]."""
        rows = [s for s in self.samples if start <= s[0] <= end]
        if not rows:
            return None
        return {
            "util": statistics.mean(r[1] for r in rows),
            "used_mib": max(r[2] for r in rows),
            "total_mib": rows[0][3],
        }

    def close(self) -> None:
        self._stop.set()


def how_many(gpu: dict[str, float] | None, run_bytes: int, disk_free: int, cap: int) -> int:
    """How many trials to try at once: enough to fill the GPU's idle share, as many as its
    memory and the work folder's disk hold (a trial's folder grows to `run_bytes`), at most
    `cap`. Without a GPU reading, two."""
    n = cap
    if gpu is not None:
        if gpu["util"] >= 80:
            return 1
        n = min(n, int(90 // max(gpu["util"], 1)))
        n = min(n, int(gpu["total_mib"] * 0.9 // max(gpu["used_mib"], 1)))
    else:
        n = min(n, 2)
    if run_bytes:
        n = min(n, 1 + int(disk_free * 0.8 // run_bytes))
    return max(n, 1)


def keep_together(solo_s: float, together_s: float, n: int) -> bool:
    """Whether n trials at once finish more rounds per second than one alone (by ≥ 10 %),
    from the seconds per round of the same trial alone and among n."""
    return n / together_s > 1.1 / solo_s


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def describe(result: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
    )
