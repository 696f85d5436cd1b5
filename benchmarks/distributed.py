"""Seconds per round and bytes communicated per round with 1, 2, … torchrun processes.

Builds a small synthetic benchmark, then for each process count runs
`torchrun --nproc-per-node N benchmarks/distributed.py --worker …`, the real `fedrc train`
path (`pipeline.run.training.run_training`, sharded under torchrun). Rank 0 reports each
round's seconds and the bytes that its collectives moved
(`pipeline.places.distributed.Group.traffic`: tensor bytes all-reduced, all-gathered (received,
padding included) and broadcast, plus pickled objects). One process is the plain
single-process loop: no process group, no traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    from pipeline.places import distributed
    from pipeline.run.resolve import make_config
    from pipeline.run.training import run_training

    rows, last = [], {"all_reduce": 0, "all_gather": 0, "broadcast": 0}

    def on_round(row: dict) -> None:
        group = distributed.active()
        traffic = dict(group.traffic) if group else dict(last)
        rows.append(
            {
                "round": row["round"],
                "seconds": row["seconds"],
                **{k: traffic[k] - last[k] for k in traffic},
            }
        )
        last.update(traffic)

    config = make_config(
        data=args.data,
        algorithm=args.algorithm,
        clusters=args.models,
        rounds=args.rounds,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        eval_every=args.eval_every,
        device=args.device,
        out=args.out,
    )
    run_training(config, overwrite=True, on_round=on_round)
    if distributed.env_rank() == 0:
        Path(args.report).write_text(json.dumps(rows))


def launch(args: argparse.Namespace) -> None:
    from pipeline.config import PartitionConfig
    from pipeline.stages import partition_stage

    tmp = Path(tempfile.mkdtemp(prefix="fedrc-dist-bench-"))
    data = tmp / "data"
    partition_stage(
        PartitionConfig(
            dataset="synthetic",
            clients=args.clients,
            samples_per_client=args.samples,
            holdout_samples=200,
            out=str(data),
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(
        f"{args.clients} clients × {args.samples} samples, K={args.models}, "
        f"{args.rounds} rounds, eval every {args.eval_every}, device {args.device}"
    )
    print(
        "| algorithm | processes | s / round | speed-up | MB all-reduced | MB gathered | MB bcast |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for algorithm in args.algorithms:
        base = None
        for procs in args.procs:
            report = tmp / f"{algorithm}-{procs}.json"
            command = [
                *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs)),
                *("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"),
                str(Path(__file__).resolve()),
                *("--worker", "--data", str(data), "--algorithm", algorithm),
                *("--out", str(tmp / f"run-{algorithm}-{procs}"), "--report", str(report)),
                *("--models", str(args.models), "--rounds", str(args.rounds)),
                *("--eval-every", str(args.eval_every), "--device", args.device),
            ]
            subprocess.run(command, env=env, check=True, capture_output=True)
            rows = json.loads(report.read_text())[1:]
            seconds = statistics.mean(r["seconds"] for r in rows)
            base = base or seconds
            mb = {k: statistics.mean(r[k] for r in rows) / 1e6 for k in rows[0] if k[0] in "ab"}
            print(
                f"| {algorithm} | {procs} | {seconds:.2f} | {base / seconds:.2f}× | "
                f"{mb['all_reduce']:.2f} | {mb['all_gather']:.2f} | {mb['broadcast']:.2f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedrc", "fesem"])
    parser.add_argument("--algorithm", default="fedrc")  # worker
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--data", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--report", default="")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
