"""Size and write time of a checkpoint at the paper's scale, with and without persistent momentum.

The state is the real one of a FedRC run on the FMNIST CNN (K = 3, 300 clients × 180 training
samples, synthetic pixels): models, algorithm state after every client's E-step (Adam E-step
moments included), cached logits, and, with `persistent_momentum` (`profile: reference`), a
momentum buffer for every (client, model) pair. Buffers are filled with random numbers instead of
training 900 local models: their size, not their values, is what a checkpoint pays for.

    PYTHONPATH=. python3 benchmarks/checkpoint.py --out /tmp/ckpt-bench   # about 16 GB of disk
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
from speed import synthetic

from pipeline.engine.task import LocalResult, LocalTask
from pipeline.evaluation.accuracy import per_sample_losses
from pipeline.places.communicate import Communicator
from pipeline.run.resolve import make_config
from pipeline.run.training import build_run, checkpoint_interval, save_checkpoint

MB = 1e6


def folder_bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern))


def measure(args: argparse.Namespace, persistent: bool) -> dict:
    out = Path(args.out) / ("momentum" if persistent else "plain")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    device = torch.device("cpu")
    data = synthetic(args, device)
    config = make_config(
        algorithm="fedrc",
        clusters=args.models,
        estep="adam",
        persistent_momentum=persistent,
        device="cpu",
        out=str(out),
    )
    run = build_run(config, data, Communicator(device), out)
    logits = run.executor.logits(run.models, data.images)
    for client in data.participating:  # the E-step state of every client
        rows = data.train_slices[client]
        losses = per_sample_losses(logits[:, rows], data.labels[rows])
        run.algorithm.e_step(client, losses, data.labels[rows])
        run.algorithm.e_step(client, losses, data.labels[rows])  # second visit: Adam moments
    if persistent:
        gen = torch.Generator().manual_seed(0)
        for client in data.participating:
            for k in range(run.algorithm.num_rows):
                task = LocalTask(k, run.models[k], torch.ones(1), client=client)
                buffer = torch.randn(run.momentum.size, generator=gen)
                run.momentum.keep(task, LocalResult(run.models[k], 0.0, buffer))
    tic = time.perf_counter()
    save_checkpoint(run, out, '{"bench": 1}', 1, [1], [run.algorithm.omega_table()], logits)
    seconds = time.perf_counter() - tic
    every = checkpoint_interval(config, run)
    run.momentum.close()
    result = {
        "checkpoint_mb": folder_bytes(out, "checkpoint.pt") / MB,
        "momentum_mb": folder_bytes(out, "checkpoint-momentum-*.npy") / MB,
        "seconds": seconds,
        "every": every,
    }
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/fedrc-checkpoint-bench")
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--samples", type=int, default=180)
    parser.add_argument("--models", type=int, default=3)
    args = parser.parse_args()
    args.dataset, args.model, args.norm = "fmnist", "cnn", "batch"
    print(
        f"FedRC, FMNIST CNN, K={args.models}, {args.clients} clients × {args.samples} samples, "
        "Adam E-step"
    )
    print(
        "| persistent momentum | checkpoint.pt MB | momentum snapshot MB | write s | "
        "default checkpoint_every |"
    )
    print("|---|---|---|---|---|")
    for persistent in (False, True):
        r = measure(args, persistent)
        print(
            f"| {'yes' if persistent else 'no'} | {r['checkpoint_mb']:.1f} | "
            f"{r['momentum_mb']:.0f} | {r['seconds']:.2f} | {r['every']} |"
        )


if __name__ == "__main__":
    main()
