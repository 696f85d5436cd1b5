"""Seconds of the batched executor's two convolution paths (issue 41), side by side: vmap's
grouped convolution ("grouped", one cuDNN kernel per task on a GPU) and im2col with one batched
matrix product per layer ("im2col", `pipeline.engine.im2col`).

Synthetic uint8 images (random pixels and labels: this measures speed, not accuracy) of
`--clients` clients × `--samples` samples; each client's data is trained by `--models` tasks
(K model rows, as FedRC's local training), so a round has clients × K tasks. Per path, on the
same model: one local-SGD step of every task (a round of one batch each), the round's local
training (`--local-epochs` epochs of every task, `executor.train_many`), and the E-step's logits
of the K models on every client's images. One warm-up of each, then `--repeats` turns in which
the paths alternate; the fastest of each. Clock: CPU seconds of this process on a CPU (give it
one thread), wall seconds after a synchronize on CUDA.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/conv_paths.py --device cpu \\
        --clients 8 --models 2 --samples 64 --batch-size 32
    PYTHONPATH=. python3 benchmarks/conv_paths.py --device cuda   # FMNIST FedRC, paper scale
    PYTHONPATH=. python3 benchmarks/conv_paths.py --device cuda --tf32-matmul --drop-last
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from precision import machine, timed

from pipeline.engine import BatchedExecutor, LocalTask
from pipeline.models import build_model

PATHS = ("grouped", "im2col")


def data(args: argparse.Namespace, device: torch.device, samples: int) -> list[tuple]:
    """Every client's (images, labels)."""
    gen = torch.Generator().manual_seed(0)
    shape = (samples, args.channels, args.image, args.image)
    return [
        (
            torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device),
            torch.randint(0, args.classes, (samples,), generator=gen).to(device),
        )
        for _ in range(args.clients)
    ]


def executor(
    args: argparse.Namespace, device: torch.device, conv: str, compile: bool = False
) -> BatchedExecutor:
    torch.manual_seed(0)  # the same model for every path
    shape = (args.image, args.image, args.channels)
    return BatchedExecutor(
        build_model(shape, args.classes, args.model),
        device,
        lr=0.01,
        momentum=0.9,
        weight_decay=5e-4,
        batch_size=args.batch_size,
        local_epochs=args.local_epochs,
        drop_last=args.drop_last,
        chunk_tasks=args.chunk_tasks,
        precision=args.precision,
        conv=conv,
        compile=compile,
    )


def works(args: argparse.Namespace, ex: BatchedExecutor) -> dict[str, Callable[[], object]]:
    """The three measured calls of one path."""
    start = ex.flatten()
    models = torch.stack([start + 0.01 * k for k in range(args.models)])

    def jobs(clients: list[tuple]) -> list[tuple]:
        return [
            (LocalTask(k, models[k], torch.ones(len(y), device=ex.device)), x, y, c * 100 + k)
            for c, (x, y) in enumerate(clients)
            for k in range(args.models)
        ]

    step = jobs(data(args, ex.device, args.batch_size))
    clients = data(args, ex.device, args.samples)
    local = jobs(clients)
    images = torch.cat([x for x, _ in clients])
    return {
        "step": lambda: ex.train_many(step),
        "round": lambda: ex.train_many(local),
        "logits": lambda: ex.logits(models, images),
    }


def measure(
    device: torch.device, repeats: int, calls: dict[str, dict[str, Callable[[], object]]]
) -> dict[str, dict[str, float]]:
    """Fastest seconds of each path's calls after one warm-up call each and, on CUDA, the
    peak memory (MiB) of its calls above what was allocated before each."""
    best = {conv: {**dict.fromkeys(calls[conv], float("inf")), "memory": 0.0} for conv in calls}
    for conv in calls:  # warm-up
        for work in calls[conv].values():
            work()
    for _ in range(repeats):
        for conv in calls:
            for name, work in calls[conv].items():
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device)
                best[conv][name] = min(best[conv][name], timed(device, work))
                if device.type == "cuda":
                    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
                    best[conv]["memory"] = max(best[conv]["memory"], peak)
    return best


def arguments(description: str) -> argparse.ArgumentParser:
    """The options of the synthetic round and its model (compiled_step.py takes them too)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--image", type=int, default=28, help="height = width")
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--models", type=int, default=3, help="K: tasks per client")
    parser.add_argument("--samples", type=int, default=180, help="training samples per client")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--chunk-tasks", type=int, default=None)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tf32-matmul", action="store_true", help="torch.backends.cuda.matmul.allow_tf32"
    )
    return parser


def header(args: argparse.Namespace, device: torch.device) -> str:
    """The machine and the round measured, in one line."""
    tasks = args.clients * args.models
    return (
        f"{machine(device)}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"{args.model} on {args.channels}×{args.image}×{args.image}, {args.clients} clients × "
        f"K={args.models} = {tasks} tasks, {args.samples} samples, batch {args.batch_size}, "
        f"{args.local_epochs} epoch(s), drop_last {args.drop_last}, chunk "
        f"{args.chunk_tasks or 'auto'}, {args.precision}, TF32 matmul {args.tf32_matmul}; "
        f"the fastest of {args.repeats}"
    )


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32_matmul
    calls = {conv: works(args, executor(args, device, conv)) for conv in PATHS}
    best = measure(device, args.repeats, calls)
    print(header(args, device))
    memory = " peak GPU MiB above the start |" if device.type == "cuda" else ""
    print(f"| conv | s / step | s / round (local SGD) | s / E-step logits |{memory}")
    print("|---|---:|---:|---:|" + ("---:|" if memory else ""))
    for conv in PATHS:
        b = best[conv]
        extra = f" {b['memory']:.0f} |" if memory else ""
        print(f"| {conv} | {b['step']:.3f} | {b['round']:.3f} | {b['logits']:.3f} |{extra}")


if __name__ == "__main__":
    main()
