"""Each built-in method's training round beside the floor of its own work (issue 45).

Real Fashion-MNIST partitioned (not timed) into `--clients` clients of `--samples` samples
(a tenth of them the local test split); per method, one untimed first round (first contacts,
first assignments, warm-ups), then `--rounds` rounds of `train_round` (the round loop's
Algorithm 1, without evaluation), each followed in the same process by its floor, timed alone:

- the local trainings the round ran: the same tasks (weights, proximal pull, logit offsets,
  stages), data, batch orders, on the same executor, from one model (their cost does not
  depend on the values);
- the inference its E-step needs by its paper (`paper_rows`): every model's logits on a
  client's samples for IFCA, FedEM, FedRC and FedSoft; the cluster's and the global model's for
  FeSEM-CAM; the held rows for a StoCFL client whose cluster has none; nothing for a method
  that assigns without a loss (FedAvg, FedProx, FeSEM, CFL, CFL-GP, PACFL, FLUX, FedDrift
  after its first round, FedCCFA);
- the statistics its clients describe that round (FLUX's latents, PACFL's subspaces).

Everything else in the round (E-step arithmetic, folding, aggregation, the round loop) is what
the floor leaves out: the ratio round / floor says what fedrc adds; `server rule` is the part
of the round spent in the method's own `fold` and `aggregate` (its distances, sums, K-means:
arithmetic the method cannot skip, yet not in the floor), and round / (floor + server rule)
what is left beyond both. CPU seconds of this
process (`time.process_time`: steadier than wall time on a shared CPU); run it with one thread.
`inferred` is the models' inference the round computed, in thousands of model × sample;
`--evaluation` also times one evaluation after the last round (`evaluated`: its inference).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/method_floor.py --clients 30
    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/method_floor.py --clients 300 --rounds 1
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.algorithms import BUILT_IN
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.places.communicate import Communicator
from pipeline.run import training
from pipeline.run.resolve import make_config
from pipeline.run.setup import Run
from pipeline.stages import partition_stage

SETTINGS = {  # so that the timed rounds are each method's own (clustered, placed) rounds
    "ifca-cam": {"warmup_rounds": 1},
    "fesem-cam": {"warmup_rounds": 1},
    "pfedme": {"personal_lr": 0.02, "local_lr": 0.05},  # its default 0.09 diverges on this CNN
    "floco": {"tau": 1},  # projected in the untimed first round
    "feddaa": {"cluster_round": 2},  # one time step: clustered in the first timed round
}


def paper_rows(
    algorithm: str, run: Run, steps: dict[int, Any], clusters: torch.Tensor | None = None
) -> dict[int, int]:
    """Per sampled client (`steps`: its client part's step, where it has one; `clusters`:
    FeSEM-CAM's before the round), how many models' logits its E-step needs on its samples
    after its first round, by its paper (every client takes part)."""
    k, sampled = run.algorithm.num_models, sorted(steps) or run.data.participating
    if algorithm in ("ifca", "fedem", "fedrc", "fedsoft"):
        return dict.fromkeys(sampled, k)
    if algorithm == "ifca-cam":
        return dict.fromkeys(sampled, k + 1)
    if algorithm == "fesem-cam":  # its first assignment scores every model, then its cluster
        return {c: k + 1 if int(clusters[c]) < 0 else 2 for c in sampled}
    if algorithm == "stocfl":
        return {c: 0 if s.row >= 0 else s.held.numel() for c, s in steps.items()}
    if algorithm == "cfl":
        return {c: s.halves.numel() for c, s in steps.items()}
    if algorithm in ("fesem", "cfl-gp"):
        return {c: k if s.cluster < 0 else 0 for c, s in steps.items()}
    return dict.fromkeys(sampled, 0)


class Recorder:
    """What a round did: its local trainings (without their start models), the clients whose
    statistic it asked for, the steps it handed out, the inference it computed, and the CPU
    seconds of its server rule (`fold` and `aggregate`: FeSEM's distances, FedSoft's K sums,
    FeSEM-CAM's K-means), which the floor leaves out."""

    def __init__(self, run: Run) -> None:
        self.jobs: list[tuple[Any, ...]] = []
        self.described: list[int] = []
        self.steps: dict[int, Any] = {}
        self.inferred = 0
        self.server = 0.0
        self.clusters = getattr(run.algorithm, "cluster", None)  # before the round
        self.clusters = None if self.clusters is None else self.clusters.clone()
        executor, algorithm = run.executor, run.algorithm
        stream, logits = executor.stream, executor.logits
        describe, client_step = algorithm.describe, algorithm.client_step
        fold, aggregate = algorithm.fold, algorithm.aggregate

        def recorded_stream(jobs: Iterator) -> Iterator:
            return stream(self.record(job) for job in jobs)

        def counted_logits(models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
            self.inferred += models.shape[0] * images.shape[0]
            return logits(models, images)

        def recorded_describe(client: int, *args: Any) -> torch.Tensor:
            self.described.append(client)
            return describe(client, *args)

        def recorded_step(client: int) -> Any:
            self.steps[client] = step = client_step(client)
            return step

        def timed_fold(*args: Any) -> None:
            self.server += timed(lambda: fold(*args))

        def timed_aggregate(models: torch.Tensor) -> torch.Tensor:
            tic = time.process_time()
            new = aggregate(models)
            self.server += time.process_time() - tic
            return new

        executor.stream, executor.logits = recorded_stream, counted_logits
        algorithm.describe, algorithm.client_step = recorded_describe, recorded_step
        algorithm.fold, algorithm.aggregate = timed_fold, timed_aggregate

    def record(self, job: tuple[Any, ...]) -> tuple[Any, ...]:
        task, images, labels, seed = job
        light = copy.copy(task)  # no model kept: 900 of them would not fit in memory
        light.start, light.anchor = None, task.anchor is not None
        self.jobs.append((light, images, labels, seed))
        return job

    @staticmethod
    def release(run: Run) -> None:
        """The executor's and the algorithm's own verbs again."""
        for owner, names in ((run.executor, ("stream", "logits")), (run.algorithm, VERBS)):
            for name in names:
                vars(owner).pop(name, None)


VERBS = ("describe", "client_step", "fold", "aggregate")


def replayed(jobs: list[tuple[Any, ...]], base: torch.Tensor) -> Iterator[tuple[Any, ...]]:
    """The recorded trainings again, each from `base` (and pulled towards it if it was pulled)."""
    for light, images, labels, seed in jobs:
        task = copy.copy(light)
        task.start, task.anchor = base, base if light.anchor else None
        yield task, images, labels, seed


def timed(work: Callable[[], Any]) -> float:
    tic = time.process_time()
    work()
    return time.process_time() - tic


def drain(results: Iterator[Any]) -> None:
    """Consume results, each dropped before the next (as the round loop folds them)."""
    for _ in results:
        pass


def floor(run: Run, recorder: Recorder, algorithm: str) -> dict[str, float]:
    """CPU seconds of the round's own work, each part alone (the module's docstring)."""
    data, executor, models = run.data, run.executor, run.models
    base = models[0].clone()
    train = timed(lambda: drain(executor.stream(replayed(recorder.jobs, base))))
    rows = paper_rows(algorithm, run, recorder.steps, recorder.clusters)
    infer = 0.0
    for count in sorted({r for r in rows.values() if r > 0}):
        clients = [c for c, r in rows.items() if r == count]
        images = torch.cat([data.images[data.train_slices[c]] for c in clients])
        infer += timed(lambda images=images, count=count: executor.logits(models[:count], images))
    stats = 0.0
    for client in recorder.described:
        rows_ = data.train_slices[client]
        x, y = data.images[rows_], data.labels[rows_]
        stats += timed(lambda x=x, y=y, c=client: run.algorithm.describe(c, x, y, models))
    needed = sum(r * data.clients[c].train_size for c, r in rows.items())
    return {"train": train, "infer": infer, "stats": stats, "needed": needed}


def measure(algorithm: str, data: Path, out: Path, args: argparse.Namespace) -> list[dict]:
    """`args.rounds` timed rounds of `algorithm`, each with its floor."""
    config = make_config(
        data=str(data), out=str(out), algorithm=algorithm, rounds=args.rounds + 1,
        local_epochs=1, batch_size=args.batch_size, lr=0.05, clusters=3, device="cpu",
        participation=1.0, **SETTINGS.get(algorithm, {}),
    )  # fmt: skip
    run = training.build_run(config, load_federated(data), Communicator(torch.device("cpu")))
    training.train_round(1, run, None)
    rows = []
    for round_ in range(2, args.rounds + 2):
        recorder = Recorder(run)
        seconds = timed(lambda round_=round_: training.train_round(round_, run, None))
        Recorder.release(run)
        parts = floor(run, recorder, algorithm)
        rows.append({"round": seconds, "inferred": recorder.inferred, "server": recorder.server})
        rows[-1].update(parts)
    if args.evaluation:  # one evaluation of the last models, as `eval_every` makes it
        recorder = Recorder(run)
        seconds = timed(lambda: training.evaluation_checked(run, args.rounds + 1, run.data))
        Recorder.release(run)
        rows[-1]["evaluation"], rows[-1]["evaluated"] = seconds, recorder.inferred
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--samples", type=int, default=200, help="per client, train + test")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per method")
    parser.add_argument("--batch-size", type=int, default=30)
    parser.add_argument("--methods", nargs="+", default=list(BUILT_IN))
    parser.add_argument("--data-root", help="Fashion-MNIST files (default: the system copy)")
    parser.add_argument("--evaluation", action="store_true", help="also time one evaluation")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"{args.clients} clients × {args.samples} samples of Fashion-MNIST (a tenth the test "
        f"split), K = 3, batch {args.batch_size}, lr 0.05, plain SGD, one local epoch; "
        f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'all')}, torch threads "
        f"{torch.get_num_threads()}; load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    extra = " evaluation CPU s | evaluated k |" if args.evaluation else ""
    print("\n| method | round CPU s | floor CPU s (train + infer + stats) | round / floor "
          f"(spread) | server rule CPU s | round / (floor + server rule) | inferred k / needed k |"
          f"{extra}", flush=True)  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|" + "---:|" * 2 * args.evaluation, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        partition_stage(
            PartitionConfig(
                clients=args.clients, samples_per_client=args.samples, out=str(data), seed=0,
                data_root=args.data_root,
            )
        )  # fmt: skip
        for method in args.methods:
            rows = measure(method, data, Path(tmp) / method, args)
            round_ = statistics.median(r["round"] for r in rows)
            parts = [statistics.median(r[k] for r in rows) for k in ("train", "infer", "stats")]
            floors = [r["train"] + r["infer"] + r["stats"] for r in rows]
            ratios = [r["round"] / f for r, f in zip(rows, floors)]
            beyond = [r["round"] / (f + r["server"]) for r, f in zip(rows, floors)]
            spread = f"{min(ratios):.2f}–{max(ratios):.2f}" if len(rows) > 1 else "–"
            print(
                f"| {method} | {round_:.2f} | {sum(parts):.2f} ({parts[0]:.2f} + {parts[1]:.2f}"
                f" + {parts[2]:.2f}) | {statistics.median(ratios):.2f} ({spread}) | "
                f"{statistics.median(r['server'] for r in rows):.2f} | "
                f"{statistics.median(beyond):.2f} | "
                f"{rows[-1]['inferred'] / 1e3:.1f} / {rows[-1]['needed'] / 1e3:.1f} |"
                + (
                    f" {rows[-1]['evaluation']:.2f} | {rows[-1]['evaluated'] / 1e3:.1f} |"
                    if args.evaluation
                    else ""
                ),
                flush=True,
            )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
