"""Seconds per federated round of the sequential and the batched executor, side by side.

Synthetic uint8 images of the dataset's shape (random pixels and labels: this measures speed,
not accuracy), every client participating, the real round loop (`pipeline.run.training.train_round`:
E-step, local training streamed into the aggregate, aggregation). Each executor runs in its own
child process, so its peak memory is its own.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/speed.py --device cpu \\
        --clients 30 --samples 200 --models 3 --rounds 1
    PYTHONPATH=. python3 benchmarks/speed.py --device cuda --clients 300 --samples 200 \\
        --models 3 --rounds 5                      # FMNIST FedRC at the paper's scale

FLOPs are counted with `torch.utils.flop_counter.FlopCounterMode` on one forward pass; a training
sample costs 3× its forward (forward + backward), an E-step sample 1× per model row.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from pipeline.config import TrainConfig
from pipeline.data.records import ClientRecord, Manifest, content_hash
from pipeline.data.shards import FederatedData
from pipeline.engine.sequential import as_input
from pipeline.models import build_model
from pipeline.places.communicate import Communicator
from pipeline.run.resolve import make_config
from pipeline.run.training import build_run, train_round

SHAPES = {"fmnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def synthetic(args: argparse.Namespace, device: torch.device) -> FederatedData:
    height, width, channels = SHAPES[args.dataset]
    n = args.clients * args.samples
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, channels, height, width), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    slices = [slice(i * args.samples, (i + 1) * args.samples) for i in range(args.clients)]
    histograms = [tuple(torch.bincount(labels[s], minlength=10).tolist()) for s in slices]
    clients = tuple(  # participating, clean, concept 0, every row for training
        ClientRecord(i, True, 0, "none", 0, None, args.samples, 0, counts, counts)
        for i, counts in enumerate(histograms)
    )
    manifest = Manifest(
        dataset=args.dataset,
        source="random pixels and labels",
        image_shape=(height, width, channels),
        num_classes=10,
        concepts=("identity",),
        client_mix=(),
        config={},
        seed=0,
        versions={},
        num_participating=args.clients,
        clients=clients,
        files={},
        content_hash=content_hash({}),
    )
    empty = [slice(s.stop, s.stop) for s in slices]
    rows = torch.arange(n)
    return FederatedData(images, labels, slices, empty, manifest, rows, rows).to(device)


def config(args: argparse.Namespace, executor: str) -> TrainConfig:
    return make_config(
        algorithm=args.algorithm,
        clusters=args.models,
        model=args.model,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        **({} if args.model == "cnn" else {"norm": args.norm}),
        **({"mu": 0.01} if args.algorithm in ("fedprox", "fedsoft", "fesem-cam") else {}),
        device=args.device,
        executor=executor,
        chunk_clients=args.chunk_clients,
        precision=args.precision,
    )


def model_settings(args: argparse.Namespace) -> Any:
    return config(args, "sequential").model_settings


def peak_memory(device: torch.device) -> float:
    """MiB: torch.cuda.max_memory_allocated on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(args: argparse.Namespace, executor_name: str) -> dict:
    """One executor's seconds per round and samples trained per round (in this process)."""
    device = torch.device(args.device)
    cfg = config(args, executor_name)
    data = synthetic(args, device)
    run = build_run(cfg, data, Communicator(device))
    counted = {"train": 0}
    stream = run.executor.stream

    def counting(jobs):
        for job, result in stream(jobs):
            counted["train"] += job[2].numel() * cfg.local_epochs
            yield job, result

    run.executor.stream = counting
    for round_ in range(1, args.warmup + 1):
        train_round(round_, run, None)
    sync(device)
    counted["train"] = 0
    tic, cpu = time.perf_counter(), time.process_time()
    for round_ in range(args.warmup + 1, args.warmup + args.rounds + 1):
        train_round(round_, run, None)
    sync(device)
    seconds = (time.perf_counter() - tic) / args.rounds
    return {
        "seconds": seconds,
        "cpu_seconds": (time.process_time() - cpu) / args.rounds,  # this process, all threads
        "train_samples": counted["train"] / args.rounds,
        "estep_samples": args.clients * args.samples * run.algorithm.num_rows,
        "memory_mib": peak_memory(device),
    }


def forward_flops(args: argparse.Namespace, device: torch.device) -> float:
    """FLOPs of one sample's forward pass."""
    height, width, channels = SHAPES[args.dataset]
    model = build_model((height, width, channels), 10, args.model, model_settings(args)).to(device)
    x = torch.zeros(8, channels, height, width, device=device)
    with FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / 8


def plain_step_rate(args: argparse.Namespace, device: torch.device, steps: int = 5) -> float:
    """Samples/s of plain training steps of one model at batch 128: the machine's own bound."""
    height, width, channels = SHAPES[args.dataset]
    model = build_model((height, width, channels), 10, args.model, model_settings(args)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randint(0, 256, (128, channels, height, width), dtype=torch.uint8, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(as_input(x)), y).backward()
        opt.step()

    step()
    sync(device)
    tic = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return 128 * steps / (time.perf_counter() - tic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(SHAPES), default="fmnist")
    parser.add_argument("--algorithm", default="fedrc")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--norm", default="batch")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--samples", type=int, default=200, help="training samples per client")
    parser.add_argument("--models", type=int, default=3, help="K")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run before measuring")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--executors", default="sequential,batched")
    parser.add_argument("--chunk-clients", type=int, default=None)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args, args.child)))
        return

    device = torch.device(args.device)
    results = {}
    for name in args.executors.split(","):
        argv = [sys.executable, __file__, *sys.argv[1:], "--child", name]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{name}: failed\n{done.stderr}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])

    flops = forward_flops(args, device)
    bound = plain_step_rate(args, device)
    threads = torch.get_num_threads()
    print(
        f"{args.dataset}-like synthetic {SHAPES[args.dataset]}, {args.algorithm}, {args.model}, "
        f"{args.clients} clients × {args.samples} samples, K={args.models}, batch "
        f"{args.batch_size}, {args.local_epochs} local epoch(s), device {args.device}, "
        f"{threads} torch thread(s), {args.rounds} measured round(s) after {args.warmup} warm-up"
    )
    base = results.get("sequential", next(iter(results.values())))["seconds"]
    memory = "peak GPU MiB" if device.type == "cuda" else "peak RSS MiB"
    print(f"| executor | s / round | × sequential | {memory} | train samples/s | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        work = 3 * flops * r["train_samples"] + flops * r["estep_samples"]
        print(
            f"| {name} | {r['seconds']:.2f} | {r['seconds'] / base:.2f} | "
            f"{r['memory_mib']:.0f} | {r['train_samples'] / r['seconds']:.0f} | "
            f"{work / r['seconds'] / 1e12:.4f} |"
        )
    print(
        f"| plain step, batch 128 (bound) | – | – | – | {bound:.0f} | "
        f"{3 * flops * bound / 1e12:.4f} |"
    )
    print(f"forward FLOPs per sample: {flops / 1e6:.1f} M")


def child_round(device: str, options: list[str], label: str) -> dict:
    """One measurement of this script in a child process of its own (so that its peak memory
    is its own), for the other benchmarks: `options` follow `--device`, the executor follows the
    device (batched on CUDA, sequential on a CPU); a failure exits naming `label`."""
    executor = "batched" if device == "cuda" else "sequential"
    argv = [sys.executable, __file__, "--device", device, *options, "--child", executor]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{label}: failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
