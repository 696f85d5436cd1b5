"""The GPU check, in priority order within a time budget: the tests marked cuda, the speed rows,
then the paper-scale FMNIST matrix of experiments/fmnist (300 clients, 200 rounds, profile:
reference, K = 3) under the fair protocol: FedRC (and FedRC-FT from its run), FedEM, FedAvg,
FeSEM, IFCA, CFL(3), FedSoft at every lr of the paper's grid and seeds 0, 1, 2, and the
baselines as their authors released them (`benchmarks/gpu_plan.py` has the order).
`benchmarks/gpu_check.sh` runs it; `--list` prints what is left, in order, with its time.

Each invocation stops by itself before `--slice-min` (a GPU machine runs one command for at most
10 minutes): a training that cannot reach its next checkpoint in time gets SIGTERM and keeps
its last one. `--continue` goes on from `--results` (state.json) on the same machine (the work
folder's checkpoints are resumed) or a fresh one (the data is partitioned again; an unfinished
run starts over, since its checkpoint holds every client's momentum, gigabytes). The results
folder keeps only the small files (`benchmarks/gpu_results.py`) and `fedrc report`'s table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import gpu_plan as gp
from benchmarks import gpu_results as gr
from benchmarks import gpu_trials as gt
from pipeline.common.errors import FedrcError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "experiments" / "fmnist" / "params.yaml"
ORDER = ("fedrc", "fedem", "fedavg", "fesem", "ifca", "cfl", "fedsoft")  # the order
FINETUNED = ("fedrc",)  # FedRC-FT is scored on a copy of FedRC's run


class Sizes:
    """The real check, or every step at toy size on the CPU (`--dry-run`)."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.clients, self.rounds = (6, 4) if dry else (300, 200)
        self.partition = (
            ["--clients", "6", "--samples-per-client", "40", "--holdout-samples", "30"]
            if dry else []
        )  # fmt: skip
        self.every = 2 if dry else 25  # checkpoints of a run that will not finish in time
        self.probe_rounds = 1 if dry else 5  # rounds timed before deciding how many at once
        self.startup_s = 5.0 if dry else 40.0  # a training's start: torch, the data, the model
        self.margin_s = 20.0 if dry else 45.0  # the invocation's last report, copies and pack
        self.report_every_s = 1e9 if dry else 60.0  # dry: one report per invocation
        self.poll_s = 0.2 if dry else 1.0

    def fixed_steps(self, py: str, data: Path) -> list[tuple[str, list[str], str, str]]:
        """(step, command, results file, title) before the matrix, as the script ran them;
        `data` is the partitioned benchmark, made before the profile."""
        speed = [py, "benchmarks/speed.py", "--device", self.device, "--algorithm", "fedrc"]
        if self.dry:
            fmnist = ["--clients", "2", "--samples", "16", "--rounds", "1", "--warmup", "0"]
            cifar = ["--clients", "2", "--samples", "8", "--rounds", "1", "--warmup", "0"]
            scale = ["--total", "64", "--sizes", "2", "4", "--rounds", "1"]
            precision = ["--batch-sizes", "8", "--batches", "1", "--samples", "16", "--repeats",
                         "1", "--round-clients", "2", "--round-samples", "8"]  # fmt: skip
            conv = ["--clients", "2", "--samples", "16", "--batch-size", "8", "--repeats", "1"]
            compiled = [*conv, "--drop-last"]
            together = ["--rounds", "1", "--seeds", "0", "1", "--together", "2"]
        else:
            fmnist = ["--clients", "300", "--samples", "180", "--rounds", "3", "--warmup", "1"]
            cifar = ["--clients", "300", "--samples", "150", "--rounds", "1", "--warmup", "1"]
            scale = ["--rounds", "2", "--warmup", "1"]
            precision = ["--round-rounds", "3", "--round-warmup", "1"]
            conv = []  # its defaults: 300 clients × K = 3, 180 samples, batch 128
            compiled = ["--drop-last"]  # profile: reference, one step a task
            together = ["--rounds", "3", "--seeds", "0", "1", "--lrs", "0.03", "0.1",
                        "--together", "4"]  # fmt: skip
        pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"]
        profile = [py, "benchmarks/gpu_profile.py", "--device", self.device, "--data", str(data)]
        if self.dry:
            profile += ["--warmup", "1", "--rounds", "1", "--top", "5"]
        return [
            ("cuda-tests", [*pytest, "tests/test_cuda.py"], "cuda-tests.txt", "tests marked cuda"),
            ("profile", profile, "profile.md", "FedRC at paper scale under torch.profiler "
             "(gpu_profile.py)"),
            ("conv-paths", [py, "benchmarks/conv_paths.py", "--device", self.device, *conv],
             "speed.md", "FMNIST CNN, the batched executor's convolution paths (conv_paths.py)"),
            ("compiled-step", [py, "benchmarks/compiled_step.py", "--device", self.device,
             *compiled], "speed.md", "FMNIST CNN, the batched step under torch.compile against "
             "eager (compiled_step.py)"),
            ("together", [py, "benchmarks/together.py", "--device", self.device, "--data",
             str(data), *together], "speed.md", "a grid one by one and together "
             "(together.py)"),
            ("speed-fmnist", [*speed, "--dataset", "fmnist", "--model", "cnn", "--models", "3",
             *fmnist], "speed.md", "FMNIST CNN, FedRC, K = 3 (speed.py)"),
            ("speed-cifar10", [*speed, "--dataset", "cifar10", "--model", "mobilenet_v2",
             "--models", "3", *cifar], "speed.md", "CIFAR-10 MobileNetV2, FedRC, K = 3 (speed.py)"),
            ("scale", [py, "benchmarks/scale.py", "--device", self.device, *scale], "speed.md",
             "30 / 300 / 3,000 clients on the same data (scale.py)"),
            ("precision", [py, "benchmarks/precision.py", "--device", self.device, *precision],
             "speed.md", "bf16 against fp32 (precision.py)"),
        ]  # fmt: skip


class Check:
    """One invocation: its deadline, the state it continues, the children's environment."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.sizes = args, Sizes(args.dry_run)
        self.py = os.environ.get("PYTHON", sys.executable)
        self.results, self.work = Path(args.results).resolve(), Path(args.work).resolve()
        self.data = self.work / "data" / "federated"
        self.plan = gp.plan_of({
            "dry_run": args.dry_run, "device": self.sizes.device, "clients": self.sizes.clients,
            "rounds": self.sizes.rounds, "seeds": args.seeds, "algorithms": self.algorithms(),
        }, args.lrs, not args.no_released)  # fmt: skip
        self.notes: list[str] = []
        self.state = self.open_state()
        self.began, self.began_wall = time.monotonic(), time.time()
        self.spent_before = self.state.spent_s
        slice_s = min(args.slice_min * 60, self.state.left_s())
        self.deadline = self.began + slice_s - self.sizes.margin_s
        threads = "1" if args.dry_run else str(max(1, (os.cpu_count() or 2) // args.max_parallel))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.env.setdefault("OMP_NUM_THREADS", threads)
        self.kept = self.unreported = 0  # trials kept in this invocation, and since the report

    def open_state(self) -> gr.State:
        args = self.args
        budget = args.budget_min * 60 if args.budget_min is not None else None
        if args.list and not (self.results / gr.STATE).exists():
            return gr.State(plan=self.plan, budget_s=budget or 45 * 60)
        if args.continue_ or args.list:
            state = gr.read_state(self.results)
            if state.plan != self.plan:
                if not gp.upgrade(state.plan, self.plan, self.results / "runs"):
                    raise FedrcError(
                        f"--continue: {self.results / gr.STATE} holds another plan "
                        f"({state.plan}); give the same --seeds, --algorithms, --lrs, "
                        "--no-released and --dry-run, or another --results"
                    )
                state.plan = self.plan  # the first plan's runs are its lr-0.1 trials
                self.notes.append(f"plan upgraded to version {gp.VERSION} (the lr grid)")
            state.budget_s = budget if budget is not None else state.budget_s
            return state
        if (self.results / gr.STATE).exists():
            raise FedrcError(
                f"--results: {self.results} already holds a GPU check (state.json); add "
                "--continue, or choose another folder"
            )
        for name in ("runs", "data", "logs"):  # a fresh start: this folder's own sub-folders
            shutil.rmtree(self.work / name, ignore_errors=True)
        return gr.State(plan=self.plan, budget_s=budget if budget is not None else 45 * 60)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.state.spent_s = self.spent_before + time.monotonic() - self.began
        gr.write_state(self.results, self.state)

    def fedrc(self, *args: str) -> list[str]:
        return [self.py, "-m", "fedrc_cli", *args]

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.notes.append(text)

    # ---- the steps before the matrix ---------------------------------------------------------

    def fixed_steps(self) -> bool:
        """The tests and the speed rows; False when the time ran out before they were done."""
        for step, argv, file, title in self.sizes.fixed_steps(self.py, self.data):
            if self.state.settled(step):
                continue
            if self.left() < 10 or (step == "profile" and not self.partition()):
                return False
            log = self.work / "logs" / f"{step}.log"
            log.unlink(missing_ok=True)
            code = gt.run_command(argv, ROOT, log, self.env, self.left())
            text = log.read_text(errors="replace")
            print(f"## {title}\n{text}", flush=True)
            if code == 143:
                self.give_up_after_two(step, "stopped at the deadline")
                return False
            gr.add_text(self.results, file, f"## {title}\n\n```\n{text.rstrip()}\n```\n\n")
            if code == 0:
                self.state.done.append(step)
            else:
                self.state.failed[step] = f"exit code {code}: {text.strip().splitlines()[-1:]}"
            self.save()
        return True

    def give_up_after_two(self, step: str, why: str) -> None:
        self.state.tries[step] = self.state.tries.get(step, 0) + 1
        if self.state.tries[step] >= 2:
            self.state.failed[step] = f"{why}, twice"
        self.save()

    def partition(self) -> bool:
        data = self.data
        if not (data / "manifest.json").is_file():
            if self.left() < 60 and not self.sizes.dry:
                return False
            argv = self.fedrc("partition", "--params", str(PARAMS), "--out", "data/federated",
                              "--overwrite", *self.sizes.partition)  # fmt: skip
            if self.args.data_root:
                argv += ["--data-root", str(Path(self.args.data_root).resolve())]
            log = self.work / "logs" / "partition.log"
            if gt.run_command(argv, self.work, log, self.env, self.left()) != 0:
                raise FedrcError(f"fedrc partition failed: {log.read_text().strip()[-300:]}")
        kept = self.results / "data" / "federated" / "manifest.json"
        if kept.is_file() and not gr.same_benchmark(kept, data / "manifest.json"):
            raise FedrcError(
                f"{data}: not the benchmark of {kept} (another Fashion-MNIST copy or fedrc?)"
            )
        gr.keep_manifest(data, self.results)
        return True

    # ---- the matrix -------------------------------------------------------------------------

    def algorithms(self) -> list[str]:
        return [a for a in ORDER if a in self.args.algorithms]  # in the order

    def trials(self) -> list[gt.Trial]:
        args = self.args
        released = not args.no_released
        return gp.grid(self.algorithms(), args.seeds, args.lrs, released, set(FINETUNED))

    def settled(self, trial: gt.Trial) -> bool:
        """Done or given up, under its name or its first-plan name."""
        return self.state.settled(trial.name) or (
            trial.legacy is not None and self.state.settled(trial.legacy)
        )

    def pending(self, running: list[gt.Job] = ()) -> list[gt.Trial]:
        """The trials left, best first (`gpu_plan`'s order, from what is in now)."""
        busy = {j.trial.name for j in running}
        trials = self.trials()
        settled = {*self.state.done, *self.state.failed}
        chosen = gp.picks(trials, settled, self.results / "runs", self.args.seeds[0])
        slow = {a for a in self.algorithms() if self.too_long(a)}
        left = [t for t in trials if not self.settled(t) and t.name not in busy]
        return sorted(left, key=lambda t: gp.priority(
            t, chosen, self.args.seeds[0], self.args.lrs, self.algorithms(), slow
        ))  # fmt: skip

    def too_long(self, algorithm: str) -> bool:
        """A run of it cannot finish within one command (FedSoft at paper scale)."""
        spr = self.estimate(algorithm)
        return spr is not None and self.sizes.rounds * spr > self.args.slice_min * 60

    def job(self, trial: gt.Trial) -> gt.Job:
        def train_argv(resume: bool, every: int) -> list[str]:
            # a run that fits writes no checkpoint at all, not even at its end: under profile
            # reference that is every client's momentum (7.8 GB, 13 s on the H100), thrown away
            never = every >= self.sizes.rounds and not self.sizes.dry
            every_arg = str(0 if never else every)
            argv = self.fedrc("train", "--out", f"runs/{trial.name}", "--device",
                              self.sizes.device, "--checkpoint-every", every_arg)  # fmt: skip
            if resume:
                return [*argv, "--resume"]
            return [*argv, "--params", str(PARAMS), "--algorithm", trial.algorithm, "--seed",
                    str(trial.seed), "--data", "data/federated", "--rounds",
                    str(self.sizes.rounds), "--lr", str(trial.lr), "--overwrite",
                    *(["--profile", "released"] if trial.released else [])]  # fmt: skip

        def eval_argv(run: str, finetune: bool) -> list[str]:
            return self.fedrc("eval", "--params", str(PARAMS), "--run", run,
                              *(["--finetune"] if finetune else []))  # fmt: skip

        return gt.Job(trial, self.work, self.env, self.sizes.rounds, self.sizes.every,
                      train_argv, eval_argv)  # fmt: skip

    def paces(self) -> dict[str, float]:
        """Seconds per round per algorithm: measured by the check, else by the kept runs
        themselves (read again only when a run was kept)."""
        key = (len(self.state.done), tuple(sorted(self.state.seconds_per_round.items())))
        if getattr(self, "_paces", (None,))[0] != key:
            runs = self.results / "runs"
            self._paces = (key, gp.seconds_per_round(self.state.seconds_per_round, runs))
        return self._paces[1]

    def estimate(self, algorithm: str) -> float | None:
        measured = self.paces()
        return measured.get(algorithm) or (max(measured.values()) if measured else None)

    def matrix(self) -> None:
        if not self.pending() or not self.partition():
            return
        arrangement = self.state.arrangement
        probe = None if arrangement else Probe(self)
        limit = arrangement["trials"] if arrangement else 1
        running: list[gt.Job] = []
        last_report = time.monotonic()
        while (queue := self.pending(running)) or running:
            now = time.monotonic()
            stopping = now >= self.deadline or self.stop_asked(running)
            training = sum(j.phase == "train" for j in running)
            for job in list(running):
                job.watch(now, training)
                outcome = self.advance(job, stopping)
                if outcome is None:
                    continue
                running.remove(job)
                queue = self.pending(running)  # a stopped trial is pending again; picks move
            if probe is not None and (decided := probe.update(running)) is not None:
                limit, probe = decided, None
            if stopping:
                if not running:
                    break
            elif now - last_report >= self.sizes.report_every_s and self.report():
                last_report = now
            while not stopping and queue and len(running) < (probe.limit if probe else limit):
                if not self.can_start(queue[0]):
                    stopping = True
                    break
                job = self.job(queue.pop(0))
                running.append(job)
                self.start(job, job.next_phase())
            if stopping and not running:
                break
            time.sleep(self.sizes.poll_s)
        if left := self.pending():
            shown = ", ".join(t.name for t in left[:12]) + (f" and {len(left) - 12} more"
                                                            if len(left) > 12 else "")  # fmt: skip
            self.note(f"not reached in this invocation: {shown}")

    def stop_asked(self, running: list[gt.Job]) -> bool:
        """`--stop-after N`: N trials kept and every running training past a checkpoint of
        this invocation, so that the next one resumes it (the dry run's deadline)."""
        if self.args.stop_after is None or self.kept < self.args.stop_after:
            return False
        return all(j.phase != "train" or j.round >= j.start_round + j.every for j in running)

    def can_start(self, trial: gt.Trial) -> bool:
        spr, left = self.estimate(trial.algorithm), self.left()
        if spr is None:
            return left > self.sizes.startup_s * 2
        every = min(self.sizes.every, self.sizes.rounds)
        return left > self.sizes.startup_s + every * spr + (self.state.checkpoint_s or 0)

    def start(self, job: gt.Job, phase: str | None) -> None:
        if phase is None:  # trained and scored in an earlier invocation on this machine
            return
        if phase == "train":
            saved = (job.run / "checkpoint.pt").is_file() and gt.checkpoint_round(job.run)
            # the dry run always checkpoints, so that its stops resume from a checkpoint
            job.every = self.sizes.every if self.sizes.dry else gt.checkpoint_every(
                saved or 0, job.rounds, self.estimate(job.trial.algorithm),
                self.left() - self.sizes.startup_s, self.sizes.every,
            )  # fmt: skip
        job.start(phase, self.work / "logs" / f"{job.trial.name}.log")
        print(f"{job.trial.name}: {phase}" + (f" from round {job.start_round}"
              if phase == "train" else ""), flush=True)  # fmt: skip

    def advance(self, job: gt.Job, stopping: bool) -> str | None:
        """Move a job on; None while it runs, else "kept", "again" (stopped: queue it again)
        or "failed"."""
        if job.command is None:  # nothing was left to run
            return self.keep(job)
        code = job.command.poll()
        if code is None:
            spr = job.seconds_per_round() or self.estimate(job.trial.algorithm)
            late = job.phase == "train" and gt.must_stop(
                time.monotonic(), self.deadline, job.round, job.rounds, job.every, spr,
                self.state.checkpoint_s or 0,
            )  # fmt: skip
            if not (stopping or late):
                return None
            code = job.command.stop(grace_s=120)
            self.note(f"{job.trial.name}: stopped ({job.phase}, round {job.round}/{job.rounds})")
            self.measure(job)
            return "again"
        if code in gt.INTERRUPTED:
            self.note(f"{job.trial.name}: {job.phase} was stopped from outside ({code})")
            return "again"
        if code != 0:
            self.note(f"{job.trial.name}: {job.phase} failed: {job.command.tail()}")
            shutil.rmtree(job.run, ignore_errors=True)
            shutil.rmtree(job.ft_run, ignore_errors=True)
            self.give_up_after_two(job.trial.name, f"{job.phase} failed ({job.command.tail()})")
            return "failed" if self.state.settled(job.trial.name) else "again"
        if job.phase == "train":
            self.measure(job)
            gt.drop_checkpoints(job.run)
        phase = job.next_phase()
        if phase is not None:
            self.start(job, phase)
            return None
        return self.keep(job)

    def measure(self, job: gt.Job) -> None:
        if (spr := job.seconds_per_round()) is not None:
            self.state.seconds_per_round[job.trial.algorithm] = spr
        if (ckpt := job.checkpoint_s()) is not None:
            self.state.checkpoint_s = max(ckpt, self.state.checkpoint_s or 0)
        self.save()

    def keep(self, job: gt.Job) -> str:
        gr.keep_run(job.run, self.results)
        if job.trial.finetune:
            gr.keep_run(job.ft_run, self.results)
        self.state.done.append(job.trial.name)
        self.kept += 1
        self.unreported += 1
        self.save()
        self.note(f"{job.trial.name}: kept in {self.results / 'runs'}")
        return "kept"

    def report(self) -> bool:
        """`fedrc report runs` in the results folder, when new runs were kept."""
        if not self.unreported or self.left() + self.sizes.margin_s < 15:
            return False
        self.unreported = 0
        log = self.work / "logs" / "report.log"
        log.unlink(missing_ok=True)
        argv = self.fedrc("report", "runs", "--out", "report")
        code = gt.run_command(argv, self.results, log, self.env, self.left() + self.sizes.margin_s)
        self.note(f"fedrc report: {'report/report.md' if code == 0 else log.read_text()[-300:]}")
        return True

    def listing(self) -> list[str]:
        """The trials left in the order they will run, each with its estimated minutes (the
        measured seconds per round × rounds, plus `gpu_plan.OVERHEAD_S`) and the running sum."""
        spr, settled = self.paces(), {*self.state.done, *self.state.failed}
        chosen = gp.picks(self.trials(), settled, self.results / "runs", self.args.seeds[0])
        picked = ", ".join(
            f"{a}{' as released' * r} {lr:g}" for (a, r), lr in sorted(chosen.items())
        )
        lines = [f"lr picked on seed {self.args.seeds[0]}: {picked or 'none yet'}", "",
                 "| # | trial | minutes | minutes in all |", "|---:|---|---:|---:|"]  # fmt: skip
        total = 0.0
        for i, trial in enumerate(self.pending(), 1):
            seconds = gp.estimate_s(trial, self.sizes.rounds, spr)
            total += seconds or 0.0
            shown = "?" if seconds is None else f"{seconds / 60:.1f}"
            lines.append(f"| {i} | {trial.name} | {shown} | {total / 60:.1f} |")
        return lines


class Probe:
    """Decides how many trials run at once: the first trial alone for a few rounds (its speed,
    the GPU's utilisation and memory), then n together while the same trial is timed again;
    the faster arrangement is kept in the state for later invocations."""

    def __init__(self, check: Check) -> None:
        self.check, self.sampler = check, gt.GpuSampler()
        self.limit, self.first, self.solo_s = 1, None, None
        self.since = time.monotonic()

    def update(self, running: list[gt.Job]) -> int | None:
        if self.first is None and running:
            self.first = running[0]
        first, rounds = self.first, self.check.sizes.probe_rounds
        if first is None:
            return None
        if first not in running:  # it finished or stopped before the probe ended
            if self.solo_s:
                return self.decide(1, "the first trial left before it was timed among others")
            self.first = None  # time the next one alone
            return None
        if self.solo_s is None:
            if first.rounds_timed(1) < rounds:
                return None
            self.solo_s = first.seconds_per_round(1)
            gpu = self.sampler.between(self.since, time.monotonic())
            disk = shutil.disk_usage(self.check.work).free
            self.n = gt.how_many(
                gpu, 2 * gt.folder_bytes(first.run), disk, self.check.args.max_parallel
            )
            self.gpu = gpu or {}
            if self.n == 1:
                busy = self.gpu.get("util", 0) >= 80
                why = "busy" if busy else "two do not fit in its memory or the work disk"
                return self.decide(1, f"one trial at a time: {why}")
            self.limit = self.n
            return None
        if first.rounds_timed(self.n) < rounds:
            return None
        together_s = first.seconds_per_round(self.n)
        keep = gt.keep_together(self.solo_s, together_s, self.n)  # type: ignore[arg-type]
        self.together_s = together_s
        return self.decide(self.n if keep else 1, f"{self.n} at once: {together_s:.2f} s/round")

    def decide(self, trials: int, why: str) -> int:
        self.sampler.close()
        result = {"trials": trials, "why": why, "solo_s_per_round": self.solo_s}
        result |= {f"solo_gpu_{k}": v for k, v in getattr(self, "gpu", {}).items()}
        if hasattr(self, "together_s"):
            result["together_s_per_round"] = self.together_s
        self.check.state.arrangement = result
        self.check.save()
        self.check.note(f"trials at once: {gt.describe(result)}")
        return trials


def device_name(dry: bool) -> str:
    if dry:
        return "CPU (dry run)"
    import torch

    if not torch.cuda.is_available():
        raise FedrcError("torch sees no GPU: run on a GPU machine, or add --dry-run")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return out.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "a CUDA GPU"


def run(args: argparse.Namespace) -> int:
    check = Check(args)
    machine = device_name(args.dry_run)
    print(
        f"GPU check on {machine}: {check.left() / 60:.1f} min in this invocation, "
        f"{check.state.left_s() / 60:.1f} of {check.state.budget_s / 60:.0f} min left",
        flush=True,
    )
    check.save()
    if check.left() > 0 and check.fixed_steps():
        check.matrix()
    check.report()
    check.save()
    fixed = [s for s, *_ in check.sizes.fixed_steps(check.py, check.data)]
    steps = fixed + [t.name for t in check.trials()]
    left = [s for s in fixed if not check.state.settled(s)] + [t.name for t in check.pending()]
    seconds = time.monotonic() - check.began
    when = datetime.datetime.fromtimestamp(check.began_wall).isoformat(timespec="seconds")
    gr.add_text(check.results, "sessions.md",
                f"- {when}, {machine}, {seconds:.0f} s: " + "; ".join(check.notes or ["nothing"])
                + "\n")  # fmt: skip
    check.save()
    if args.pack:
        count = gr.pack(check.results, check.began_wall - 1, Path(args.pack))
        print(f"packed {count} files into {args.pack}")
    done = len(steps) - len(left)
    print(check.listing()[0])  # the lrs picked so far
    print(
        f"done: {done} of {len(steps)} steps; failed: {sorted(check.state.failed) or 'none'}; "
        f"spent {check.state.spent_s / 60:.1f} of {check.state.budget_s / 60:.0f} min"
    )
    if left:
        print(f"left: {len(left)} steps; go on with --continue --results {args.results}")
    return 1 if args.require_done and left else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step at toy size on the CPU")
    parser.add_argument("--continue", dest="continue_", action="store_true",
                        help="go on from --results' state.json")  # fmt: skip
    parser.add_argument("--budget-min", type=float, help="device minutes for the whole check, "
                        "over every invocation (default 45, or the state's)")  # fmt: skip
    parser.add_argument(
        "--slice-min",
        type=float,
        default=9.0,
        help="the most one invocation runs (the machine's 10-minute limit)",
    )
    parser.add_argument("--results", default="experiments/fmnist/results/gpu-300clients-200rounds")
    parser.add_argument("--work", default=".gpu-work", help="data, full runs, checkpoints, logs")
    parser.add_argument("--data-root", help="folder with Fashion-MNIST's four IDX files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=list(ORDER), choices=ORDER,
                        help="a part of the matrix (run in the order fedrc, fedem, fedavg, "
                        "fesem, ifca, cfl, fedsoft)")  # fmt: skip
    parser.add_argument("--lrs", type=float, nargs="+", default=list(gp.LRS),
                        help="the lr grid, in the order the first seed runs it")  # fmt: skip
    parser.add_argument("--no-released", action="store_true",
                        help="leave out the baselines as their authors released them")  # fmt: skip
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the trials left, in order, with their time; run nothing",
    )
    parser.add_argument("--max-parallel", type=int, default=4, help="most trials at once")
    parser.add_argument("--pack", help="write the results files of this invocation to a .tar.gz")
    parser.add_argument(
        "--stop-after",
        type=int,
        help="stop as at the deadline once N trials are kept (the dry run)",
    )
    parser.add_argument(
        "--require-done", action="store_true", help="exit 1 unless every step is done or given up"
    )
    args = parser.parse_args(argv)
    if (args.budget_min is not None and args.budget_min <= 0) or args.slice_min <= 0:
        print("Error: --budget-min and --slice-min must be > 0", file=sys.stderr)
        return 2
    try:
        if args.list:
            print("\n".join(Check(args).listing()))
            return 0
        return run(args)
    except FedrcError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
