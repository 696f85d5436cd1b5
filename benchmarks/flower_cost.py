"""Seconds and bytes per round: one process, torchrun, and a Flower deployment, same clients.

A small synthetic benchmark is trained three ways with the same configuration: `fedrc train` in
one process, `torchrun --nproc-per-node P` (`benchmarks/distributed.py`'s worker: bytes its
collectives moved), and a Flower deployment on this machine, one SuperLink and P SuperNodes
(`pipeline.flower.local`; bytes of the records the server sent and received, from the
ServerApp's `fedrc round` log lines). Run it in the virtual environment that has the `flower`
extra:

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/flower_cost.py --algorithms fedavg fedrc

The first round (start-up, first E-step) is left out of the means.
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
sys.path.insert(0, str(ROOT))

from pipeline.config import PartitionConfig  # noqa: E402
from pipeline.flower.local import LocalDeployment  # noqa: E402
from pipeline.run.files import METRICS, read_metrics  # noqa: E402
from pipeline.stages import partition_stage  # noqa: E402

SETTINGS = dict(local_epochs=1, batch_size=32, lr=0.05, device="cpu")


def torchrun(args, data: Path, tmp: Path, algorithm: str, procs: int) -> list[dict]:
    report = tmp / f"{algorithm}-{procs}.json"
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs)),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"),
        str(ROOT / "benchmarks" / "distributed.py"),
        *("--worker", "--data", str(data), "--algorithm", algorithm),
        *("--out", str(tmp / f"run-{algorithm}-{procs}"), "--report", str(report)),
        *("--models", str(args.models), "--rounds", str(args.rounds), "--eval-every", "1"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, env=env, check=True, capture_output=True)
    rows = json.loads(report.read_text())
    return [
        {"seconds": r["seconds"], "bytes": r["all_reduce"] + r["all_gather"] + r["broadcast"]}
        for r in rows
    ]


def flower(args, data: Path, tmp: Path, algorithm: str, deployment: LocalDeployment) -> list[dict]:
    app, out = tmp / f"app-{algorithm}", tmp / f"flower-{algorithm}"
    values = {**SETTINGS, "clusters": args.models, "rounds": args.rounds, "eval_every": 1}
    options = [f"--{k.replace('_', '-')}={v}" for k, v in values.items()]
    subprocess.run(
        [sys.executable, "-m", "fedrc_cli", "flower", "app", "--app", str(app), "--data",
         str(data), "--out", str(out), "--algorithm", algorithm, *options],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    done = deployment.run(app, timeout=1800)
    logged = [
        json.loads(line.split("fedrc round ", 1)[1])
        for line in done.output.splitlines()
        if "fedrc round {" in line
    ]
    if done.status != "finished:completed" or len(logged) != args.rounds:
        sys.exit(f"flower {algorithm}: {done.details or 'run failed'}\n{done.output[-3000:]}")
    seconds = [r["seconds"] for r in read_metrics(out / METRICS)]
    return [
        {"seconds": s, "bytes": r["flower_bytes_sent"] + r["flower_bytes_received"]}
        for s, r in zip(seconds, logged)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedrc"])
    parser.add_argument("--clients", type=int, default=9)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--places", type=int, default=3, help="torchrun processes = SuperNodes")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fedrc-flower-cost-"))
    data = tmp / "data"
    partition_stage(
        PartitionConfig(
            dataset="synthetic", clients=args.clients, samples_per_client=args.samples,
            holdout_samples=200, out=str(data),
        )
    )  # fmt: skip
    total = args.clients + 3  # the held-out clients too: one per concept
    nodes = [
        {"fedrc-data": str(data), "fedrc-clients": ",".join(map(str, range(n, total, args.places)))}
        for n in range(args.places)
    ]
    print(
        f"{args.clients} clients × {args.samples} synthetic samples, K={args.models}, "
        f"{args.rounds} rounds (the first left out), one local epoch, batch 32, CPU, "
        f"{args.places} torchrun processes / SuperNodes on this machine"
    )
    print("| algorithm | how | s / round | MB / round |")
    print("|---|---|---:|---:|")
    with LocalDeployment(tmp / "flower", nodes) as deployment:
        for algorithm in args.algorithms:
            ways = {
                "one process": torchrun(args, data, tmp, algorithm, 1),
                f"torchrun × {args.places}": torchrun(args, data, tmp, algorithm, args.places),
                f"Flower, {args.places} SuperNodes": flower(args, data, tmp, algorithm, deployment),
            }
            for how, rows in ways.items():
                seconds = statistics.mean(r["seconds"] for r in rows[1:])
                megabytes = statistics.mean(r["bytes"] for r in rows[1:]) / 1e6
                print(f"| {algorithm} | {how} | {seconds:.2f} | {megabytes:.1f} |", flush=True)


if __name__ == "__main__":
    main()
