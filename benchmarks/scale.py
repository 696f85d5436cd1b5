"""How a round's cost grows with the number of clients holding the same data.

30, 300 and 3,000 clients share the same 54,000 synthetic FMNIST-like samples (1,800, 180 and
18 each), K = 3, one local epoch, batch 128, every client participating. For each algorithm and
size, one child process (so that its peak memory is its own) runs the real round loop of
`benchmarks/speed.py` and reports seconds per round and peak memory (RSS on a CPU, allocated
GPU memory on CUDA). The executor is `sequential` on a CPU and `batched` on CUDA.

    PYTHONPATH=. python3 benchmarks/scale.py --device cpu
    PYTHONPATH=. python3 benchmarks/scale.py --device cuda --rounds 3
    PYTHONPATH=. python3 benchmarks/scale.py --device cpu --total 600 --sizes 2 20 --rounds 1
"""

from __future__ import annotations

import argparse

import torch
from speed import child_round


def child(args: argparse.Namespace, algorithm: str, clients: int) -> dict:
    options = [
        *("--algorithm", algorithm, "--clients", str(clients)),
        *("--samples", str(args.total // clients), "--models", str(args.models)),
        *("--rounds", str(args.rounds), "--warmup", str(args.warmup)),
    ]
    return child_round(args.device, options, f"{algorithm}, {clients} clients")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--total", type=int, default=54_000, help="samples over all clients")
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 300, 3000])
    parser.add_argument("--algorithms", nargs="+", default=["fedrc", "ifca"])
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=0)
    args = parser.parse_args()
    memory = "peak GPU MiB" if args.device == "cuda" else "peak RSS MiB"
    print(
        f"{args.total} samples over {args.sizes} clients, K={args.models}, batch 128, one local "
        f"epoch, device {args.device}, {torch.get_num_threads()} torch thread(s)"
    )
    print(f"| algorithm | clients | samples each | s / round | × smallest | {memory} |")
    print("|---|---:|---:|---:|---:|---:|")
    for algorithm in args.algorithms:
        first = None
        for clients in args.sizes:
            r = child(args, algorithm, clients)
            first = first or r["seconds"]
            print(
                f"| {algorithm} | {clients} | {args.total // clients} | {r['seconds']:.2f} | "
                f"{r['seconds'] / first:.2f} | {r['memory_mib']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
