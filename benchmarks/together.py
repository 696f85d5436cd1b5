"""A grid of runs one after another against the same grid trained together in one process
(`fedrc sweep --together N`: the runs' local trainings in the same batched steps), whole
commands timed on one benchmark, with the GPU's utilisation where nvidia-smi answers.

    PYTHONPATH=. python3 benchmarks/together.py --device cuda --data .gpu-work/data/federated \\
        --rounds 5 --seeds 0 1 2 --lrs 0.01 0.03 0.06 0.1 --together 4 12  # a partition made
    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/together.py --device cpu --clients 6 \\
        --samples 40 --rounds 1 --seeds 0 1 --lrs 0.1 --together 2   # toy size

The benchmark is a partition given as `--data`, or one made of `--dataset` (default fedrc's
built-in synthetic images, 16×16) with `--clients` × `--samples`; FedRC with K = 3, the batched
executor, evaluation every round; each arrangement is one `fedrc sweep` command into a folder of
its own, so start-up, evaluation and writing count.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.gpu_trials import GpuSampler


def fedrc(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedrc_cli", *args]


def run(argv: list[str], where: Path) -> None:
    done = subprocess.run(argv, cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[2:5])}: failed\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--data-root", help="a folder with the dataset's files")
    parser.add_argument("--data", help="a partitioned benchmark to use instead")
    parser.add_argument("--algorithm", default="fedrc")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--samples", type=int, default=200, help="samples per client")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seeds", nargs="+", default=["0", "1"])
    parser.add_argument("--lrs", nargs="+", default=["0.1"])
    parser.add_argument("--together", type=int, nargs="+", default=[2], help="widths to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        data = Path(args.data).resolve() if args.data else where / "data"
        if not args.data:
            root = ["--data-root", str(Path(args.data_root).resolve())] if args.data_root else []
            run(fedrc("partition", "--dataset", args.dataset, "--clients", str(args.clients),
                      "--samples-per-client", str(args.samples), "--out", "data", *root),
                where)  # fmt: skip
        grid = ["--grid", f"algorithm={args.algorithm}", "--grid", "seed=" + ",".join(args.seeds),
                "--grid", "lr=" + ",".join(args.lrs), "--no-plots"]  # fmt: skip
        (where / "params.yaml").write_text(
            f"train: {{data: '{data}', rounds: {args.rounds}, device: {args.device}, "
            "executor: batched, eval_every: 1}\n"
        )
        sampler = GpuSampler(0.5)
        rows = []
        for width in [0, *args.together]:
            out = f"runs/w{width}"
            extra = ["--together", str(width)] if width else []
            tic = time.monotonic()
            run(fedrc("sweep", *grid, "--out", out, *extra), where)
            toc = time.monotonic()
            rows.append((width, toc - tic, sampler.between(tic, toc)))
        sampler.close()
    points = len(args.seeds) * len(args.lrs)
    print(
        f"{args.algorithm} on {args.data or args.dataset}, {points} runs of {args.rounds} "
        f"round(s), K = 3, batched executor, device {args.device}"
    )
    print("| arrangement | s | × one by one | GPU busy | peak GPU MiB |")
    print("|---|---:|---:|---:|---:|")
    base = rows[0][1]
    for width, seconds, gpu in rows:
        name = "one by one" if width == 0 else f"--together {width}"
        util = f"{gpu['util']:.0f} %" if gpu else "–"
        memory = f"{gpu['used_mib']:.0f}" if gpu else "–"
        print(f"| {name} | {seconds:.1f} | {seconds / base:.2f} | {util} | {memory} |")


if __name__ == "__main__":
    main()
