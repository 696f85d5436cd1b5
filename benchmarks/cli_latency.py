"""How long the CLI takes to answer: `--help`, `--version`, `info` (the list, a component's
settings, a benchmark) and a refused option, each as a fresh process, timed over N runs (median
wall and CPU seconds) with whether it imported torch.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/cli_latency.py [--runs 7] [--before DIR]

`--before DIR` times another checkout too (e.g. `git worktree add ../fedrc-main main`), its
runs interleaved with this one's so that both see the same load, and adds the ratio. Each
command runs as `python -m fedrc_cli` with PYTHONPATH set to the checkout, in an empty folder
(no params.yaml); `info FOLDER` reads a small synthetic benchmark built first. `fedrc info`
imports each installed plugin to check that it loads (the example plugin imports torch), so the
list is also timed with the plugins' entry points hidden, as in a core install.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
FEDRC = ["-m", "fedrc_cli"]
NO_PLUGINS = [  # `fedrc ARGS` as if no plugin were installed
    "-c",
    "import importlib.metadata, sys; importlib.metadata.entry_points = lambda **_: (); "
    "from fedrc_cli.app import main; main()",
]
COMMANDS: dict[str, list[str]] = {  # label: python's arguments
    "fedrc --help": [*FEDRC, "--help"],
    "fedrc --version": [*FEDRC, "--version"],
    "fedrc train --help": [*FEDRC, "train", "--help"],
    "fedrc info FOLDER": [*FEDRC, "info", "{folder}"],
    "fedrc info (list, example plugin installed)": [*FEDRC, "info"],
    "fedrc info (list, no plugin)": [*NO_PLUGINS, "info"],
    "fedrc info fedrc (settings)": [*FEDRC, "info", "fedrc"],
    "fedrc partition --clients 1 (error)": [*FEDRC, "partition", "--clients", "1"],
}


def command_line(args: list[str], folder: Path, importtime: bool) -> list[str]:
    flags = ["-X", "importtime"] if importtime else []
    return [sys.executable, *flags, *(a.format(folder=folder) for a in args)]


def environment(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def run_once(checkout: Path, args: list[str], folder: Path, cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        command_line(args, folder, importtime=False),
        cwd=cwd, env=environment(checkout), capture_output=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def imports_torch(checkout: Path, args: list[str], folder: Path, cwd: Path) -> bool:
    done = subprocess.run(
        command_line(args, folder, importtime=True),
        cwd=cwd, env=environment(checkout), capture_output=True, text=True, check=False,
    )  # fmt: skip
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    return "torch" in names


def build_benchmark(folder: Path, cwd: Path) -> None:
    tiny = ["--dataset", "synthetic", "--clients", "8", "--samples-per-client", "20"]
    subprocess.run(
        [sys.executable, "-m", "fedrc_cli", "partition", *tiny, "--holdout-samples", "20",
         "--out", str(folder)],
        cwd=cwd, env=environment(HERE), capture_output=True, check=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="Runs per command and checkout.")
    parser.add_argument("--before", type=Path, help="Another checkout to compare with.")
    args = parser.parse_args()
    checkouts = {"this": HERE}
    if args.before is not None:
        checkouts = {"before": args.before.resolve(), "after": HERE}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp) / "empty"
        cwd.mkdir()
        folder = Path(tmp) / "benchmark"
        build_benchmark(folder, cwd)
        rows = []
        for label, argv in COMMANDS.items():
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
            for _ in range(args.runs):  # interleaved: both checkouts see the same load
                for name, checkout in checkouts.items():
                    times[name].append(run_once(checkout, argv, folder, cwd))
            for name, checkout in checkouts.items():
                wall = statistics.median(t[0] for t in times[name])
                cpu = statistics.median(t[1] for t in times[name])
                torch = imports_torch(checkout, argv, folder, cwd)
                rows.append((label, name, wall, cpu, torch))
    load = os.getloadavg()[0]
    print(f"median of {args.runs} runs; {os.cpu_count()} CPUs, load average {load:.1f}")
    print("| command | checkout | wall s | CPU s | torch imported | × before (wall / CPU) |")
    print("|---|---|---|---|---|---|")
    before = {label: (wall, cpu) for label, name, wall, cpu, _ in rows if name == "before"}
    for label, name, wall, cpu, torch in rows:
        ratio = ""
        if name == "after" and label in before:
            ratio = f"{wall / before[label][0]:.2f} / {cpu / before[label][1]:.2f}"
        yes = "yes" if torch else "no"
        print(f"| `{label}` | {name} | {wall:.2f} | {cpu:.2f} | {yes} | {ratio} |")


if __name__ == "__main__":
    main()
