"""Seconds of the batched executor's local training with its step under torch.compile
(`train.compile`, `pipeline.engine.compiled`; CUDA graphs on CUDA) against the eager step
(issue 41), and whether both give the same numbers.

The round is conv_paths.py's (synthetic uint8 images, `--clients` × `--models` tasks, the same
options): its local training, `executor.train_many` of every task, on the same model and the
same convolution path (`--conv`) for both. First each executor's first round, wall seconds
(the compiled one's holds its compilation: once per batch shape); then `--repeats` turns in
which the two alternate, the fastest of each (CPU seconds of this process on a CPU, wall
seconds after a synchronize on CUDA; on CUDA the peak memory of the round above its start).
Last, one more round of each from the same start, compared with the batched-vs-sequential
tolerance (tests/test_batched.py): the script exits 1 when a task's loss sum differs by more
than 1e-5 relatively. The parameters' largest difference is reported, and how many tasks
differ by more than 1e-5: where a ReLU's input lies within rounding of 0 (-5e-8 in the CPU
round measured), the two steps' kernels, which round differently, can send it to either side;
its unit then gets another gradient in that task, a row of parameters off by about lr times
that gradient, while the losses stay equal. Among hundreds of tasks that happens.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/compiled_step.py --device cpu \\
        --clients 8 --models 2 --samples 64 --batch-size 32 --drop-last
    PYTHONPATH=. python3 benchmarks/compiled_step.py --device cuda --drop-last  # FMNIST FedRC,
                                       # paper scale under profile: reference (one step a task)
"""

from __future__ import annotations

import sys
import time

import torch
from conv_paths import arguments, executor, header, measure, works
from precision import sync

STEPS = ("eager", "compiled")
TOLERANCE = 1e-5  # tests/test_batched.py's: relative for loss sums, absolute for parameters


def first_seconds(device: torch.device, work) -> float:
    """Wall seconds of `work()`: a compilation runs in worker processes too."""
    sync(device)
    tic = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - tic


def differences(eager: list, compiled: list) -> tuple[float, float, int]:
    """The largest relative difference of a loss sum, the largest absolute difference of a
    parameter, and the tasks with a parameter off by more than `TOLERANCE`."""
    pairs = list(zip(eager, compiled, strict=True))
    losses = max(abs(a.loss_sum - b.loss_sum) / abs(a.loss_sum) for a, b in pairs)
    params = [float((a.params - b.params).abs().max()) for a, b in pairs]
    return losses, max(params), sum(p > TOLERANCE for p in params)


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--conv", default="auto", help="auto (im2col on CUDA), im2col, grouped")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32_matmul
    rounds = {
        step: works(args, executor(args, device, args.conv, compile=step == "compiled"))["round"]
        for step in STEPS
    }
    first = {step: first_seconds(device, rounds[step]) for step in STEPS}
    best = measure(device, args.repeats, {step: {"round": rounds[step]} for step in STEPS})
    losses, params, off = differences(*(rounds[step]() for step in STEPS))
    print(f"{header(args, device)}; conv {args.conv}")
    memory = " peak GPU MiB above the start |" if device.type == "cuda" else ""
    print(f"| step | first round, wall s | s / round (local SGD) | × eager |{memory}")
    print("|---|---:|---:|---:|" + ("---:|" if memory else ""))
    for step in STEPS:
        b = best[step]
        extra = f" {b['memory']:.0f} |" if memory else ""
        speedup = best["eager"]["round"] / b["round"]
        print(f"| {step} | {first[step]:.2f} | {b['round']:.3f} | {speedup:.2f} |{extra}")
    tasks = args.clients * args.models
    print(
        f"compiled against eager: loss sums within {losses:.1e} relatively (tolerance "
        f"{TOLERANCE:g}); parameters within {params:.1e}, {off} of {tasks} tasks beyond "
        f"{TOLERANCE:g}"
    )
    return 0 if losses <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
