"""bf16 autocast against fp32: samples/s of the FMNIST CNN's local training and inference, and
one paper-scale FedRC round, each as a bf16 / fp32 ratio measured in one invocation.

The executor is the one `executor: auto` picks (sequential on a CPU, batched on CUDA), on
synthetic uint8 images of FMNIST's shape (random pixels and labels: this measures speed, not
accuracy). Training: one client's local epoch (`executor.train`) at each batch size, fp32 and bf16
alternating, the best of `--repeats` each. Inference: the E-step's logits of K models. The round:
`benchmarks/speed.py`'s real round loop (E-step, local training, aggregation), one child process
per precision, 300 clients × 180 samples (54,000), K = 3.

Clock: on a CPU, the process's CPU seconds (`time.process_time`), so that other jobs on a shared
machine do not count (give it one thread, `OMP_NUM_THREADS=1`, or the seconds of all threads add
up); on CUDA, wall seconds after a synchronize. The round reports both.

Do not run it under the tests' `ONEDNN_MAX_CPU_ISA=AVX2`: there bf16 is emulated (about 10×
slower); the header says whether it is set.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/precision.py --device cpu
    PYTHONPATH=. python3 benchmarks/precision.py --device cuda --round-rounds 3 --round-warmup 1
    PYTHONPATH=. python3 benchmarks/precision.py --samples 256 --batches 16 --round-clients 0
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from speed import child_round

from pipeline.engine import BatchedExecutor, LocalTask, SequentialExecutor
from pipeline.models import build_model

PRECISIONS = ("fp32", "bf16")
SHAPE = (28, 28, 1)  # FMNIST


def make_executor(device: torch.device, precision: str, batch: int) -> SequentialExecutor:
    kind = BatchedExecutor if device.type == "cuda" else SequentialExecutor
    torch.manual_seed(0)
    model = build_model(SHAPE, 10, "cnn")
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=0.0, local_epochs=1, drop_last=False)
    return kind(model, device, **sgd, batch_size=batch, precision=precision)


def images(count: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (count, 1, 28, 28), dtype=torch.uint8, generator=gen)
    return x.to(device), torch.randint(0, 10, (count,), generator=gen).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, work) -> float:
    """Seconds of `work()`: CPU seconds of this process on a CPU, wall seconds on CUDA."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    sync(device)
    tic = clock()
    work()
    sync(device)
    return clock() - tic


def best_rates(device: torch.device, repeats: int, works: dict[str, object], count: int) -> dict:
    """Samples/s of each precision's `work`: one warm-up call each, then `repeats` rounds of
    calls in turn (fp32, bf16, fp32, …), the fastest of each precision's calls."""
    for work in works.values():
        work()
    best = {name: float("inf") for name in works}
    for _ in range(repeats):
        for name, work in works.items():
            best[name] = min(best[name], timed(device, work))
    return {name: count / seconds for name, seconds in best.items()}


def train_rates(args: argparse.Namespace, device: torch.device, batch: int) -> dict:
    """Local training samples/s: one client of `batch × --batches` samples, one epoch."""
    x, y = images(batch * args.batches, device)
    works = {}
    for precision in PRECISIONS:
        ex = make_executor(device, precision, batch)
        task = LocalTask(0, ex.flatten(), torch.ones(len(y), device=device))
        works[precision] = lambda ex=ex, task=task: ex.train(task, x, y, 0)
    return best_rates(device, args.repeats, works, len(y))


def inference_rates(args: argparse.Namespace, device: torch.device) -> dict:
    """E-step samples/s: the logits of K models on `--samples` images (per image, all K)."""
    x, _ = images(args.samples, device)
    works = {}
    for precision in PRECISIONS:
        ex = make_executor(device, precision, 128)
        models = torch.stack([ex.flatten()] * args.models)
        works[precision] = lambda ex=ex, models=models: ex.logits(models, x)
    return best_rates(device, args.repeats, works, len(x))


def round_seconds(args: argparse.Namespace, precision: str) -> dict:
    """`benchmarks/speed.py`'s round in a child process: seconds per round, peak memory."""
    options = [
        *("--algorithm", "fedrc", "--clients", str(args.round_clients)),
        *("--samples", str(args.round_samples), "--models", str(args.models)),
        *("--rounds", str(args.round_rounds), "--warmup", str(args.round_warmup)),
        *("--precision", precision),
    ]
    return child_round(args.device, options, f"round, {precision}")


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name, flags = platform.processor() or "CPU", ""
    try:
        with open("/proc/cpuinfo") as file:
            info = file.read()
        name = next(
            line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line
        )
        flags = " (avx512_bf16)" if "avx512_bf16" in info else " (no avx512_bf16)"
    except (OSError, StopIteration):
        pass
    return name + flags


def row(what: str, batch: object, rates: dict, unit: str = "{:.0f}") -> str:
    fp32, bf16 = rates["fp32"], rates["bf16"]
    return f"| {what} | {batch} | {unit.format(fp32)} | {unit.format(bf16)} | {bf16 / fp32:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument(
        "--batches", type=int, default=20, help="local steps of the training client"
    )
    parser.add_argument("--samples", type=int, default=2560, help="images of the inference pass")
    parser.add_argument("--models", type=int, default=3, help="K")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--round-clients", type=int, default=300, help="0: no round")
    parser.add_argument("--round-samples", type=int, default=180, help="training samples each")
    parser.add_argument("--round-rounds", type=int, default=1, help="measured rounds")
    parser.add_argument("--round-warmup", type=int, default=0, help="rounds before measuring")
    args = parser.parse_args()
    device = torch.device(args.device)
    pin = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(
        f"{machine(device)}, torch {torch.__version__}, {torch.get_num_threads()} torch "
        f"thread(s), ONEDNN_MAX_CPU_ISA={pin or 'unset'}; FMNIST CNN {SHAPE}, synthetic data"
    )
    print("| measure | batch | fp32 | bf16 | bf16 / fp32 |")
    print("|---|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        print(row("train samples/s (local epoch)", batch, train_rates(args, device, batch)))
    estep = f"E-step samples/s (K={args.models})"
    print(row(estep, "256" if device.type == "cpu" else "2048", inference_rates(args, device)))
    if args.round_clients:
        rounds = {p: round_seconds(args, p) for p in PRECISIONS}
        key = "seconds" if device.type == "cuda" else "cpu_seconds"
        total = args.round_clients * args.round_samples
        what = f"FedRC rounds/hour ({args.round_clients} clients, {total} samples, K={args.models})"
        print(row(what, 128, {p: 3600 / r[key] for p, r in rounds.items()}, "{:.1f}"))
        for p, r in rounds.items():
            print(
                f"round, {p}: {r['cpu_seconds']:.1f} CPU s, {r['seconds']:.1f} wall s, "
                f"{r['train_samples'] / r[key]:.0f} train samples/s, peak memory "
                f"{r['memory_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
