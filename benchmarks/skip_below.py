"""Does `--skip-below δ` save time without costing accuracy? FedEM and FedRC, δ = 0 against δ,
several seeds, on a reduced FedRC benchmark of real Fashion-MNIST; prints a Markdown table.

    PYTHONPATH=. python3 benchmarks/skip_below.py --delta 0.05 --seeds 0 1 2

Per configuration: seconds per round (training rounds, evaluation excluded), the global and local
accuracy at the round with the best train accuracy (the paper's selection), and the share of
(client, model) pairs whose ω was below δ at the last round (the pairs skipped from then on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from pipeline.config import PartitionConfig
from pipeline.run.files import ASSIGNMENTS, METRICS, read_assignments, read_metrics
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage


def run_once(data: Path, out: Path, algorithm: str, delta: float, seed: int, args) -> dict:
    config = make_config(
        data=str(data), out=str(out), algorithm=algorithm, clusters=3, rounds=args.rounds,
        local_epochs=args.local_epochs, batch_size=32, lr=0.1, eval_every=2, seed=seed,
        device="cpu", skip_below=delta,
    )  # fmt: skip
    train_stage(config)
    rows = read_metrics(out / METRICS)
    best = max((r for r in rows if "train_accuracy" in r), key=lambda r: r["train_accuracy"])
    plain = [r["seconds"] for r in rows if "train_accuracy" not in r]
    assignments = read_assignments(out / ASSIGNMENTS)
    last = assignments.filter(assignments.column("round").to_numpy() == rows[-1]["round"])
    part = last.filter(last.column("participating").to_numpy())
    omega = np.stack([part.column(f"omega_{k}").to_numpy() for k in range(3)], 1)
    return {
        "seconds": statistics.mean(plain),
        "global": best["global_accuracy"],
        "local": best["local_accuracy"],
        "below": float((omega < delta).mean()) if delta > 0 else 0.0,
    }


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.pstdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        partition_stage(
            PartitionConfig(
                dataset="fmnist", clients=args.clients, samples_per_client=args.samples,
                holdout_samples=1000, out=str(data),
            )
        )  # fmt: skip
        results: dict[str, list[dict]] = {}
        for seed in args.seeds:  # interleaved, so that a busy moment hits every setting
            for algorithm in ("fedem", "fedrc"):
                for delta in (0.0, args.delta):
                    out = Path(tmp) / f"{algorithm}-{delta}-{seed}"
                    result = run_once(data, out, algorithm, delta, seed, args)
                    results.setdefault(f"{algorithm} {delta}", []).append(result)
                    print(f"{algorithm} δ={delta} seed {seed}: {result}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(
        f"\n{args.clients} clients × {args.samples} samples, K = 3, {args.rounds} rounds × "
        f"{args.local_epochs} local epochs, seeds {args.seeds}\n"
    )
    print("| algorithm | δ | s / round | vs δ = 0 | global acc. | local acc. | ω < δ at the end |")
    print("|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        algorithm, delta = key.split()
        base = statistics.mean(r["seconds"] for r in results[f"{algorithm} 0.0"])
        seconds = statistics.mean(r["seconds"] for r in runs)
        print(
            f"| {algorithm} | {delta} | {seconds:.1f} | {seconds / base:.2f}× | "
            f"{spread([r['global'] for r in runs])} | {spread([r['local'] for r in runs])} | "
            f"{statistics.mean(r['below'] for r in runs):.0%} |"
        )


if __name__ == "__main__":
    main()
