"""The whole `fedrc train` command for one round, the same training samples held by few or many
clients: wall time and peak RSS of the child process, and the ratio to the first size.

Real Fashion-MNIST is partitioned (not timed) into 300 and 3,000 clients holding the same
54,000 training samples (200 and 20 samples each, a tenth of them the local test split), then
`fedrc train --algorithm fedrc --clusters 3 --rounds 1 --local-epochs 1` runs as a subprocess
per size, back to back. `--profile` runs each child under cProfile and splits its time into
the phases of a round (the profiler's overhead inflates Python-heavy phases).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/many_clients.py
    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/many_clients.py --profile
    PYTHONPATH=. python3 benchmarks/many_clients.py --sizes 30 300 --pool 6000
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (phase, function, caller or None): a phase's time is the function's cumulative time, only
# in calls from the caller where one is named; a function is (module file, name)
PHASES = [
    ("load shards + manifest", ("run/setup.py", "load_data"), None),
    ("build run (models, algorithm)", ("run/setup.py", "build_run"), None),
    ("E-step logits", ("engine/sequential.py", "logits"), ("run/clients.py", "jobs")),
    ("client steps (E-step, tasks)", ("run/clients.py", "client_jobs"), None),
    ("local training", ("engine/sequential.py", "train"), ("engine/sequential.py", "stream")),
    ("folding results", ("fold",), ("run/training.py", "fold_results")),
    ("aggregation", ("aggregate",), ("run/training.py", "train_round")),
    ("evaluation", ("run/training.py", "evaluation_checked"), None),
    ("log + checkpoint", ("run/log.py", "add"), None),
    ("log + checkpoint", ("run/checkpoints.py", "save"), None),
    ("log + checkpoint", ("run/checkpoints.py", "save_model"), None),
]


def matches(key: tuple[str, int, str], function: tuple[str, ...]) -> bool:
    """Whether a pstats key (file, line, name) is `function`: (name,) or (file suffix, name)."""
    file, _, name = key
    return name == function[-1] and (len(function) == 1 or file.endswith("/" + function[0]))


def fedrc(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedrc_cli", *args]


def partition(folder: Path, clients: int, pool: int, args: argparse.Namespace) -> None:
    argv = fedrc(
        "partition",
        *("--clients", str(clients), "--samples-per-client", str(pool // clients)),
        *("--out", str(folder), "--seed", "0"),
        *(("--data-root", args.data_root) if args.data_root else ()),
    )
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"partition into {clients} clients failed:\n{done.stderr[-3000:]}")


def train(data: Path, out: Path, profile: Path | None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one `fedrc train`
    child, reaped with `os.wait4` so that they are that child's own."""
    argv = fedrc(
        "train",
        *("--data", str(data), "--out", str(out), "--algorithm", "fedrc", "--clusters", "3"),
        *("--rounds", "1", "--local-epochs", "1", "--device", "cpu"),
    )
    if profile is not None:
        argv = [sys.executable, "-m", "cProfile", "-o", str(profile), *argv[1:]]
    with tempfile.TemporaryFile("w+") as stderr:
        tic = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - tic
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            stderr.seek(0)
            sys.exit(f"fedrc train on {data} failed:\n{stderr.read()[-3000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # Linux: KiB


def phases(profile: Path, total: float) -> dict[str, float]:
    """Cumulative seconds of each phase; the rest is start-up (imports, CLI, configuration)
    and whatever no phase names."""
    stats = pstats.Stats(str(profile))
    found: dict[str, float] = {}
    for name, function, caller in PHASES:
        seconds = 0.0
        for key, (_, _, _, cumulative, callers) in stats.stats.items():
            if not matches(key, function):
                continue
            if caller is None:
                seconds += cumulative
            else:
                seconds += sum(c[3] for k, c in callers.items() if matches(k, caller))
        found[name] = found.get(name, 0.0) + seconds
    found["the rest (start-up: imports, CLI)"] = max(stats.total_tt - sum(found.values()), 0.0)
    found["profiled total"] = stats.total_tt
    found["wall (with profiler)"] = total
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 3000])
    parser.add_argument("--pool", type=int, default=60_000, help="samples over all clients")
    parser.add_argument("--data-root", help="Fashion-MNIST files (default: the system copy)")
    parser.add_argument("--profile", action="store_true", help="cProfile each child")
    args = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS", "all")
    print(
        f"fedrc train --algorithm fedrc --clusters 3 --rounds 1 --local-epochs 1 --device cpu; "
        f"{args.pool} samples (train + test) over {args.sizes} clients; OMP_NUM_THREADS "
        f"{threads}; load average before: {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folders = {n: Path(tmp) / f"data-{n}" for n in args.sizes}
        for clients, folder in folders.items():
            partition(folder, clients, args.pool, args)
        rows = []
        for clients, folder in folders.items():
            profile = Path(tmp) / f"train-{clients}.prof" if args.profile else None
            seconds, cpu, rss = train(folder, Path(tmp) / f"run-{clients}", profile)
            split = phases(profile, seconds) if profile else None
            rows.append((clients, seconds, cpu, rss, split))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| clients | samples each | wall s | × first | CPU s | × first | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for clients, seconds, cpu, rss, _ in rows:
        print(
            f"| {clients:,} | {args.pool // clients} | {seconds:.1f} | {seconds / rows[0][1]:.2f} "
            f"| {cpu:.1f} | {cpu / rows[0][2]:.2f} | {rss:,.0f} |"
        )
    if args.profile:
        names = list(rows[0][4])
        sizes = " | ".join(f"{r[0]:,} clients" for r in rows)
        print(f"\n| phase (cProfile, cumulative s) | {sizes} |")
        print("|---" + "|---:" * len(rows) + "|")
        for name in names:
            print(f"| {name} | " + " | ".join(f"{r[4][name]:.1f}" for r in rows) + " |")


if __name__ == "__main__":
    main()
