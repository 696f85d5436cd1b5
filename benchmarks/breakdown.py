"""Where one FedRC round's time goes at the paper's scale: E-step, local training, aggregation and
held-out evaluation, on real Fashion-MNIST (300 clients × 200 samples, K = 3, one local epoch,
batch 128), against the plain-step bound measured in the same process.

    PYTHONPATH=. python3 benchmarks/breakdown.py --device cpu --rounds 2

Round 1 starts from the received models (its E-step computes logits); with evaluation every
round, round 2's E-step reuses the evaluation's logits of round 1 (the same models on the same
samples), which is the fusion of the E-step with the training-accuracy pass. Both are printed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.speed import plain_step_rate
from pipeline.config import PartitionConfig
from pipeline.data.shards import load_federated
from pipeline.places.communicate import Communicator
from pipeline.run import training
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage


def timed(phases: dict[str, float], name: str, function):
    """`function`, adding its wall time to phases[name]."""

    def wrapper(*args, **kwargs):
        tic = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - tic

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, help="per client (default: the whole pool)")
    args = parser.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        partition_stage(
            PartitionConfig(
                clients=args.clients, samples_per_client=args.samples, out=str(data_dir)
            )
        )
        config = make_config(data=str(data_dir), clusters=3, local_epochs=1, device=args.device)
        data = load_federated(data_dir).to(device)
    run = training.build_run(config, data, Communicator(device))
    samples = sum(data.clients[c].train_size for c in data.participating)
    rows = []
    for round_ in range(1, args.rounds + 1):
        phases: dict[str, float] = defaultdict(float)
        originals = (training.estep_inputs, training.train_and_fold, run.algorithm.aggregate)
        training.estep_inputs = timed(phases, "E-step", originals[0])
        training.train_and_fold = timed(phases, "local training", originals[1])
        run.algorithm.aggregate = timed(phases, "aggregation", originals[2])
        cached = rows[-1]["logits"] if rows else None
        tic = time.perf_counter()
        try:
            training.train_round(round_, run, cached)
            phases["rest of the round"] = time.perf_counter() - tic - sum(phases.values())
            tic = time.perf_counter()
            _, logits = training.evaluation_checked(run, round_)
            phases["evaluation"] = time.perf_counter() - tic
        finally:
            training.estep_inputs, training.train_and_fold = originals[:2]
            run.algorithm.aggregate = originals[2]
        rows.append({"round": round_, "phases": dict(phases), "logits": logits})
    speed_args = argparse.Namespace(
        dataset="fmnist", model="cnn", norm="batch", algorithm="fedrc", models=3, local_epochs=1,
        batch_size=128, device=args.device, chunk_clients=None, precision="fp32",
    )  # fmt: skip
    bound = plain_step_rate(speed_args, device)
    print(
        f"FedRC, real Fashion-MNIST, {args.clients} clients ({samples} training samples), K = 3, "
        f"batch 128, one local epoch, device {args.device}, {torch.get_num_threads()} thread(s)\n"
    )
    names = ["E-step", "local training", "aggregation", "rest of the round", "evaluation"]
    print("| round | " + " | ".join(names) + " | train samples/s | vs plain-step bound |")
    print("|---" * (len(names) + 3) + "|")
    for row in rows:
        p = row["phases"]
        rate = 3 * samples / p["local training"]
        cells = " | ".join(f"{p[n]:.1f} s" for n in names)
        print(f"| {row['round']} | {cells} | {rate:.0f} | {rate / bound:.0%} |")
    print(f"\nplain training steps of one model at batch 128: {bound:.0f} samples/s")


if __name__ == "__main__":
    main()
